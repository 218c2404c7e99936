"""A chunked Arrow column read in place (radix_soa._input.chunked and the
chunk kernels): every answer checked against the pure-Python reference on
plain lists, the chunks' buffers read where they lie, all-or-nothing kept."""

import numpy as np
import pytest

import radix_soa as rs
from radix_soa._input import batch as B
from radix_soa._input.chunked import Chunks

from naive import NaiveSequenceSet

pa = pytest.importorskip("pyarrow", reason="pyarrow is an optional dependency (the arrow extra)")


def column(seqs, value_type, large):
    """``seqs`` as one List/LargeList array of ``value_type``."""
    lengths = np.array([len(s) for s in seqs], np.int64)
    offsets = np.zeros(len(seqs) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.array([t for s in seqs for t in s], np.int64)
    kind = pa.LargeListArray if large else pa.ListArray
    return kind.from_arrays(pa.array(offsets.astype(np.int64 if large else np.int32)),
                            pa.array(flat, value_type))


def mixed_chunks(seqs, value_type, large):
    """Chunks of every kind: slices of one array (nonzero offsets, a shared
    buffer), an empty one, and chunks built on their own."""
    arr = column(seqs, value_type, large)
    n = len(seqs)
    a, b = n // 5, n // 2
    parts = [arr.slice(0, 3), arr.slice(3, 0), arr.slice(3, a - 3),
             column(seqs[a:b], value_type, large), arr.slice(b, n - b)]
    return pa.chunked_array(parts, type=arr.type)


def stored_set(rc):
    return sorted(tuple(x.tolist()) for x in rc)


def sequences(n, seed, vocab=4):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(k)).tolist() for k in rng.integers(1, 12, n)]


@pytest.mark.parametrize("value_type", ["int64", "int32"])
@pytest.mark.parametrize("large", [False, True])
def test_chunk_table_answers_as_the_reference(value_type, large):
    seqs = sequences(600, 1)
    stored = sequences(300, 2) + seqs[:100]
    col = mixed_chunks(seqs, getattr(pa, value_type)(), large)
    (table,) = B.as_batches(col, chunks=True)
    assert isinstance(table, Chunks) and len(table) == len(seqs)
    ref = NaiveSequenceSet()
    for s in stored:
        ref.insert(s)
    rc = rs.RadixCache()
    rc.insert_batch(pa.chunked_array([column(stored[:150], pa.int64(), False),
                                      column(stored[150:], pa.int64(), False)]))
    want_exists = [ref.exists(s) for s in seqs]
    want_match = [ref.match_prefix(s) for s in seqs]
    assert 0 < sum(want_exists) < len(seqs)  # hits and misses both
    for parallel in (False, True, None):
        assert rc.exists_batch(col, parallel=parallel).tolist() == want_exists
        assert rc.match_length_batch(col, parallel=parallel).tolist() == want_match
    seen = []
    assert rc.exists_batch(col, progress=lambda done, total: seen.append((done, total))
                           ).tolist() == want_exists
    assert seen[-1] == (sum(map(len, seqs)),) * 2
    new = rc.insert_batch(col)
    assert new.tolist() == [ref.insert(s) for s in seqs]
    assert stored_set(rc) == ref.sorted()
    rc.check_invariants()


def test_the_chunks_are_read_in_place():
    seqs = sequences(50, 3)
    parts = [column(seqs[:20], pa.int64(), False), column(seqs[20:], pa.int64(), False)]
    (table,) = B.as_batches(pa.chunked_array(parts), chunks=True)
    for addr, part in zip(table.values_addr, parts):
        values = part.values
        assert addr == values.buffers()[1].address + 8 * values.offset
    # without chunk kernels the small chunks are still joined
    assert [len(b) for b in B.as_batches(pa.chunked_array(parts))] == [50]


def test_insert_grows_the_tree_midway_through_a_chunk():
    seqs = [[i, j, k] for i in range(40) for j in range(40) for k in range(3)]
    col = pa.chunked_array([column(seqs[i:i + 700], pa.int64(), False)
                            for i in range(0, len(seqs), 700)])
    rc = rs.RadixCache()
    assert rc.insert_batch(col).all()
    assert len(rc) == len(seqs) and rc.exists_batch(seqs).all()
    rc.check_invariants()


