"""The capacity study behind ``radix-soa study``: "how much prefill would a
prefix cache of this size save on this traffic, and what does the index
cost?", as data a notebook can use (the command line only prints it).

>>> st = capacity_study(generated_trace("chat", 200, seed=0)[0], points=3)
>>> len(st.sweep.results), st.capacities[-1] == st.footprint
(3, True)
>>> st.memory["distinct_requests"] <= 200
True
"""

import math
from dataclasses import dataclass

import numpy as np

from ..radix_cache import RadixCache
from . import workloads
from .replay import replay, sweep

__all__ = ["DEFAULT_WORKLOAD", "DEFAULT_REQUESTS", "DEFAULT_POINTS", "SMALLEST_FRACTION",
           "generated_trace", "default_capacities", "namespaced_ids", "index_memory",
           "capacity_study", "CapacityStudy"]

DEFAULT_WORKLOAD = "multi_turn"
DEFAULT_REQUESTS = 2000
DEFAULT_POINTS = 10
#: The smallest capacity of the default sweep, as a fraction of the footprint.
SMALLEST_FRACTION = 1 / 32

# How ``--requests N`` maps onto each generator. Generators that count
# requests take N directly; the session-based ones (whose requests interleave
# in time) are asked for enough sessions and the first N requests to arrive
# are kept. The number is an initial guess of requests per session.
REQUEST_PARAM = {
    "chat": ("n_sequences", None),
    "few_shot": ("n_requests", None),
    "long_prefix": ("n_sequences", None),
    "multi_turn": ("n_conversations", 7),   # turns (2, 12) -> about 7 requests each
    "agent": ("n_sessions", 36),            # steps (5, 40) plus forked sub-agent steps
}


def generated_trace(name, requests, seed):
    """``requests`` requests of built-in workload ``name`` as a Trace, plus
    a description of how they were made."""
    param, per_session = REQUEST_PARAM[name]
    gen = workloads.GENERATORS[name]
    if per_session is None:
        kwargs = {param: requests, "seed": seed}
        seqs = workloads.generate(name, **kwargs)
        trace = workloads.as_trace(seqs, name, seed=seed)
    else:
        units = max(1, math.ceil(requests / per_session))
        while True:
            kwargs = {param: units, "seed": seed}
            seqs, meta = workloads.generate(name, return_meta=True, **kwargs)
            if len(seqs) >= requests:
                break
            units *= 2
        trace = workloads.as_trace(seqs[:requests], name, seed=seed,
                                   timestamps=meta["time"][:requests])
    desc = {"source": "workload", "workload": name, "generator": gen.__name__,
            "generator_args": kwargs, "seed": seed}
    if per_session is not None:
        desc["note"] = f"the first {requests} requests to arrive of {len(seqs)} generated"
    return trace, desc


def default_capacities(footprint, points=DEFAULT_POINTS):
    """``points`` capacities spaced geometrically from ``footprint / 32`` to
    ``footprint`` (rounded, distinct, at least 1).

    >>> default_capacities(3200, 6)
    [100, 200, 400, 800, 1600, 3200]
    >>> default_capacities(3, 10)
    [1, 2, 3]
    """
    footprint = int(footprint)
    if footprint <= 0:
        return [0]
    if points == 1:
        return [footprint]
    grid = np.geomspace(footprint * SMALLEST_FRACTION, footprint, points)
    caps = {max(1, int(round(c))) for c in grid}
    caps.add(footprint)
    return sorted(caps)


_NS_SHIFT = 40


def namespaced_ids(trace):
    """The trace's ids made distinct across namespaces, and how.

    One namespace: the ids as they are. Several: ``id + (namespace << 40)``
    when every id and namespace fits, else each distinct ``(namespace, id)``
    pair renumbered densely. Either keeps the prefix structure within a
    namespace and shares nothing across namespaces.
    """
    flat, ns = trace.flat, trace.namespace
    uniq = np.unique(ns)
    if uniq.size <= 1:
        return flat, None
    per_id = np.repeat(ns, np.diff(trace.offsets))
    if flat.min() >= 0 and flat.max() < (1 << _NS_SHIFT) and 0 <= uniq[0] and \
            uniq[-1] < (1 << (62 - _NS_SHIFT)):
        return flat + (per_id << _NS_SHIFT), f"ids offset by namespace << {_NS_SHIFT}"
    pairs = np.stack([per_id, flat], axis=1)
    _, dense = np.unique(pairs, axis=0, return_inverse=True)
    return dense.reshape(-1).astype(np.int64), "each (namespace, id) pair renumbered"


def index_memory(trace):
    """memory_report of a RadixCache holding every request of ``trace``."""
    flat, how = namespaced_ids(trace)
    rc = RadixCache()
    rc.insert_batch((flat, trace.offsets))
    report = rc.memory_report()
    report["requests_inserted"] = len(trace)
    report["distinct_requests"] = len(rc)
    report["namespaces"] = int(np.unique(trace.namespace).size)
    report["namespace_handling"] = how
    return report


@dataclass
class CapacityStudy:
    """What ``capacity_study`` measured: the ``unbounded`` replay, its peak
    ``footprint`` (ids), the ``capacities`` swept, the ``sweep`` itself and
    the index ``memory`` report of a tree holding every request."""

    unbounded: object
    footprint: int
    capacities: list
    sweep: object
    memory: dict


def capacity_study(trace, capacities=None, points=DEFAULT_POINTS, progress=None, **replay_args):
    """Replay ``trace`` unbounded, then at each of ``capacities`` (default:
    ``points`` capacities from 1/32 of the unbounded footprint to all of
    it), and measure the index's memory. ``progress(done, total)`` is called
    as replays finish; ``replay_args`` go to ``replay``."""
    report = progress or (lambda done, total: None)
    n_caps = len(capacities) if capacities else points
    unbounded = replay(trace, **replay_args)
    report(1, 1 + n_caps)
    footprint = unbounded.peak_ids
    caps = list(capacities) if capacities else default_capacities(footprint, points)
    report(1, 1 + len(caps))
    result = sweep(trace, caps, progress=lambda k: report(1 + k, 1 + len(caps)), **replay_args)
    return CapacityStudy(unbounded=unbounded, footprint=footprint, capacities=caps, sweep=result,
                         memory=index_memory(trace))
