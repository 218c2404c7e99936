"""What a user's type checker sees of the public API: mypy checks this file
in CI (``[tool.mypy] files`` in pyproject.toml); ``assert_type`` fails the
check when an annotation is missing or wrong. Never run (nothing calls
``usage``), so it holds no test of behaviour."""

from typing import Any, Optional, Union, assert_type

import dask.array
import dask.bag
import dask.dataframe
import distributed
import numpy as np

import radix_soa as rs
import radix_soa.dask as rsd


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

    # the serving loop (prefix_cache.lifecycle)
    r = pc.begin([1, 2, 3], namespace="a", reserve=4, priority=1)
    assert_type(r, rs.Request)
    assert_type(r.cached, int)
    assert_type(r.node, int)
    assert_type(r.values, Optional[np.ndarray])
    assert_type(r.evicted, rs.EvictResult)
    assert_type(r.open, bool)
    assert_type(r.steps, int)
    assert_type(r.result, Union[np.ndarray, rs.Finished, None])
    assert_type(pc.checkpoint(r, [1, 2, 3], [4, 5, 6]), Optional[np.ndarray])
    f = pc.finish(r, [1, 2, 3, 4], np.arange(4))
    assert_type(f, rs.Finished)
    assert_type(f.free, Optional[np.ndarray])
    assert_type(pc.abort(pc.begin([1])), None)
    assert_type(pc.peek([1, 2]), rs.Match)
    assert_type(pc.touch(m.node), None)
    with pc.locked(m.node) as held:
        assert_type(held, int)
    assert_type(pc.inflight_tokens, int)
    assert_type(pc.open_requests(), list[rs.Request])
    assert_type(pc.drop_namespace("a"), rs.EvictResult)
    assert_type(pc.cached_values(), np.ndarray)
    assert_type(pc.to_text(tokens_shown=3), str)
    assert_type(pc.reset_stats(), None)
    assert_type(pc.reset(), None)

    # the studies
    trace = rs.workloads.generate("multi_turn", n=20)
    rr = rs.replay(trace, capacity=1000, page_size=1, warmup=0.5)
    assert_type(rr, rs.ReplayResult)
    assert_type(rr.hit_rate, float)
    assert_type(rr.token_hit_rate, float)
    assert_type(rr.capacity, Optional[int])
    assert_type(rr.hits, np.ndarray)
    assert_type(rr.summary(), dict[str, Any])
    sw = rs.sweep([[1, 2], [1, 3]], [None, 10], threads=1, progress=print, schedule="lpm")
    assert_type(sw, rs.SweepResult)
    assert_type(sw.results, list[rs.ReplayResult])
    assert_type(sw.rows, list[dict[str, Any]])
    assert_type(sw.to_dict(), dict[str, list[Any]])
    assert_type(sw.table(capacity_unit="tokens", legend=False), str)
    assert_type(sw.to_csv(), str)
    cr = rs.replay_cluster(trace, workers=4, capacity=None, router="prefix_hash", seed=1,
                           arrival_rate=2.0, eviction_interval=None)
    assert_type(cr, rs.ClusterResult)
    assert_type(cr.hit_rate, float)
    assert_type(cr.per_worker, dict[str, np.ndarray])
    csw = rs.sweep_cluster(trace, workers=2, capacities=[None, 100], routers="random")
    assert_type(csw, rs.ClusterSweep)
    assert_type(csw.results, list[rs.ClusterResult])
    assert_type(csw.to_csv(), str)

    # radix_soa.dask
    client = distributed.Client()
    sc = rsd.build([[1, 2, 3]], shards=2, client=client, head=2)
    assert_type(sc, rsd.ShardedCache)
    assert_type(sc.exists_batch([[1, 2, 3]]), np.ndarray)
    assert_type(sc.match_prefix_batch(np.array([1, 2])), np.ndarray)
    bag: dask.bag.Bag = dask.bag.from_sequence([[1, 2]])
    assert_type(sc.exists_batch(bag), dask.array.Array)
    assert_type(sc.match_prefix_batch(bag), dask.array.Array)
    col: dask.dataframe.Series = dask.dataframe.from_dict({"t": [[1, 2]]}, npartitions=1)["t"]
    assert_type(sc.exists_batch(col), dask.array.Array)
    assert_type(sc.insert_batch([[4]]), np.ndarray)
    assert_type(sc.save("tree"), None)
    assert_type(sc.memory_report(), dict[str, Any])
    assert_type(sc.head, int)
    assert_type(sc.shards, int)
    assert_type(sc.shard_lengths, np.ndarray)
    assert_type(len(sc), int)
    assert_type(rsd.load("tree", mmap=True, client=client), rsd.ShardedCache)
    assert_type(rsd.shard_of(rs.pack([[1, 2]]), 2, 4), np.ndarray)
    assert_type(rsd.sweep(trace, [None, 100], client=client), rs.SweepResult)
    assert_type(rsd.sweep_many({"turns": trace}, [100], schedules=["fcfs", "lpm"]),
                dict[tuple[str, str], rs.SweepResult])
