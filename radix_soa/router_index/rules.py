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
import math
from dataclasses import dataclass, fields, replace
from typing import Any, Optional

import numpy as np

from .._input.validate import check_int

__all__ = ["cache_aware_choice", "kv_overlap_choice", "least_loaded_choice",
           "shortest_queue", "prefix_key", "ring_key", "ring_points", "prefix_hash_choice",
           "mix64", "CACHE_AWARE_DEFAULTS", "ClusterOptions", "LOADS"]

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

    Parameters
    ----------
    lengths : list of int
        Per worker, the tokens of the request it caches.
    outstanding : list of int
        Per worker, the requests it is serving.
    processed : list of int
        Per worker, the requests routed to it so far.
    length : int
        The request's tokens.
    cache_threshold : float
        The fraction of ``length`` the best match must exceed for a hit.
    balance_abs_threshold : int
        How far apart ``outstanding`` may be before balancing.
    balance_rel_threshold : float
        And by what ratio.
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
    blocks + the request's own).

    Parameters
    ----------
    overlap : int
        The request's tokens the worker caches.
    queued : int
        The worker's queued prefill tokens.
    active : int
        The worker's active decode blocks.
    inputs : int
        The request's input tokens.
    tokens_per_block : int
        Tokens per KV block.
    own_blocks : int
        The request's own decode blocks.
    weight : float
        The prefill term's weight.
    """
    prefill = queued + inputs - min(overlap, inputs)
    return weight * (prefill / tokens_per_block) + (active + own_blocks)


def kv_overlap_choice(overlaps, queued, active, inputs, tokens_per_block, own_blocks=0,
                      weight=1.0, start=0):
    """NVIDIA Dynamo's KV-router pick (temperature 0): the position of the
    lowest ``kv_overlap_cost``, ties to the first in the order ``start,
    start + 1, ...`` (mod n). ``overlaps`` are tokens each worker caches of
    the request; ``queued`` and ``active`` its load.

    Parameters
    ----------
    overlaps : list of int
        Per worker, the request's tokens it caches.
    queued : list of int
        Per worker, its queued prefill tokens.
    active : list of int
        Per worker, its active decode blocks.
    inputs : int
        The request's input tokens.
    tokens_per_block : int
        Tokens per KV block.
    own_blocks : int
        The request's own decode blocks.
    weight : float
        The prefill term's weight.
    start : int
        The position ties are broken from.
    """
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


LOADS = ("requests", "tokens")


def _number(name, value, low, high=math.inf, low_open=False):
    """``value`` as a float in ``[low, high]`` (``(low, high]`` when
    ``low_open``), or TypeError/ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number; got {type(value).__name__} {value!r}")
    v = float(value)
    ok = (v > low if low_open else v >= low) and v <= high  # NaN fails
    if not ok or (high == math.inf and math.isinf(v)):
        lo = "(" if low_open else "["
        hi = "inf)" if high == math.inf else f"{high:g}]"
        raise ValueError(f"{name} must be in {lo}{low:g}, {hi}; got {value!r}")
    return v


@dataclass(frozen=True)
class ClusterOptions:
    """The router and service-time options of ``replay_cluster`` (see the
    module docstring for what each means), checked when made: TypeError or
    ValueError naming the option.

    >>> ClusterOptions(slots=4).slots, ClusterOptions().cache_threshold
    (4, 0.5)
    >>> ClusterOptions(load="bytes")
    Traceback (most recent call last):
    ...
    ValueError: load must be one of requests, tokens; got 'bytes'
    """

    seed: int = 0
    slots: int = 32
    prefill_rate: float = 10_000.0
    decode_rate: float = 50.0
    arrival_rate: Optional[float] = None
    load: str = "requests"
    prefix_pages: int = 4
    vnodes: int = 64
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.1
    max_tree_size: Optional[int] = None
    eviction_interval: Optional[float] = 30.0
    overlap_score_weight: float = 1.0

    def __post_init__(self):
        if not isinstance(self.load, str) or self.load not in LOADS:
            raise ValueError(f"load must be one of {', '.join(LOADS)}; got {self.load!r}")
        checked = dict(
            seed=check_int("seed", self.seed, minimum=0, maximum=2**63 - 1),
            slots=check_int("slots", self.slots, minimum=1, maximum=1 << 20),
            prefill_rate=_number("prefill_rate", self.prefill_rate, 0.0, low_open=True),
            decode_rate=_number("decode_rate", self.decode_rate, 0.0, low_open=True),
            arrival_rate=(None if self.arrival_rate is None
                          else _number("arrival_rate", self.arrival_rate, 0.0, low_open=True)),
            prefix_pages=check_int("prefix_pages", self.prefix_pages, minimum=1),
            vnodes=check_int("vnodes", self.vnodes, minimum=1, maximum=1 << 16),
            cache_threshold=_number("cache_threshold", self.cache_threshold, 0.0, 1.0),
            balance_abs_threshold=check_int("balance_abs_threshold",
                                            self.balance_abs_threshold, minimum=0),
            balance_rel_threshold=_number("balance_rel_threshold", self.balance_rel_threshold,
                                          1.0),
            max_tree_size=(None if self.max_tree_size is None
                           else check_int("max_tree_size", self.max_tree_size, minimum=0)),
            eviction_interval=(None if self.eviction_interval is None
                               else _number("eviction_interval", self.eviction_interval, 0.0)),
            overlap_score_weight=_number("overlap_score_weight", self.overlap_score_weight, 0.0))
        for name, value in checked.items():  # the checked values (ints as int, ...)
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, options: Optional["ClusterOptions"] = None,
           **changes: Any) -> "ClusterOptions":
        """``options`` (default: the defaults) with ``changes`` made, each
        named as a field; an unknown name is a TypeError.

        >>> ClusterOptions.of(ClusterOptions(slots=4), seed=2)
        ClusterOptions(seed=2, slots=4, ...)
        """
        base = cls() if options is None else options
        if not isinstance(base, cls):
            raise TypeError(f"options must be a ClusterOptions; got {type(base).__name__}")
        unknown = sorted(set(changes) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"unknown cluster option {unknown[0]!r}; the options are "
                            f"{', '.join(f.name for f in fields(cls))}")
        return replace(base, **changes) if changes else base

    def __repr__(self) -> str:
        changed = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                   if getattr(self, f.name) != f.default]
        return f"ClusterOptions({', '.join(changed + ['...'] if changed else [])})"
