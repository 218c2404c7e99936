"""Compile (or load from Numba's on-disk cache) every kernel on tiny inputs.

A front end: it exercises the product and the replay study alike."""

import os
import tempfile

import numpy as np

from .prefix_cache import PrefixCache
from .radix_cache import RadixCache


def warmup(dtypes=(np.int64,)):
    """Run each public operation once per token ``dtype`` so later calls do
    not pay compilation. Returns the number of trees exercised.

    >>> import radix_soa
    >>> radix_soa.warmup()
    1
    """
    for dtype in dtypes:
        rc = RadixCache(dtype=dtype)
        rc.insert([1, 2, 3])
        rc.insert([1, 2, 4])
        rc.exists([1, 2, 3])
        rc.match_prefix([1, 2, 5])
        rc.exists(np.array([1, 2, 3]))
        rc.match_prefix(np.array([1, 2, 5]))
        rc.remove([1, 2, 4])
        rc.to_csr()
        rc.insert_batch([[1, 2], [3]])
        for parallel in (False, True):
            rc.exists_batch([[1, 2], [3]], parallel=parallel)
            rc.match_prefix_batch([[1, 2], [3]], parallel=parallel)
        # memory-mapped trees hand read-only arrays to the kernels
        with tempfile.TemporaryDirectory() as tmp:
            rc.save(os.path.join(tmp, "t"))
            ro = RadixCache.load(os.path.join(tmp, "t"), mmap=True)
            ro.exists([1, 2])
            ro.match_prefix([1, 2])
            ro.to_csr()
            for parallel in (False, True):
                ro.exists_batch([[1, 2], [3]], parallel=parallel)
                ro.match_prefix_batch([[1, 2], [3]], parallel=parallel)
        for values in (True, False):
            pc = PrefixCache(capacity=8, values=values, dtype=dtype)
            vals = (lambda n: list(range(n))) if values else (lambda n: None)
            pc.insert([1, 2, 3, 4], values=vals(4))
            m = pc.match(np.array([1, 2, 9]))
            pc.lock(m.node)
            pc.insert([5, 6, 7, 8], values=vals(4))
            pc.unlock(m.node)
            pc.match_batch([[1, 2], [5]])
            pc.match_length([1, 2])
            pc.match_length_batch([[1, 2], [5]])
            pc.evict(2)
            # the serving API's own kernels
            pc.insert_batch([[1, 2], [3]], values=[[1, 2], [3]] if values else None)
            pc.touch(pc.peek([1, 2]).node)
            r = pc.begin([1, 2, 3])
            pc.checkpoint(r, [1, 2], vals(2))
            pc.finish(r, [1, 2, 3], vals(3))
            pc.abort(pc.begin([1]))
            rb, _ = pc.begin_batch([[1, 2, 3], [1]])  # a scheduler step's kernels
            if values:
                rb.values  # noqa: B018  (read from the cache)
            pc.checkpoint_batch(rb, [[1, 2, 3], [1]], [vals(3), vals(1)] if values else None)
            pc.finish_batch([rb[0], rb[1]], [[1, 2, 3, 4], [1, 5]],
                            [vals(4), vals(2)] if values else None)
            pc.drop_namespace(0)
    warmup_replay()
    warmup_cluster()
    return len(dtypes)


def warmup_replay():
    """Compile (or load) what a replay runs: every schedule, with and
    without a host tier, on requests that make both tiers grow, evict and
    compact, so the first timed replay pays no compilation. Returns the
    number of replays run.

    >>> warmup_replay()
    6
    """
    from .studies.replay import replay  # the studies load on first use

    rng = np.random.default_rng(0)
    # distinct requests under a small capacity: dead token runs pile up and
    # compaction runs mid-replay; repeats give hits from both tiers
    seqs = [rng.integers(0, 10**6, size=1000) for _ in range(30)]
    seqs += seqs[-3:]
    runs = 0
    for schedule in ("fcfs", "lpm", "dfs"):
        for host in (None, 3000):
            replay(seqs, capacity=4000, host_capacity=host, schedule=schedule, window=4)
            runs += 1
    return runs


def warmup_cluster():
    """Compile (or load) what a cluster replay runs: every router, on
    requests that make the trees grow and evict. Returns the number of
    cluster replays run.

    >>> warmup_cluster()
    6
    """
    from .studies.cluster import ROUTERS, replay_cluster

    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 50, size=int(rng.integers(1, 300))) for _ in range(40)]
    for router in ROUTERS:
        replay_cluster(seqs, workers=2, capacity=500, router=router, eviction_interval=0.0,
                       max_tree_size=200)
    return len(ROUTERS)
