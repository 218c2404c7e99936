"""Batch calls on the containers data people already hold: every answer is
checked against the same call on plain lists of ints."""

import sys

import numpy as np
import pytest

import radix_soa as rs
from radix_soa._input import batch as B
from radix_soa._input import run as R

pa = pytest.importorskip("pyarrow", reason="pyarrow is an optional dependency (the arrow extra)")

SEQS = [[1, 2, 3], [4], [5, 6], [1, 2], [9, 9, 9, 9], [1, 2, 3, 7], [4, 8]]
STORED = [[1, 2, 3], [4], [5, 6, 7], [9, 9]]


@pytest.fixture
def rc():
    rc = rs.RadixCache()
    rc.insert_batch(STORED)
    return rc


def answers(rc, batch):
    return rc.exists_batch(batch).tolist(), rc.match_prefix_batch(batch).tolist()


def expected(rc, seqs=SEQS):
    return answers(rc, [list(s) for s in seqs])


def test_expected_answers_are_not_trivial(rc):
    hits, lengths = expected(rc)
    assert hits == [True, True, False, False, False, False, False]
    assert lengths == [3, 1, 2, 2, 2, 3, 1]


# ------------------------------------------------------------------ polars

@pytest.mark.slow
def test_polars_series(rc):
    pl = pytest.importorskip("polars")
    for dtype in (pl.List(pl.Int64), pl.List(pl.Int32), pl.List(pl.UInt16)):
        s = pl.Series("tokens", SEQS, dtype=dtype)
        assert answers(rc, s) == expected(rc), dtype
        assert rs.pack(s) == rs.pack(SEQS)


def test_polars_chunked_series_and_one_column_frame(rc, monkeypatch):
    pl = pytest.importorskip("polars")
    s = pl.concat([pl.Series("t", SEQS[:3]), pl.Series("t", SEQS[3:])], rechunk=False)
    assert s.n_chunks() == 2
    assert len(B.as_batches(s)) == 1  # small chunks are joined
    monkeypatch.setattr(B, "JOIN_TOKENS", 0)
    assert len(B.as_batches(s)) == 2
    assert answers(rc, s) == expected(rc)
    assert answers(rc, pl.DataFrame({"tokens": SEQS})) == expected(rc)


def test_polars_frame_of_two_columns_is_refused(rc):
    pl = pytest.importorskip("polars")
    df = pl.DataFrame({"tokens": SEQS, "id": list(range(len(SEQS)))})
    with pytest.raises(ValueError, match="2 columns.*tokens.*id"):
        rc.exists_batch(df)
    before = len(rc)
    with pytest.raises(ValueError, match="2 columns"):
        rc.insert_batch(df)
    assert len(rc) == before


def test_polars_float_lists_and_null_rows_are_refused(rc):
    pl = pytest.importorskip("polars")
    with pytest.raises(TypeError, match="must be integers; got double"):
        rc.exists_batch(pl.Series([[1.5, 2.0]]))
    with pytest.raises(ValueError, match="1 null lists"):
        rc.exists_batch(pl.Series([[1, 2], None]))
    with pytest.raises(TypeError, match="List, LargeList or FixedSizeList"):
        rc.exists_batch(pl.Series([1, 2, 3]))


def test_polars_series_in_prefix_cache_batch_calls():
    pl = pytest.importorskip("polars")
    s = pl.Series(SEQS)
    values = pl.Series([[10 * t for t in q] for q in SEQS])
    a, b = rs.PrefixCache(), rs.PrefixCache()
    assert a.insert_batch(s, values=values)[0].tolist() == b.insert_batch(
        SEQS, values=[[10 * t for t in q] for q in SEQS])[0].tolist()
    assert a.to_text() == b.to_text()
    probe = [[1, 2, 3, 9], [4, 8], [7]]
    assert a.match_length_batch(pl.Series(probe)).tolist() == b.match_length_batch(
        probe).tolist() == [3, 2, 0]
    assert a.match_batch(pl.Series(probe)).tolist() == [3, 2, 0]
    assert a.match([4, 8]).values.tolist() == [40, 80]


# ------------------------------------------------------------------ pandas

def test_pandas_arrow_dtype_series(rc):
    pd = pytest.importorskip("pandas")
    for t in (pa.list_(pa.int64()), pa.large_list(pa.int32())):
        s = pd.Series(SEQS, dtype=pd.ArrowDtype(t))
        assert answers(rc, s) == expected(rc), t


def test_pandas_object_series_of_lists_and_arrays(rc):
    pd = pytest.importorskip("pandas")
    assert answers(rc, pd.Series(SEQS)) == expected(rc)
    arrays = pd.Series([np.array(s) for s in SEQS])
    assert answers(rc, arrays) == expected(rc)
    with pytest.raises(TypeError, match="sequence 1: .*element 0 is float"):
        rc.exists_batch(pd.Series([[1], [2.5]]))


