"""What a user's type checker sees of the public API: mypy checks this file
in CI (``[tool.mypy] files`` in pyproject.toml); ``assert_type`` fails the
check when an annotation is missing or wrong. Never run (nothing calls
``usage``), so it holds no test of behaviour."""

from typing import Any, assert_type

import numpy as np

import radix_soa as rs


def usage() -> None:
    rc = rs.RadixCache()
    assert_type(rc.insert([1, 2, 3]), bool)
    assert_type(rc.exists(np.array([1, 2])), bool)
    assert_type(rc.match_prefix((1, 2)), int)
    assert_type(rc.insert_batch([[1], [2, 3]]), np.ndarray)
    assert_type(rc.exists_batch([[1]], parallel=False), np.ndarray)
    assert_type(rc.match_prefix_batch([[1]]), np.ndarray)
    assert_type(rc.to_csr(), tuple[np.ndarray, np.ndarray])
    assert_type(len(rc), int)
    assert_type(rs.RadixCache.load("tree"), rs.RadixCache)
    assert_type(rc.memory_report(), dict[str, Any])
    assert_type(rc.ids([[1, 2, 3]]), np.ndarray)
    assert_type(rc.prefix_ids([[1, 2, 3]]), np.ndarray)
    assert_type(rc.sequence(0), np.ndarray)

    pc = rs.PrefixCache(capacity=100, page_size=1)
    m = pc.match([1, 2])
    assert_type(m, rs.Match)
    assert_type(m.length, int)
    assert_type(pc.insert([1, 2], values=[5, 6]).node, int)
    assert_type(pc.lock(m.node), int)
    assert_type(pc.evict(4), rs.EvictResult)
    assert_type(pc.match_length([1]), int)

    b = rs.pack([[1, 2], [3]])
    assert_type(b, rs.Batch)
    assert_type(b[0], np.ndarray)
    assert_type(b[0:1], rs.Batch)
    assert_type(b.lengths, np.ndarray)
