"""The pure-Python replay: the same semantics as ``radix_soa.replay``, one
Python call per request on ``ReferencePrefixCache`` objects. It is the
oracle the tests compare the compiled replay against, and its baseline.

>>> from radix_soa import workloads
>>> seqs = workloads.shared_prefix(n_sequences=50, n_prompts=2, prompt_len=32)
>>> replay_reference(seqs, capacity=2000).hits.tolist() == \\
...     __import__("radix_soa").replay(seqs, capacity=2000).hits.tolist()
True
"""

import bisect

import numpy as np

from .reference_prefix import CacheFullError, ReferencePrefixCache
from .simulate import SCHEDULES, DEFAULT_WINDOW, _as_trace


def replay_reference(trace, capacity=None, page_size=1, host_capacity=None, schedule="fcfs",
                     window=DEFAULT_WINDOW):
    """Replay like ``radix_soa.replay``; returns an object with ``hits``,
    ``host_hits``, ``rejected`` (per request arrays), ``order``,
    ``evicted_tokens`` and ``host_evicted_tokens``."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}; got {schedule!r}")
    tr = _as_trace(trace)
    flat = np.asarray(tr.flat, dtype=np.int64)
    offsets = np.asarray(tr.offsets, dtype=np.int64).tolist()
    ns = np.asarray(tr.namespace, dtype=np.int64).tolist()
    n = len(offsets) - 1
    seqs = [tuple(flat[offsets[i]:offsets[i + 1]].tolist()) for i in range(n)]
    has_host = host_capacity is not None
    dev = ReferencePrefixCache(capacity=capacity, page_size=page_size, values=has_host)
    host = ReferencePrefixCache(capacity=host_capacity, page_size=page_size, values=False)
    hits = np.zeros(n, np.int64)
    host_hits = np.zeros(n, np.int64)
    rejected = np.zeros(n, np.bool_)
    order = []
    inserted = host_inserted = 0

    def pick():
        if schedule == "lpm":
            while len(waiting) < window and arrivals:
                waiting.append(arrivals.pop(0))
            best = max(waiting, key=lambda i: (dev.match_length(seqs[i], namespace=ns[i]), -i))
            waiting.remove(best)
            return best
        return static.pop(0)

    arrivals = list(range(n))
    waiting = []
    static = list(range(n))
    if schedule == "dfs":
        static = []
        for w, lo in enumerate(range(0, n, window)):
            chunk = sorted(range(lo, min(n, lo + window)), key=lambda i: (ns[i], seqs[i]))
            static += chunk[::-1] if w % 2 else chunk
    for _ in range(n):
        i = pick()
        order.append(i)
        q = seqs[i]
        m = dev.match(q, namespace=ns[i])
        hits[i] = m.length
        if has_host:
            host_hits[i] = max(0, host.match(q, namespace=ns[i]).length - m.length)
        values = np.arange(offsets[i], offsets[i + 1], dtype=np.int64) if has_host else None
        try:
            r = dev.insert(q, values=values, namespace=ns[i])
        except CacheFullError:
            rejected[i] = True
            continue
        inserted += len(q) - len(q) % page_size - r.cached
        if has_host:
            for last in _chunk_ends(r.evicted.values, offsets):
                owner = bisect.bisect_right(offsets, last) - 1
                path = seqs[owner][: last + 1 - offsets[owner]]
                before = host.total_tokens + host.stats["evicted_tokens"]
                try:
                    host.insert(path, namespace=ns[owner])
                except CacheFullError:
                    continue
                host_inserted += host.total_tokens + host.stats["evicted_tokens"] - before

    class Result:
        pass

    out = Result()
    out.hits, out.host_hits, out.rejected = hits, host_hits, rejected
    out.order = np.array(order, np.int64)
    out.evicted_tokens = inserted - dev.total_tokens
    out.host_evicted_tokens = host_inserted - host.total_tokens if has_host else 0
    out.final_tokens = dev.total_tokens
    return out


def _chunk_ends(values, offsets):
    """Last value of each run of consecutive flat positions in an eviction's
    values (one run per trimmed leaf; a run never spans two requests)."""
    if values is None or len(values) == 0:
        return []
    v = np.asarray(values)
    starts = np.zeros(len(v), bool)
    starts[1:] = v[1:] != v[:-1] + 1
    starts |= np.isin(v, offsets)
    starts[0] = True
    ends = np.flatnonzero(np.append(starts[1:], True))
    return v[ends].tolist()