def test_pandas_one_column_frame(rc):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"tokens": pd.Series(SEQS, dtype=pd.ArrowDtype(pa.list_(pa.int64())))})
    assert answers(rc, df) == expected(rc)


# ------------------------------------------------------------------ duckdb, nanoarrow

def test_duckdb_result(rc, tmp_path):
    duckdb = pytest.importorskip("duckdb")
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"tokens": pa.array(SEQS), "id": list(range(len(SEQS)))}), path)
    con = duckdb.connect()
    rel = con.sql(f"select tokens from '{path}' order by id")
    assert answers(rc, rel) == expected(rc)
    with pytest.raises(ValueError, match="2 columns"):
        rc.exists_batch(con.sql(f"select tokens, id from '{path}'"))


def test_nanoarrow_array_and_stream(rc):
    na = pytest.importorskip("nanoarrow")
    arr = pa.array(SEQS)
    assert answers(rc, na.c_array(arr)) == expected(rc)
    assert rc.exists_batch(na.c_array_stream(arr)).tolist() == expected(rc)[0]


class CapsuleOnly:
    """Arrow data known only by the PyCapsule protocol (no library type)."""

    def __init__(self, arr):
        self._arr = arr

    def __arrow_c_array__(self, requested_schema=None):
        return self._arr.__arrow_c_array__(requested_schema)


class StreamOnly(CapsuleOnly):
    def __arrow_c_stream__(self, requested_schema=None):
        return self._arr.__arrow_c_stream__(requested_schema)

    __arrow_c_array__ = None


def test_any_pycapsule_object(rc, monkeypatch):
    monkeypatch.setattr(B, "JOIN_TOKENS", 0)  # one batch per chunk
    assert answers(rc, CapsuleOnly(pa.array(SEQS))) == expected(rc)
    chunked = pa.chunked_array([pa.array(SEQS[:2]), pa.array(SEQS[2:])])
    assert answers(rc, StreamOnly(chunked)) == expected(rc)
    assert len(B.as_batches(StreamOnly(chunked))) == 2


