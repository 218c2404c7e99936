"""The per-decision routing rules, in plain Python: given what a router
knows at one request (each worker's overlap and load), the worker it
picks. ``cluster_reference`` (the cluster study's oracle, which the
compiled ``replay_cluster`` is tested against) and the router service
(``radix_soa.service``) both call these, so the service
picks what the study's routers pick for the same overlaps and loads.
``radix_soa.studies.cluster``'s docstring says where each rule comes from.

Workers are positions ``0 .. n-1`` in the lists passed; every rule breaks
ties by the order it states.

>>> cache_aware_choice([0, 48, 48], outstanding=[0, 0, 0], processed=[0, 0, 0], length=64)
(1, 'hit')
>>> kv_overlap_choice([0, 48], queued=[0, 0], active=[0, 10], inputs=64, tokens_per_block=16)
0
>>> least_loaded_choice([3, 1, 1])
1
>>> points = ring_points([0, 1, 2], vnodes=8)
>>> prefix_hash_choice(prefix_key([1, 2, 3, 4], 0, 4), points) in (0, 1, 2)
True
"""

import bisect
import hashlib
import json

__all__ = ["cache_aware_choice", "kv_overlap_choice", "least_loaded_choice",
           "shortest_queue", "prefix_key", "ring_key", "ring_points", "prefix_hash_choice",
           "mix64", "CACHE_AWARE_DEFAULTS"]

MASK = (1 << 64) - 1
# SGLang's router (smg) defaults: cache_threshold, balance_abs_threshold, balance_rel_threshold
CACHE_AWARE_DEFAULTS = {"cache_threshold": 0.5, "balance_abs_threshold": 32,
                        "balance_rel_threshold": 1.1}


def mix64(x):
    """splitmix64's finalizer on a Python int (64 bits)."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def _signed(x):
    return x - (1 << 64) if x >= 1 << 63 else x


def shortest_queue(outstanding, processed):
    """SGLang's min-load worker: the smallest (outstanding, processed, position)."""
    return min(range(len(outstanding)), key=lambda w: (outstanding[w], processed[w], w))


def cache_aware_choice(lengths, outstanding, processed, length, cache_threshold=0.5,
                       balance_abs_threshold=32, balance_rel_threshold=1.1):
    """SGLang's cache-aware pick: ``(position, mode)``.

    When the outstanding request counts are imbalanced (``max - min >
    balance_abs_threshold`` and ``max > min x balance_rel_threshold``):
    the shortest queue, mode ``"balance"``. Otherwise, if the longest of
    ``lengths`` (each worker's matched tokens of the request) covers more
    than ``cache_threshold`` of the request's ``length`` tokens: that
    worker (the first on ties), mode ``"hit"``; else the shortest queue,
    mode ``"miss"``. ``processed`` (requests routed to each so far) breaks
    the shortest queue's ties, then the position.
    """
    lo, hi = min(outstanding), max(outstanding)
    if hi - lo > balance_abs_threshold and hi > lo * balance_rel_threshold:
        return shortest_queue(outstanding, processed), "balance"
    best = max(lengths)
    rate = best / length if length else 0.0
    if rate > cache_threshold:
        return lengths.index(best), "hit"
    return shortest_queue(outstanding, processed), "miss"


def kv_overlap_cost(overlap, queued, active, inputs, tokens_per_block, own_blocks=0,
                    weight=1.0):
    """Dynamo's cost of one worker: ``weight`` x prefill blocks (its
    ``queued`` prefill tokens + the request's ``inputs`` tokens it does not
    cache, ``overlap`` of them cached) + decode blocks (its ``active``
    blocks + the request's own)."""
    prefill = queued + inputs - min(overlap, inputs)
    return weight * (prefill / tokens_per_block) + (active + own_blocks)


def kv_overlap_choice(overlaps, queued, active, inputs, tokens_per_block, own_blocks=0,
                      weight=1.0, start=0):
    """NVIDIA Dynamo's KV-router pick (temperature 0): the position of the
    lowest ``kv_overlap_cost``, ties to the first in the order ``start,
    start + 1, ...`` (mod n). ``overlaps`` are tokens each worker caches of
    the request; ``queued`` and ``active`` its load."""
    n = len(overlaps)
    best = best_cost = None
    for k in range(n):
        u = (start + k) % n
        cost = kv_overlap_cost(overlaps[u], queued[u], active[u], inputs, tokens_per_block,
                               own_blocks, weight)
        if best is None or cost < best_cost:
            best, best_cost = u, cost
    return best


def least_loaded_choice(loads):
    """The position of the smallest load (the first on ties)."""
    return min(range(len(loads)), key=lambda w: (loads[w], w))


def prefix_key(seq, namespace, k):
    """``prefix_hash``'s key: a hash of the (int) ``namespace`` and the first
    ``k`` ids of ``seq``, as a signed 64-bit int."""
    h = mix64((namespace + 0x9E3779B97F4A7C15) & MASK)
    for t in seq[:k]:
        h = mix64(h ^ (t & MASK))
    return _signed(h)


def ring_key(worker):
    """A worker's number on the ring: an int id in ``[0, 2**31)`` (or such
    an int written in decimal, as the command line gives ids) is itself;
    any other id the first 31 bits of BLAKE2b of its JSON form. So workers
    ``0 .. n-1`` have the cluster study's ring.

    >>> ring_key(3), ring_key("3"), ring_key("gpu-a") == ring_key("gpu-a")
    (3, 3, True)
    """
    if type(worker) is int and 0 <= worker < 1 << 31:
        return worker
    if isinstance(worker, str) and worker.isdigit() and worker.isascii() \
            and str(int(worker)) == worker and int(worker) < 1 << 31:
        return int(worker)
    data = json.dumps(worker).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 33


def ring_points(keys, vnodes):
    """The consistent-hash ring of workers with ring numbers ``keys`` (in
    their positions): ``vnodes`` points each, point ``(w, v)`` splitmix64
    of ``w * 2**32 + v``; a sorted list of ``(point, position)``."""
    return sorted((_signed(mix64(((k << 32) + v) & MASK)), p)
                  for p, k in enumerate(keys) for v in range(vnodes))


def prefix_hash_choice(key, points):
    """The position owning the first ring point at or after ``key``
    (wrapping to the first point)."""
    at = bisect.bisect_left(points, (key, -1))
    return points[at % len(points)][1]
