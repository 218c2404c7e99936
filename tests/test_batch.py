import numpy as np
import pytest
from hypothesis import given, strategies as st

import radix_soa as rs
from radix_soa import Batch, RadixCache, pack
from radix_soa._input import batch as _batch
from radix_soa._input import run as _run
from radix_soa._tree import storage as _storage
from radix_soa._kernels.layout import EMPTY

from naive import NaiveSequenceSet

pa = pytest.importorskip("pyarrow", reason="pyarrow is an optional dependency")


def snapshot(rc):
    flat, off = rc.to_csr()
    return (len(rc), rc.num_nodes, rc.num_tokens, flat.tolist(), off.tolist())


# ---------------------------------------------------------------- packing

def test_pack_lists_tuples_arrays_and_ranges():
    b = pack([[1, 2], (3,), np.array([4, 5, 6], np.int32), range(7, 9), []])
    assert b.flat.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert b.offsets.tolist() == [0, 2, 3, 6, 8, 8]
    assert [s.tolist() for s in b] == [[1, 2], [3], [4, 5, 6], [7, 8], []]
    assert b.lengths.tolist() == [2, 1, 3, 2, 0]
    assert pack(b) is b


def test_pack_2d_array_rows():
    b = pack(np.arange(6).reshape(2, 3))
    assert [s.tolist() for s in b] == [[0, 1, 2], [3, 4, 5]]


def test_pack_empty_batch():
    b = pack([])
    assert len(b) == 0 and b.offsets.tolist() == [0]


@pytest.mark.parametrize("seqs, exc, where", [
    ([[1], [2, 2.5]], TypeError, "sequence 1"),
    ([[1], ["a"]], TypeError, "sequence 1"),
    ([[1], [None]], TypeError, "sequence 1"),
    ([[[1, 2]]], TypeError, "sequence 0"),
    ([[1], 5], TypeError, "sequence 1"),
    ([[1], "ab"], TypeError, "sequence 1"),
    ([[1], [2**63]], OverflowError, "sequence 1"),
    ([np.array([1.0])], TypeError, "sequence 0"),
    ([np.zeros((2, 2), np.int64)], ValueError, "sequence 0"),
])
def test_pack_errors_name_the_sequence(seqs, exc, where):
    with pytest.raises(exc, match=where):
        pack(seqs)


@pytest.mark.parametrize("bad", [5, "abc", np.arange(3)])
def test_pack_rejects_non_batches(bad):
    with pytest.raises((TypeError, ValueError)):
        pack(bad)


@pytest.mark.parametrize("flat, offsets, exc", [
    (np.array([1, 2, 3]), np.array([1, 3]), ValueError),       # does not start at 0
    (np.array([1, 2, 3]), np.array([0, 2]), ValueError),       # does not end at len
    (np.array([1, 2, 3]), np.array([0, 3, 2, 3]), ValueError),  # decreasing
    (np.array([1, 2, 3]), np.array([], np.int64), ValueError),
    (np.array([1, 2, 3]), np.array([[0, 3]]), ValueError),
    (np.array([1, 2, 3]), np.array([0.0, 3.0]), TypeError),
    (np.array([1.0, 2.0]), np.array([0, 2]), TypeError),
    (np.array([[1, 2]]), np.array([0, 2]), ValueError),
    ([1, 2], np.array([0, 2]), TypeError),
    (np.array([2**63], np.uint64), np.array([0, 1]), OverflowError),
])
def test_malformed_csr_is_rejected(flat, offsets, exc):
    with pytest.raises(exc):
        Batch(flat, offsets)
    rc = RadixCache()
    rc.insert([1, 2, 3])
    before = snapshot(rc)
    if isinstance(flat, np.ndarray) and isinstance(offsets, np.ndarray):
        with pytest.raises(exc):
            rc.insert_batch((flat, offsets))
        with pytest.raises(exc):
            rc.exists_batch((flat, offsets))
    assert snapshot(rc) == before


def test_csr_pair_and_batch_are_accepted_as_is():
    rc = RadixCache()
    flat = np.array([1, 2, 3, 1, 2, 4], np.int64)
    off = np.array([0, 3, 6], np.int64)
    assert rc.insert_batch((flat, off)).tolist() == [True, True]
    assert rc.exists_batch((flat, off)).tolist() == [True, True]
    b = Batch(flat, off)
    assert b.flat is flat or np.shares_memory(b.flat, flat)
    assert rc.match_prefix_batch(b).tolist() == [3, 3]


# ---------------------------------------------------------------- semantics