def test_without_pyarrow_arrow_data_names_the_extra(rc, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError
    before = len(rc)
    with pytest.raises(ImportError, match=r"CapsuleOnly is Arrow data.*radix-soa\[arrow\]"):
        rc.insert_batch(CapsuleOnly(pa.array([[42, 43]])))
    assert len(rc) == before
    with pytest.raises(ImportError, match="needs pyarrow"):
        rs.pack(StreamOnly(pa.chunked_array([pa.array(SEQS)])))
    # what needs no Arrow still works
    assert answers(rc, np.array([np.array(s) for s in SEQS], dtype=object)) == expected(rc)


def test_small_chunks_are_joined_and_large_ones_stay_views(monkeypatch):
    monkeypatch.setattr(B, "JOIN_TOKENS", 10)
    chunks = [pa.array([[i, i]]) for i in range(7)] + [pa.array([list(range(12))])] \
        + [pa.array([[9]])] * 3
    col = pa.chunked_array(chunks)
    parts = B.as_batches(col)
    # 2 tokens a chunk: five of them reach 10; then two left over before the
    # large chunk, which stays a view of its own buffer; the last three joined
    assert [len(p) for p in parts] == [5, 2, 1, 3]
    large = chunks[7].values
    assert parts[2].flat.ctypes.data == large.buffers()[1].address + 8 * large.offset
    assert rs.pack(col) == rs.pack(col.to_pylist())
    assert [b.flat.tolist() for b in parts] == [rs.pack(c).flat.tolist() for c in (
        pa.chunked_array(chunks[:5]).to_pylist(), chunks[5].to_pylist() + chunks[6].to_pylist(),
        chunks[7].to_pylist(), [[9], [9], [9]])]


# ------------------------------------------------------------------ Hugging Face datasets

@pytest.fixture
def dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    import pyarrow.parquet as pq

    seqs = [SEQS[i % len(SEQS)] + [i % 3] * (i % 2) for i in range(60)]
    path = tmp_path / "tokens.parquet"
    pq.write_table(pa.table({"tokens": pa.array(seqs), "id": list(range(len(seqs)))}), path,
                   row_group_size=16)
    ds = datasets.Dataset.from_parquet(str(path), cache_dir=str(tmp_path / "cache"))
    return ds, seqs


def test_datasets_column_is_read_from_its_arrow_table(rc, dataset, monkeypatch):
    monkeypatch.setattr(B, "JOIN_TOKENS", 0)  # one zero-copy batch per chunk
    ds, seqs = dataset
    col = ds["tokens"]
    assert answers(rc, col) == expected(rc, seqs)
    table_column = ds.data.column("tokens")
    assert table_column.num_chunks > 1
    parts = B.as_batches(col)
    assert len(parts) == table_column.num_chunks
    # zero-copy: the batch reads the dataset's own (memory-mapped) buffer
    first_values = table_column.chunk(0).values
    assert parts[0].flat.ctypes.data == first_values.buffers()[1].address + 8 * first_values.offset


def test_datasets_after_select_shuffle_filter(rc, dataset):
    ds, seqs = dataset
    picked = ds.select([5, 0, 33, 7])
    assert answers(rc, picked["tokens"]) == expected(rc, [seqs[i] for i in (5, 0, 33, 7)])
    shuffled = ds.shuffle(seed=3)
    order = shuffled["id"]
    assert answers(rc, shuffled["tokens"]) == expected(rc, [seqs[i] for i in order])
    odd = ds.filter(lambda row: row["id"] % 2 == 1)
    assert answers(rc, odd["tokens"]) == expected(rc, seqs[1::2])


def test_datasets_numpy_format(rc, dataset):
    ds, seqs = dataset
    npds = ds.with_format("numpy")
    assert answers(rc, npds["tokens"]) == expected(rc, seqs)
    objects = npds[:]["tokens"]  # a 1-D object array of int64 arrays
    assert isinstance(objects, np.ndarray) and objects.dtype == object and objects.ndim == 1
    assert answers(rc, objects) == expected(rc, seqs)


# ------------------------------------------------------------------ object arrays

def object_array(items):
    out = np.empty(len(items), object)
    out[:] = items
    return out


@pytest.fixture(params=["through pyarrow", "without pyarrow"])
def either_path(request, monkeypatch):
    """Object arrays are read by pyarrow.array when it is there, else by NumPy."""
    if request.param == "without pyarrow":
        monkeypatch.setitem(sys.modules, "pyarrow", None)


def test_object_arrays_of_sequences(rc, either_path):
    for make in (np.array, list, tuple, lambda s: np.array(s, np.int32)):
        arr = object_array([make(s) for s in SEQS])
        assert answers(rc, arr) == expected(rc)
        assert rs.pack(arr) == rs.pack(SEQS)
    mixed = object_array([np.array(s, np.int32 if i % 2 else np.int64) for i, s in enumerate(SEQS)])
    assert answers(rc, mixed) == expected(rc)
    for dtype in (np.int32, np.uint16):  # converted as the per-sequence path converts
        packed = rs.pack(object_array([np.array(s, dtype) for s in SEQS]))
        assert packed.flat.dtype == np.int64 and packed == rs.pack(SEQS)
    assert rs.pack(object_array([])).offsets.tolist() == [0]


def test_object_arrays_with_bad_elements_name_the_sequence(rc, either_path):
    with pytest.raises(TypeError, match="sequence 1: .*dtype float64"):
        rs.pack(object_array([np.array([1]), np.array([2.0])]))
    with pytest.raises(TypeError, match="sequence 0: .*dtype bool"):
        rs.pack(object_array([np.array([True]), np.array([2])]))
    with pytest.raises(ValueError, match="sequence 1: a sequence must be 1-D"):
        rs.pack(object_array([np.array([1]), np.ones((2, 2), np.int64)]))
    with pytest.raises(OverflowError, match="does not fit in a signed 64-bit"):
        rs.pack(object_array([np.array([2**63], np.uint64), np.array([1], np.int64)]))
    with pytest.raises(OverflowError, match="does not fit in a signed 64-bit"):
        rs.pack(object_array([np.array([2**63], np.uint64), np.array([1], np.uint64)]))
    big = np.array([2**63 - 1], np.uint64)
    assert rs.pack(object_array([big, np.array([1], np.int64)])).flat.tolist() == [2**63 - 1, 1]
    with pytest.raises(ValueError, match="1-D object array of sequences; got a 1-D int64"):
        rs.pack(np.array([1, 2, 3]))


def test_object_arrays_of_int64_arrays(rc, either_path):
    """Views into one buffer, strided views and empty arrays, as
    ``datasets``' numpy format and pyarrow's ``to_numpy`` hand them over."""
    base = np.arange(40, dtype=np.int64)
    views = [base[0:3], base[3:4], base[10:20:3], base[4:4], base[5:9]]
    packed = rs.pack(object_array(views))
    assert packed == rs.pack([v.tolist() for v in views])
    assert packed.flat.dtype == np.int64 and not np.shares_memory(packed.flat, base)
    arr = object_array([np.array(s, np.int64) for s in SEQS])
    assert answers(rc, arr) == expected(rc)


@pytest.mark.parametrize("last, error, match", [
    (np.array([2.5]), TypeError, "sequence 3: .*dtype float64"),
    (np.array([True]), TypeError, "sequence 3: .*dtype bool"),
    (np.ones((2, 2), np.int64), ValueError, "sequence 3: a sequence must be 1-D"),
    (np.array(7, np.int64), ValueError, "sequence 3: a sequence must be 1-D"),
    ([1, 2.0], TypeError, "sequence 3: tokens must be integers"),
    (np.array([2**63], np.uint64), OverflowError, "does not fit in a signed 64-bit"),
])
def test_one_bad_element_among_int64_arrays_is_named(rc, either_path, last, error, match):
    """The int64-array fast path checks every element: a last element of
    another kind is refused as the per-sequence path refuses it, and the
    tree is unchanged."""
    arr = object_array([np.array([1, 2], np.int64)] * 3 + [last])
    with pytest.raises(error, match=match):
        rs.pack(arr)
    with pytest.raises(error, match=match):
        rc.insert_batch(arr)
    assert sorted(s.tolist() for s in rc) == sorted(STORED)


@pytest.mark.parametrize("last", [np.array([5], np.int32), np.array([5], ">i8"),
                                  np.array([5], np.uint64)])
def test_other_integer_arrays_among_int64_arrays_are_converted(either_path, last):
    arr = object_array([np.array([1, 2], np.int64)] * 3 + [last])
    assert rs.pack(arr) == rs.pack([[1, 2]] * 3 + [[5]])


def test_int64_arrays_are_converted_with_the_type_given(monkeypatch):
    """All int64 arrays: one pyarrow conversion told the type (no
    inference); mixed dtypes are inferred (the inferred type is their
    check); lists of ints never go through Arrow (packed in C, faster)."""
    seen = []
    real = pa.array

    def spy(obj, *args, **kwargs):
        seen.append(kwargs.get("type"))
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(pa, "array", spy)
    rs.pack(object_array([np.arange(3), np.arange(2)]))
    assert rs.pack(object_array([[1, 2], [3]])) == rs.pack([[1, 2], [3]])
    rs.pack(object_array([np.arange(3), np.arange(2, dtype=np.int32)]))
    assert seen == [pa.large_list(pa.int64()), None]


# ------------------------------------------------------------------ threads per chunk

def test_use_parallel_default_needs_every_batch_large(monkeypatch):
    monkeypatch.setattr(R, "_threads", lambda: 2)
    large = B.Batch(np.zeros(R.PARALLEL_MIN_TOKENS, np.int64), np.array([0, R.PARALLEL_MIN_TOKENS]))
    small = B.Batch(np.zeros(10, np.int64), np.array([0, 10]))
    assert R.use_parallel(None, [large, large])
    assert not R.use_parallel(None, [large] + [small] * 1000)  # the total alone is large
    assert not R.use_parallel(None, [])
    monkeypatch.setattr(R, "_threads", lambda: 1)
    assert not R.use_parallel(None, [large])
    assert R.use_parallel(True, [small])


def test_run_batches_decides_per_chunk(monkeypatch):
    large = B.Batch(np.zeros(R.PARALLEL_MIN_TOKENS, np.int64), np.array([0, R.PARALLEL_MIN_TOKENS]))
    small = B.Batch(np.zeros(10, np.int64), np.array([0, 5, 10]))
    calls = []

    def serial(b, out):
        calls.append("serial")
        out[:] = 1

    def threaded(b, out):
        calls.append("threaded")
        out[:] = 2

    for threads, parallel, want in (
            (2, None, ["serial", "threaded", "serial"]),
            (1, None, ["serial"] * 3),
            (2, True, ["threaded"] * 3),
            (2, False, ["serial"] * 3)):
        monkeypatch.setattr(R, "_threads", lambda: threads)
        calls.clear()
        out = R.run_batches([small, large, small], np.int64, parallel, serial, threaded)
        assert calls == want
        assert out.tolist() == [1 if c == "serial" else 2 for c, n in zip(want, (2, 1, 2))
                                for _ in range(n)]


def test_many_chunks_answer_as_one_batch_every_way(rc):
    rng = np.random.default_rng(5)
    seqs = [rng.integers(1, 10, rng.integers(1, 6)).tolist() for _ in range(400)]
    arr = pa.array(seqs)
    chunked = pa.chunked_array([arr.slice(i, 7) for i in range(0, len(seqs), 7)])
    want = expected(rc, seqs)
    for parallel in (None, False, True):
        assert rc.exists_batch(chunked, parallel=parallel).tolist() == want[0]
        assert rc.match_prefix_batch(chunked, parallel=parallel).tolist() == want[1]
