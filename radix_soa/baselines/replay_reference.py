"""The pure-Python replay: the same semantics as ``radix_soa.replay``, one
Python call per request on ``ReferencePrefixCache`` objects. It is the
oracle the tests compare the compiled replay against, and its baseline.

>>> from radix_soa.studies import workloads
>>> seqs = workloads.shared_prefix(n_sequences=50, n_prompts=2, prompt_len=32)
>>> replay_reference(seqs, capacity=2000).hits.tolist() == \\
...     __import__("radix_soa").replay(seqs, capacity=2000).hits.tolist()
True
"""

import bisect

import numpy as np

from .._tree.results import CacheFullError
from .._input.batch import as_batches, pack
from .reference_prefix import ReferencePrefixCache

# the same names and default as radix_soa.replay (a test keeps them equal)
SCHEDULES = ("fcfs", "lpm", "dfs")
DEFAULT_WINDOW = 64


def _requests(trace):
    """``(flat, offsets, namespace, input_tokens, block_size)`` of a trace
    (anything with those attributes, such as
    ``radix_soa.studies.traces.Trace``) or of any batch input (one
    namespace, one id per token)."""
    if all(hasattr(trace, a) for a in ("flat", "offsets", "namespace")):
        return (trace.flat, trace.offsets, trace.namespace, trace.input_tokens,
                trace.block_size)
    batches = as_batches(trace)
    b = batches[0] if len(batches) == 1 else pack([s for b in batches for s in b])
    return b.flat, b.offsets, np.zeros(len(b), np.int64), b.lengths, 1


def replay_reference(trace, capacity=None, page_size=1, host_capacity=None, schedule="fcfs",
                     window=DEFAULT_WINDOW, eviction_policy="lru", warmup=0.0):
    """Replay like ``radix_soa.replay``; returns a ``ReferenceReplay`` with
    the implementation-independent fields of its result (``hits``,
    ``host_hits``, ``order``, ``rejected`` per request, ``evicted_ids``,
    ``peak_ids``, ``prefill_tokens_saved``, ...). The first
    ``floor(warmup * n)`` arrivals are replayed but not scored."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}; got {schedule!r}")
    flat, offsets, ns, inputs, block_size = _requests(trace)
    flat = np.asarray(flat, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64).tolist()
    ns = np.asarray(ns, dtype=np.int64).tolist()
    n = len(offsets) - 1
    seqs = [tuple(flat[offsets[i]:offsets[i + 1]].tolist()) for i in range(n)]
    has_host = host_capacity is not None
    dev = ReferencePrefixCache(capacity=capacity, page_size=page_size, values=has_host,
                               eviction_policy=eviction_policy)
    host = ReferencePrefixCache(capacity=host_capacity, page_size=page_size, values=False)
    hits = np.zeros(n, np.int64)
    host_hits = np.zeros(n, np.int64)
    rejected = np.zeros(n, np.bool_)
    order = []
    inserted = host_inserted = peak = 0

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
        if has_host:
            host_len = host.match_length(q, namespace=ns[i])
        values = np.arange(offsets[i], offsets[i + 1], dtype=np.int64) if has_host else None
        hits[i], r = serve_request(dev, q, ns[i], values)
        if has_host:
            host.match(q, namespace=ns[i])
            host_hits[i] = max(0, host_len - hits[i])
        if r is None:
            rejected[i] = True
            continue
        inserted += len(q) - len(q) % page_size - r.cached
        peak = max(peak, dev.total_tokens)
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

    inputs = np.asarray(inputs, dtype=np.int64)
    lengths = np.diff(np.asarray(offsets, dtype=np.int64))
    scored = [i for i in range(n) if i >= warmup * n // 1]
    out = ReferenceReplay()
    out.requests, out.capacity, out.host_capacity = n, capacity, host_capacity
    out.page_size, out.schedule, out.window = page_size, schedule, window
    out.block_size = bs = int(block_size)
    out.warmup, out.scored_requests = float(warmup), len(scored)
    out.hits, out.host_hits, out.rejected = hits, host_hits, rejected
    out.total_ids = sum(int(lengths[i]) for i in scored)
    out.hit_ids = sum(int(hits[i]) for i in scored)
    out.host_hit_ids = sum(int(host_hits[i]) for i in scored)
    out.request_hit_rate = sum(1 for i in scored if hits[i] > 0) / len(scored) if scored else 0.0
    out.prefill_tokens = sum(int(inputs[i]) for i in scored)
    out.prefill_tokens_hit = sum(min(int(hits[i]) * bs, int(inputs[i])) for i in scored)
    out.prefill_tokens_saved = sum(min(int(hits[i] + host_hits[i]) * bs, int(inputs[i]))
                                   for i in scored)
    out.order = np.array(order, np.int64)
    out.evicted_ids = inserted - dev.total_tokens
    out.host_evicted_ids = host_inserted - host.total_tokens if has_host else 0
    out.peak_ids = peak
    out.final_ids = dev.total_tokens
    return out


def serve_request(dev, q, namespace, values=None):
    """One request on ``dev`` (a ``ReferencePrefixCache``) as the replay
    serves it: match (the hit), then insert. Returns ``(hit, InsertResult)``,
    the result ``None`` when the request could not be cached."""
    hit = dev.match(q, namespace=namespace).length
    try:
        return hit, dev.insert(q, values=values, namespace=namespace)
    except CacheFullError:
        return hit, None


class ReferenceReplay:
    """What ``replay_reference`` measured: the fields of
    ``radix_soa.replay``'s result that do not depend on how the replay is
    implemented (no index bytes, no timing), except that ``rejected`` is a
    bool per request here (its sum is the compiled replay's count)."""

    def __repr__(self):
        return (f"ReferenceReplay(requests={self.requests}, capacity={self.capacity}, "
                f"hit_ids={self.hit_ids})")


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