def test_duplicates_and_prefixes_within_one_batch():
    rc = RadixCache()
    new = rc.insert_batch([[1, 2, 3], [1, 2], [1, 2, 3], [1], [1, 2, 3, 4], [1, 2]])
    assert new.tolist() == [True, True, False, True, True, False]
    assert len(rc) == 4
    assert rc.exists_batch([[1], [1, 2], [1, 2, 3], [1, 2, 3, 4], [2]]).tolist() == [
        True, True, True, True, False]
    rc.check_invariants()


def test_empty_sequence_in_queries_is_absent():
    rc = RadixCache()
    rc.insert([1])
    assert rc.exists_batch([[], [1]]).tolist() == [False, True]
    assert rc.match_prefix_batch([[], [1]]).tolist() == [0, 1]


@pytest.mark.parametrize("bad, exc", [
    ([[1, 2], [3], []], ValueError),
    ([[1, 2], [3], [4.5]], TypeError),
    ([[1, 2], [3], [2**63]], OverflowError),
])
def test_insert_batch_is_all_or_nothing(bad, exc):
    rc = RadixCache()
    rc.insert([9, 9])
    before = snapshot(rc)
    with pytest.raises(exc):
        rc.insert_batch(bad)
    assert snapshot(rc) == before
    rc.check_invariants()


@pytest.mark.slow
def test_insert_batch_overflow_of_narrow_dtype_changes_nothing():
    rc = RadixCache(dtype=np.int32)
    rc.insert([1])
    before = snapshot(rc)
    with pytest.raises(OverflowError):
        rc.insert_batch([[1, 2], [2**31]])
    assert snapshot(rc) == before


batches = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=10), max_size=40)


@pytest.mark.slow
@given(batches, batches, st.sampled_from([np.int64, np.int32]))
def test_batch_calls_equal_single_calls(first, queries, dtype):
    one, many = RadixCache(dtype=dtype), RadixCache(dtype=dtype)
    new_single = [one.insert(s) for s in first]
    assert many.insert_batch(first).tolist() == new_single
    many.check_invariants()
    assert snapshot(many) == snapshot(one)
    qs = queries + first
    expect_exists = [one.exists(s) for s in qs]
    expect_match = [one.match_prefix(s) for s in qs]
    for par in (False, True):
        assert many.exists_batch(qs, parallel=par).tolist() == expect_exists
        assert many.match_prefix_batch(qs, parallel=par).tolist() == expect_match


long_batches = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=8), min_size=17,
                        max_size=120)


@pytest.mark.slow
@given(long_batches, st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=8), max_size=20),
       st.integers(0, 3))
def test_grouped_batch_insert_equals_single_inserts_node_for_node(seqs, before, drop):
    """insert_batch descends GROUP sequences before inserting any of them:
    over a 3-token alphabet most sequences of a group split or extend what
    an earlier one of the group just made, and the result (flags, node ids,
    free-list reuse after removes) must be that of one insert at a time."""
    one, many = RadixCache(), RadixCache()
    for rc in (one, many):
        for s in before:
            rc.insert(s)
        for s in list(dict.fromkeys(map(tuple, before)))[:drop]:  # each stored one once
            rc.remove(list(s))
    new_single = [one.insert(s) for s in seqs]
    assert many.insert_batch(seqs).tolist() == new_single
    many.check_invariants()
    assert snapshot(many) == snapshot(one)
    assert many.ids(seqs).tolist() == one.ids(seqs).tolist()


@given(batches)
def test_batch_results_match_the_naive_model(seqs):
    rc, model = RadixCache(), NaiveSequenceSet()
    rc.insert_batch(seqs) if seqs else None
    for s in seqs:
        model.insert(s)
    probe = seqs + [s[:-1] for s in seqs if len(s) > 1] + [[5]]
    assert rc.exists_batch(probe).tolist() == [model.exists(s) for s in probe]
    assert rc.match_prefix_batch(probe).tolist() == [model.match_prefix(s) for s in probe]


def test_growth_during_a_batch_keeps_the_tree_exact():
    seqs = rs.workloads.shared_prefix(n_sequences=3000, n_prompts=7, prompt_len=300, seed=5)
    one = RadixCache()
    for s in seqs:
        one.insert(s)
    many = RadixCache()
    assert many.insert_batch(seqs).all()
    many.check_invariants()
    assert snapshot(many) == snapshot(one)
    assert_little_slack(many)


def assert_little_slack(cache):
    """After a batch that grew the arrays, none holds more than a quarter
    beyond what it uses (above the starting sizes)."""
    for name, usage in cache._s.array_usage().items():
        if name in ("table", "meta", "term"):  # the table's size is its load limit's
            continue
        floor = 1 << 16 if name in ("tokens", "values") else 1 << 13  # bytes of the start sizes
        assert usage["allocated_bytes"] <= max(floor, 1.25 * usage["used_bytes"] + 8), name


