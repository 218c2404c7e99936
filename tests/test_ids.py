"""Sequence ids: ``RadixCache.ids`` / ``prefix_ids`` / ``sequence`` against a
brute-force model, and the ids' stability across every change a stored
sequence survives."""

import pickle

import numpy as np
import pytest
from hypothesis import given, strategies as st

from radix_soa import RadixCache

I64 = np.iinfo(np.int64)
tokens = st.sampled_from([0, 1, 2, -1, I64.max])
sequences = st.lists(tokens, min_size=1, max_size=10)
ops = st.lists(st.tuples(st.sampled_from(["insert", "remove", "batch", "compact"]),
                         st.lists(sequences, min_size=1, max_size=4)), max_size=40)


def check_against(rc, ids_at_insert, probes):
    """Every stored sequence keeps the id it got; ids are distinct; each
    probe's exact and prefix ids are what the stored set says."""
    stored = list(ids_at_insert)
    got = rc.ids([list(s) for s in stored]) if stored else np.empty(0, np.int64)
    assert got.tolist() == [ids_at_insert[s] for s in stored]
    assert len(set(got.tolist())) == len(stored)
    for s in stored:
        assert rc.sequence(ids_at_insert[s]).tolist() == list(s)
    exact, prefix = rc.ids(probes), rc.prefix_ids(probes)
    for q, e, p in zip(probes, exact.tolist(), prefix.tolist()):
        assert e == ids_at_insert.get(tuple(q), -1)
        longest = max((s for s in stored if tuple(q[:len(s)]) == s), key=len, default=None)
        assert p == (-1 if longest is None else ids_at_insert[longest])


@given(ops, st.lists(st.lists(tokens, max_size=12), max_size=20))
def test_ids_follow_the_stored_set_and_never_move(operations, probes):
    rc = RadixCache()
    ids = {}  # stored sequence -> the id it got when inserted
    for op, seqs in operations:
        if op == "insert":
            for s in seqs:
                rc.insert(s)
                ids.setdefault(tuple(s), int(rc.ids([s])[0]))
        elif op == "batch":
            rc.insert_batch(seqs)
            for s in seqs:
                ids.setdefault(tuple(s), int(rc.ids([s])[0]))
        elif op == "remove":
            for s in seqs:
                if tuple(s) in ids:
                    rc.remove(s)
                    del ids[tuple(s)]
        else:
            rc.compact(0.0)
        check_against(rc, ids, probes + [list(s) for s in seqs])
    rc.check_invariants()


def test_ids_survive_save_load_mmap_and_pickle(tmp_path):
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 4, int(k)).tolist() for k in rng.integers(1, 12, 500)]
    rc = RadixCache()
    rc.insert_batch(seqs)
    want = rc.ids(seqs)
    assert (want >= 0).all()
    rc.save(tmp_path / "t")
    for other in (RadixCache.load(tmp_path / "t"), RadixCache.load(tmp_path / "t", mmap=True),
                  pickle.loads(pickle.dumps(rc))):
        np.testing.assert_array_equal(other.ids(seqs), want)
        assert other.sequence(want[7]).tolist() == seqs[7]


def test_narrow_dtypes_and_chunked_input():
    pa = pytest.importorskip("pyarrow")
    rc = RadixCache(dtype=np.int32)
    rc.insert_batch([[1, 2], [1, 2, 3], [7]])
    col = pa.chunked_array([pa.array([[1, 2], [5]]), pa.array([[1, 2, 3, 4], [7]])])
    assert (rc.ids(col) >= 0).tolist() == [True, False, False, True]
    assert rc.sequence(rc.prefix_ids(col)[2]).tolist() == [1, 2, 3]


def test_an_id_that_is_not_a_stored_sequence_is_a_key_error():
    rc = RadixCache()
    rc.insert_batch([[1, 2, 3], [1, 2, 4]])  # [1, 2] is an inner node, not stored
    for bad in (-1, 0, 10**6, 2**63, -2**70):
        with pytest.raises(KeyError, match="no stored sequence"):
            rc.sequence(bad)
    with pytest.raises(TypeError):
        rc.sequence(1.5)
    ids = rc.ids([[1, 2, 3], [1, 2, 4]]).tolist()
    others = [v for v in range(rc._s.node_end) if v not in ids]  # the root, the inner node
    assert len(others) == 2
    for v in others:
        with pytest.raises(KeyError):
            rc.sequence(v)