def test_insert_is_all_or_nothing_over_the_chunks():
    rc = rs.RadixCache(np.int32)
    rc.insert([1, 2])
    before = stored_set(rc)
    late_empty = pa.chunked_array([pa.array([[5, 6], [7]]), pa.array([[8], []])])
    with pytest.raises(ValueError, match=r"an empty sequence \(sequence 3 of the batch\)"):
        rc.insert_batch(late_empty)
    too_big = pa.chunked_array([pa.array([[5, 6]]), pa.array([[7], [1 << 40]])])
    with pytest.raises(OverflowError, match="does not fit the tree's dtype int32"):
        rc.insert_batch(too_big)
    assert stored_set(rc) == before


def test_what_the_chunk_table_does_not_take_goes_the_per_chunk_way():
    nulls = pa.chunked_array([pa.array([[1, 2]]), pa.array([[3], None])])
    assert B.chunk_table(nulls) is None
    with pytest.raises(ValueError, match="null lists"):
        rs.RadixCache().exists_batch(nulls)
    null_values = pa.chunked_array([pa.array([[1, 2]]), pa.array([[3, None]])])
    assert B.chunk_table(null_values) is None
    with pytest.raises(ValueError, match="hold 1 nulls"):
        rs.RadixCache().exists_batch(null_values)
    small = pa.chunked_array([pa.array([[1, 2]], pa.list_(pa.int16())),
                              pa.array([[3]], pa.list_(pa.int16()))])
    assert B.chunk_table(small) is None
    rc = rs.RadixCache()
    rc.insert([1, 2])
    assert rc.exists_batch(small).tolist() == [True, False]
    floats = pa.chunked_array([pa.array([[1.0]]), pa.array([[2.0]])])
    with pytest.raises(TypeError, match="must be integers"):
        rc.exists_batch(floats)


def test_chunks_slice_like_a_batch():
    seqs = sequences(40, 4)
    (table,) = B.as_batches(pa.chunked_array([column(seqs[:15], pa.int32(), False),
                                              column(seqs[15:], pa.int32(), False)]), chunks=True)
    part = table[10:30]
    assert len(part) == 20 and part.lengths.tolist() == [len(s) for s in seqs[10:30]]
    assert part.num_tokens == sum(map(len, seqs[10:30]))
    k, a, b = part.tasks(rows=4)
    assert a[0] == 10 and b[-1] == 30 and (a[1:] == b[:-1]).all()
    assert 15 in a.tolist() and (b - a <= 4).all() and k.tolist() == [0] * 2 + [1] * 4


def test_progress_slices_cut_across_chunks(monkeypatch):
    from radix_soa._input import run as R

    monkeypatch.setattr(R, "PROGRESS_STEP", 37)  # slices end inside chunks and span them
    seqs = sequences(300, 5)
    col = mixed_chunks(seqs, pa.int64(), False)
    ref = NaiveSequenceSet()
    seen = []
    rc = rs.RadixCache()
    new = rc.insert_batch(col, progress=lambda done, total: seen.append(done))
    assert new.tolist() == [ref.insert(s) for s in seqs]
    assert len(seen) > 20 and seen == sorted(seen) and seen[-1] == sum(map(len, seqs))
    assert rc.match_length_batch(col, progress=lambda d, t: None).tolist() == \
        [len(s) for s in seqs]
    assert stored_set(rc) == ref.sorted()


def test_chunks_whose_values_are_a_slice_of_a_larger_buffer():
    values = pa.array(np.arange(100), pa.int32())
    a = pa.ListArray.from_arrays(pa.array([0, 3, 5, 9], pa.int32()), values.slice(7))
    b = pa.ListArray.from_arrays(pa.array([2, 4, 10], pa.int32()), values.slice(50))
    col = pa.chunked_array([a, b])
    (table,) = B.as_batches(col, chunks=True)
    assert isinstance(table, Chunks)
    seqs = col.to_pylist()
    assert seqs[0] == [7, 8, 9] and seqs[-1] == [54, 55, 56, 57, 58, 59]
    rc = rs.RadixCache()
    assert rc.insert_batch(col).all()
    assert stored_set(rc) == sorted(map(tuple, seqs))
    queries = pa.chunked_array([pa.array([[7, 8, 9, 1]]), pa.array([[54, 55, 56, 57, 58, 59, 0]])])
    assert rc.match_length_batch(queries).tolist() == [3, 6]