@pytest.mark.slow
def test_the_trim_after_a_batch_copies_nothing(monkeypatch):
    # the trimmed arrays are views of the ones the batch grew into: a copy
    # would write the whole tree again (most of a large build's time)
    made = []
    real = _storage.allocate

    def recording(n, dtype, fill=0):
        made.append(real(n, dtype, fill))
        return made[-1]

    monkeypatch.setattr(_storage, "allocate", recording)
    seqs = rs.workloads.shared_prefix(n_sequences=3000, n_prompts=7, prompt_len=300, seed=5)
    rc = RadixCache()
    rc.insert_batch(seqs)
    assert_little_slack(rc)
    tree = rc._s.tree
    grown = [a for a in made if np.shares_memory(a, tree.tokens)]
    assert len(grown) == 1 and grown[0].shape[0] > tree.tokens.shape[0]  # cut, not copied
    assert any(np.shares_memory(a, tree.start) for a in made)
    longer = [np.append(s, 7) for s in seqs]
    rc.insert_batch(longer)  # growing again from the views
    assert rc.exists_batch(longer).all() and rc.exists_batch(seqs).all()
    rc.check_invariants()


@pytest.mark.parametrize("kind", ["radix", "prefix"])
def test_a_large_batch_rebuilds_the_child_table_a_few_times_not_per_doubling(kind, monkeypatch):
    # the nodes added per sequence so far predict the rest (x8 at most per
    # growth): doubling the nodes per growth rebuilt the table 7 times here
    tables = []
    real = _storage.allocate

    def recording(n, dtype, fill=0):
        if fill == EMPTY:  # only the child table is filled with EMPTY
            tables.append(n)
        return real(n, dtype, fill)

    monkeypatch.setattr(_storage, "allocate", recording)
    rng = np.random.default_rng(3)
    seqs = [rng.integers(0, 1000, size=int(k)) for k in rng.integers(3, 12, size=60_000)]
    cache = RadixCache() if kind == "radix" else rs.PrefixCache()
    cache.insert_batch(seqs) if kind == "radix" else cache.insert_batch(seqs, values=seqs)
    assert cache.num_nodes > 50_000
    assert len(tables) <= 5, tables
    cache.check_invariants()


@pytest.mark.parametrize("kind", ["radix", "prefix"])
def test_a_batch_build_leaves_at_most_a_quarter_of_slack(kind):
    seqs = rs.workloads.generate("multi_turn", n=120)  # turns share their history: hard to predict
    if kind == "radix":
        cache = RadixCache()
        cache.insert_batch(seqs)
    else:
        cache = rs.PrefixCache()
        cache.insert_batch(seqs, values=seqs)
    rep = cache.memory_report()
    assert rep["tokens_stored"] > 100_000
    assert_little_slack(cache)
    cache.check_invariants()


