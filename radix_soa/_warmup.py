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
        warmup_radix(dtype)
        warmup_mapped(dtype)
        for values in (True, False):
            warmup_prefix(dtype, values)
    warmup_chunked()
    warmup_router()
    warmup_replay()
    warmup_cluster()
    return len(dtypes)


def warmup_radix(dtype=np.int64):
    """Compile (or load) what a ``RadixCache`` of ``dtype`` runs."""
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
    return rc


def warmup_mapped(dtype=np.int64):
    """Compile (or load) what a memory-mapped ``RadixCache`` runs."""
    rc = RadixCache(dtype=dtype)
    rc.insert_batch([[1, 2], [3]])
    with tempfile.TemporaryDirectory() as tmp:
        rc.save(os.path.join(tmp, "t"))
        ro = RadixCache.load(os.path.join(tmp, "t"), mmap=True)
        ro.exists([1, 2])
        ro.match_prefix([1, 2])
        ro.to_csr()
        for parallel in (False, True):
            ro.exists_batch([[1, 2], [3]], parallel=parallel)
            ro.match_prefix_batch([[1, 2], [3]], parallel=parallel)


def warmup_prefix(dtype=np.int64, values=True):
    """Compile (or load) what a ``PrefixCache`` of ``dtype`` runs, with or
    without per-token ``values``, the serving API's kernels included."""
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
    return pc


def warmup_chunked():
    """Compile (or load) what a chunked Arrow column runs in place
    (``exists_batch``, ``match_length_batch``, ``insert_batch`` over its
    chunks); nothing without pyarrow. Returns whether it ran."""
    try:
        import pyarrow as pa
    except ImportError:
        return False
    col = pa.chunked_array([pa.array([[1, 2], [3]], pa.list_(pa.int64())),
                            pa.array([[1, 2, 3]], pa.list_(pa.int64()))])
    rc = RadixCache()
    rc.insert_batch(col)
    for parallel in (False, True):
        rc.exists_batch(col, parallel=parallel)
        rc.match_length_batch(col, parallel=parallel)
    return True


def warmup_router():
    """Compile (or load) what a ``RouterIndex`` runs: events as objects and
    from vLLM's wire bytes (pages keyed by their tokens, engine hashes as
    handles), single and batch overlaps. Returns the index.

    >>> warmup_router().overlap([1, 2, 3, 4]).tolist()
    [4, 2]
    """
    from ._events.kv_events import BlockRemoved, BlockStored
    from .router_index import RouterIndex

    pc = PrefixCache(page_size=2, events=True, values=False)
    pc.insert([1, 2, 3, 4])
    ix = RouterIndex(page_size=2, workers=["a", "b"])
    ix.apply("a", pc.take_events())
    try:
        from .integrations.vllm_wire import encode_batch
    except ImportError:  # msgpack absent: the object path only
        ix.apply("b", [BlockStored([b"h" * 32], None, [1, 2], 2)])
    else:
        ix.apply_wire("b", encode_batch([{"type": "BlockStored", "block_hashes": [b"h" * 32],
                                          "parent_block_hash": None, "token_ids": [1, 2],
                                          "block_size": 2}]))
    ix.overlap_scores([1, 2, 3])
    ix.overlap_batch([[1, 2, 3], [1]])
    other = RouterIndex(page_size=2)  # engine hashes through the object path: entries, removal
    other.apply("c", [BlockStored([9], None, [1, 2], 2)])
    other.apply("d", [BlockStored([8], None, [1, 2], 2), BlockRemoved([8])])
    return ix


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


# (name, what it compiles, the function): the kernel groups ``radix-soa
# warmup`` compiles, in order; the first is compiled alone (the table,
# descent and mutation kernels every other group calls), the rest may run
# in parallel processes (``warmup_groups(jobs=N)``)
GROUPS = (
    ("radix", "RadixCache", warmup_radix),
    ("prefix", "PrefixCache with values, the serving API", lambda: warmup_prefix(values=True)),
    ("prefix-novalues", "PrefixCache(values=False)", lambda: warmup_prefix(values=False)),
    ("mapped", "memory-mapped RadixCache", warmup_mapped),
    ("chunked", "chunked Arrow columns in place", warmup_chunked),
    ("router", "RouterIndex: events, wire batches, overlaps", warmup_router),
    ("replay", "replay, every schedule", warmup_replay),
    ("cluster", "cluster replay, every router", warmup_cluster),
)


def run_group(name):
    """Run the warmup group ``name`` (one of ``GROUPS``) in this process.

    >>> run_group("radix")
    'radix'
    >>> run_group("nope")
    Traceback (most recent call last):
    ...
    KeyError: "no warmup group 'nope'; groups: radix, prefix, prefix-novalues, mapped, chunked, router, replay, cluster"
    """
    for group, _, fn in GROUPS:
        if group == name:
            fn()
            return name
    raise KeyError(f"no warmup group {name!r}; groups: {', '.join(g[0] for g in GROUPS)}")


def _run_in_child(name):
    """Run group ``name`` in a new Python process (the same radix_soa, the
    same Numba cache); returns ``(name, seconds, error or None)``."""
    import subprocess
    import sys
    import time

    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([package_parent] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("RADIX_SOA_QUIET", "1")
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", f"from radix_soa._warmup import run_group; run_group({name!r})"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    error = None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        error = lines[-1]
    return name, time.perf_counter() - t0, error


def warmup_groups(jobs=1, progress=None):
    """Compile (or load) every kernel group of ``GROUPS``: in this process
    when ``jobs`` is 1, else the first group here and the others in up to
    ``jobs`` processes at once. ``progress(name, seconds)`` is called as
    each group is done. Returns the number of groups run; a group that
    failed in a child process raises ``RuntimeError`` naming it.

    >>> warmup_groups(progress=lambda name, seconds: print(name))
    radix
    prefix
    prefix-novalues
    mapped
    chunked
    router
    replay
    cluster
    8
    """
    import time
    from concurrent.futures import ThreadPoolExecutor, as_completed

    if isinstance(jobs, bool) or not isinstance(jobs, int):
        raise TypeError(f"jobs must be an int, got {type(jobs).__name__}")
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    report = progress or (lambda name, seconds: None)
    first, *rest = GROUPS
    t0 = time.perf_counter()
    first[2]()
    report(first[0], time.perf_counter() - t0)
    if jobs == 1:
        for name, _, fn in rest:
            t0 = time.perf_counter()
            fn()
            report(name, time.perf_counter() - t0)
        return len(GROUPS)
    failed = []
    with ThreadPoolExecutor(min(jobs, len(rest))) as pool:
        running = [pool.submit(_run_in_child, g[0]) for g in rest]
        for future in as_completed(running):
            name, seconds, error = future.result()
            if error is not None:
                failed.append(f"{name}: {error}")
            else:
                report(name, seconds)
    if failed:
        raise RuntimeError("warmup failed in " + "; ".join(failed))
    return len(GROUPS)
