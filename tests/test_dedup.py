"""first_occurrence against a dict of tuples."""

import numpy as np
import pytest

import radix_soa as rs
from radix_soa._input import dedup as _dedup


def by_dict(seqs):
    seen = {}
    return [seen.setdefault(tuple(s), i) for i, s in enumerate(seqs)]


@pytest.mark.parametrize("seed", range(6))
def test_first_occurrence_matches_a_dict(seed):
    rng = np.random.default_rng(seed)
    alphabet = [2, 3, 1000, 2**40][seed % 4]
    seqs = [rng.integers(-alphabet, alphabet, rng.integers(0, 5)).tolist() for _ in range(3000)]
    want = by_dict(seqs)
    assert len(set(want)) < len(seqs)  # duplicates are present (the empty ones at least)
    assert rs.first_occurrence(seqs).tolist() == want
    assert rs.first_occurrence(rs.pack(seqs)).tolist() == want


def test_first_occurrence_tells_prefixes_and_orders_apart():
    seqs = [[1, 2], [2, 1], [1, 2, 0], [1], [0, 1, 2], [1, 2], [0], [], [2, 1], []]
    assert rs.first_occurrence(seqs).tolist() == by_dict(seqs) == [0, 1, 2, 3, 4, 0, 6, 7, 1, 7]


def test_first_occurrence_of_an_empty_batch_and_of_arrow_int32():
    assert rs.first_occurrence([]).tolist() == []
    pa = pytest.importorskip("pyarrow")
    seqs = [[5, 6], [7], [5, 6], [7], [8]]
    arr = pa.chunked_array([pa.array(seqs[:2], pa.list_(pa.int32())),
                            pa.array(seqs[2:], pa.list_(pa.int32()))])
    assert rs.first_occurrence(arr).tolist() == [0, 1, 0, 1, 4]


def test_hash_collisions_are_settled_exactly(monkeypatch):
    rng = np.random.default_rng(9)
    seqs = [rng.integers(0, 4, rng.integers(1, 4)).tolist() for _ in range(500)]
    # every sequence of a length collides with every other of that length
    monkeypatch.setattr(_dedup, "_sequence_hashes", lambda b: np.zeros(len(b), np.uint64))
    assert rs.first_occurrence(seqs).tolist() == by_dict(seqs)


def test_first_occurrence_refuses_what_a_batch_refuses():
    with pytest.raises(TypeError, match="sequence 1"):
        rs.first_occurrence([[1], [2.5]])