@pytest.mark.slow
def test_a_million_short_sequences():
    rng = np.random.default_rng(0)
    n = 1_000_000
    lengths = rng.integers(1, 4, size=n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = rng.integers(0, 40, size=int(offsets[-1]))
    rc = RadixCache()
    new = rc.insert_batch((flat, offsets))
    # distinct sequences, counted independently: encode each in base 41
    key = np.zeros(n, np.int64)
    for j in range(3):
        has = lengths > j
        key[has] = key[has] * 41 + flat[offsets[:-1][has] + j] + 1
    assert len(rc) == len(np.unique(key)) == int(new.sum())
    assert rc.exists_batch((flat, offsets)).all()
    assert (rc.match_prefix_batch((flat, offsets)) == lengths).all()
    rc.check_invariants()


# ---------------------------------------------------------------- arrow

def arrow_cases():
    data = [[1, 2, 3], [1, 2], [7], [1, 2, 3, 4]]
    yield "list", pa.array(data, type=pa.list_(pa.int64())), data
    yield "large_list", pa.array(data, type=pa.large_list(pa.int64())), data
    yield "int32_values", pa.array(data, type=pa.list_(pa.int32())), data
    yield "sliced", pa.array(data, type=pa.list_(pa.int64())).slice(1, 2), data[1:3]
    yield "chunked", pa.chunked_array([data[:1], data[1:]], type=pa.list_(pa.int64())), data
    yield "fixed_size", pa.array([[1, 2], [3, 4]], type=pa.list_(pa.int64(), 2)), [[1, 2], [3, 4]]


@pytest.mark.slow
@pytest.mark.parametrize("name, arr, data", list(arrow_cases()), ids=[c[0] for c in arrow_cases()])
def test_arrow_inputs_equal_list_inputs(name, arr, data):
    a, b = RadixCache(), RadixCache()
    assert a.insert_batch(arr).tolist() == b.insert_batch(data).tolist()
    assert snapshot(a) == snapshot(b)
    probe = [d + [0] for d in data] + data
    expect = b.match_prefix_batch(probe)
    parr = pa.array(probe, type=pa.list_(pa.int64()))
    assert a.match_prefix_batch(parr).tolist() == expect.tolist()
    assert a.exists_batch(arr).all()


def test_arrow_values_are_read_without_a_copy():
    arr = pa.array([[1, 2, 3], [4, 5]], type=pa.list_(pa.int32()))
    (b,) = _batch.as_batches(arr)
    values = np.frombuffer(arr.values.buffers()[1], dtype=np.int32)
    assert b.flat.dtype == np.int32 and np.shares_memory(b.flat, values)
    sliced = arr.slice(1, 1)
    (bs,) = _batch.as_batches(sliced)
    assert bs.flat.tolist() == [4, 5] and np.shares_memory(bs.flat, values)


@pytest.mark.parametrize("arr, exc", [
    (pa.array([[1, 2], None], type=pa.list_(pa.int64())), ValueError),
    (pa.array([[1, None]], type=pa.list_(pa.int64())), ValueError),
    (pa.array([[1.5]], type=pa.list_(pa.float64())), TypeError),
    (pa.array([1, 2]), TypeError),
])
def test_bad_arrow_input(arr, exc):
    rc = RadixCache()
    rc.insert([1])
    before = snapshot(rc)
    with pytest.raises(exc):
        rc.insert_batch(arr)
    with pytest.raises(exc):
        rc.exists_batch(arr)
    assert snapshot(rc) == before


def test_chunked_insert_is_all_or_nothing():
    arr = pa.chunked_array([[[1, 2]], [[3], []]], type=pa.list_(pa.int64()))
    rc = RadixCache()
    with pytest.raises(ValueError):
        rc.insert_batch(arr)
    assert len(rc) == 0 and rc.num_nodes == 0


def test_parallel_default_is_serial_for_small_batches():
    small = [pack([[1, 2]])]
    assert _run.use_parallel(None, small) is False
    assert _run.use_parallel(True, small) is True


def test_batch_slices_share_the_buffer():
    b = pack([[1], [2, 3], [4, 5, 6], [7]])
    part = b[1:3]
    assert [s.tolist() for s in part] == [[2, 3], [4, 5, 6]]
    assert np.shares_memory(part.flat, b.flat)
    assert len(b[3:1]) == 0 and len(b[-1:]) == 1
    with pytest.raises(ValueError):
        b[::2]


def test_traces_are_batches_unless_they_mix_namespaces():
    from radix_soa.studies.traces import Trace

    one = Trace.from_sequences([np.array([1, 2]), np.array([1, 3])], name="t")
    rc = RadixCache()
    assert rc.insert_batch(one).tolist() == [True, True]
    two = Trace.from_sequences([np.array([1, 2]), np.array([1, 3])], name="t",
                               namespace=np.array([0, 1]))
    with pytest.raises(ValueError, match="namespaces"):
        rc.exists_batch(two)


def test_progress_reports_cover_every_token_and_change_no_answer(monkeypatch):
    monkeypatch.setattr(_run, "PROGRESS_STEP", 50)  # many slices on a small batch
    seqs = rs.workloads.generate("multi_turn", n=10)
    plain = RadixCache()
    want_new = plain.insert_batch(seqs)
    rc = RadixCache()
    seen = []
    new = rc.insert_batch(seqs, progress=lambda done, total: seen.append((done, total)))
    total = sum(len(s) for s in seqs)
    assert len(seen) > 10 and seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    np.testing.assert_array_equal(new, want_new)
    assert snapshot(rc) == snapshot(plain)
    probe = seqs + [s[:-1] for s in seqs]
    for method in ("exists_batch", "match_prefix_batch"):
        seen.clear()
        got = getattr(rc, method)(probe, progress=lambda d, t: seen.append(d))
        np.testing.assert_array_equal(got, getattr(plain, method)(probe))
        assert seen[-1] == sum(len(s) for s in probe)


def test_progress_true_draws_a_tqdm_bar(capsys):
    pytest.importorskip("tqdm")
    rc = RadixCache()
    rc.insert_batch([[1, 2, 3]] * 5, progress=True)
    assert "tok" in capsys.readouterr().err
    with pytest.raises(TypeError, match="progress"):
        rc.exists_batch([[1]], progress="yes")
    assert rc.exists_batch([[1, 2, 3]]).tolist() == [True]
