"""Per-call cost of the hot single calls, in microseconds (best of 7 runs
of 20,000 calls each), printed as ``name  us``. The same script runs
against any checkout (``PYTHONPATH=<checkout> python asv_bench/percall.py``),
so two versions can be compared call by call; ``asv_bench/percall_ab.py``
times two checkouts' calls interleaved in one process.
"""

import time

import numpy as np

import radix_soa as rs


def per_call(fn, n=20_000, repeat=7):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def rows(rs):
    """``[(name, call), ...]``: the hot single calls on caches of ``rs`` (the
    ``radix_soa`` module, or a copy of it under another name)."""
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 1000, size=32) for _ in range(2000)]
    q = seqs[17]
    rc = rs.RadixCache()
    for s in seqs:
        rc.insert(s)
    pc = rs.PrefixCache()
    for s in seqs:
        pc.insert(s, values=s)
    node = pc.match(q).node
    vals = q.copy()

    def lock_unlock():
        pc.lock(node)
        pc.unlock(node)

    out16 = np.concatenate([q, np.arange(16, dtype=np.int64) + 10**6])
    vals16 = np.arange(len(out16), dtype=np.int64)

    def begin_finish():
        r = pc.begin(q)
        pc.finish(r, out16, vals16)

    pool = np.empty(64, np.int64)
    ev = rs.PrefixCache()

    def evict_refill():  # evict 32 tokens into a pool, then put them back
        ev.insert(q, values=vals)
        ev.evict(32, out=pool)

    return [
        ("RadixCache.insert (stored, 32 tokens)", lambda: rc.insert(q)),
        ("RadixCache.exists (32 tokens)", lambda: rc.exists(q)),
        ("RadixCache.match_prefix (32 tokens)", lambda: rc.match_prefix(q)),
        ("PrefixCache.match (32 tokens, values)", lambda: pc.match(q)),
        ("PrefixCache.match_length (32 tokens)", lambda: pc.match_length(q)),
        ("PrefixCache.insert (cached, 32 tokens, values)", lambda: pc.insert(q, values=vals)),
        ("PrefixCache.lock + unlock", lock_unlock),
        ("PrefixCache.begin + finish (32 + 16 tokens)", begin_finish),
        ("PrefixCache.insert + evict(32, out=)", evict_refill),
    ]


def main():
    for name, fn in rows(rs):
        fn()
        print(f"{name:<48} {per_call(fn):7.3f}")


if __name__ == "__main__":
    main()
