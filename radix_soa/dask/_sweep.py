"""Replay sweeps on a Dask cluster: one replay per task, the tables of
``rs.sweep``."""

import functools
import time
from typing import Any, Dict, Hashable, Iterable, List, Optional, Tuple, TypeVar

import distributed

from .._input.validate import check_int
from ..studies.replay import SCHEDULES, SweepResult, replay
from ..studies.runs import SweepProgress, TraceLike, as_trace
from ..studies.traces import Trace
from . import _cluster
from ._sharded import _client

K = TypeVar("K", bound=Hashable)  # the name of a trace


def _capacities(capacities):
    caps = list(capacities)
    if not caps:
        raise ValueError("capacities is empty")
    return [None if c is None else check_int("capacities", c, minimum=0) for c in caps]


def _same(obj):
    return obj


def _run(client, jobs, names, progress, timeout):
    """Gather the futures of ``jobs`` (a list; ``names[i]`` names
    ``jobs[i]``), calling ``progress(done)`` as each finishes, all within
    ``timeout`` seconds; results in the order of ``jobs``."""
    deadline = time.monotonic() + timeout
    if progress is not None:
        try:
            for done, _ in enumerate(distributed.as_completed(jobs, timeout=timeout), 1):
                progress(done)
        except TimeoutError:
            pass  # gather names what is late
    return _cluster.gather(client, jobs, names, max(deadline - time.monotonic(), 0.001),
                           "sweep")


def sweep(trace: TraceLike, capacities: Iterable[Optional[int]], *,
          client: Optional[distributed.Client] = None, progress: SweepProgress = None,
          timeout: float = _cluster.DEFAULT_TIMEOUT, **kwargs: Any) -> SweepResult:
    """``rs.sweep`` on a Dask cluster: one ``replay`` per capacity, each a
    task (the trace is sent to the workers once). ``kwargs`` as for
    ``replay``; ``progress`` is called with the number of replays done.
    Returns the same ``SweepResult`` as ``rs.sweep`` (equal in everything
    but ``seconds``). A replay whose worker dies runs again elsewhere (the
    trace is recomputed if it was lost too); ``timeout``: seconds to wait
    for all of them (``TimeoutError`` naming the replays not done).
    """
    return sweep_many({None: trace}, capacities, client=client, progress=progress,
                      timeout=timeout, **kwargs)[None, kwargs.get("schedule", "fcfs")]


def sweep_many(traces: Dict[K, TraceLike], capacities: Iterable[Optional[int]], *,
               schedules: Optional[Iterable[str]] = None,
               client: Optional[distributed.Client] = None, progress: SweepProgress = None,
               timeout: float = _cluster.DEFAULT_TIMEOUT,
               **kwargs: Any) -> Dict[Tuple[K, str], SweepResult]:
    """``rs.sweep`` of several traces, each under several ``schedules``,
    all as tasks at once: a dict ``{(name, schedule): SweepResult}`` in the
    order of ``traces`` then ``schedules``.

    ``traces``: a dict from a name to a trace (anything ``replay`` takes).
    ``schedules``: a list of ``replay``'s schedules (default: the
    ``schedule`` of ``kwargs``, else ``"fcfs"``). Every argument is checked
    before any task starts; worker deaths and ``timeout`` as for ``sweep``.
    """
    if not isinstance(traces, dict) or not traces:
        raise TypeError("traces must be a non-empty dict from a name to a trace")
    if schedules is None:
        schedules = [kwargs.pop("schedule", "fcfs")]
    elif "schedule" in kwargs:
        raise TypeError("pass schedules= or schedule=, not both")
    schedules = list(schedules)
    for s in schedules:
        if s not in SCHEDULES:
            raise ValueError(f"schedules: each must be one of {sorted(SCHEDULES)}; got {s!r}")
    caps = _capacities(capacities)
    timeout = _cluster.check_timeout(timeout)
    prepared = {name: as_trace(t) for name, t in traces.items()}
    # the other arguments, checked here by a replay of one short request
    replay(Trace.from_sequences([[0]]), capacity=caps[0], schedule=schedules[0], **kwargs)
    client = _client(client)
    # a task, not a scatter: a trace lost with its worker is recomputed from
    # the graph (scattered data has no lineage); pure=False: a unique key
    sent = {name: client.submit(_same, t, pure=False) for name, t in prepared.items()}
    keys, jobs, names = [], [], []
    for name, trace in sent.items():
        for schedule in schedules:
            for cap in caps:
                one = functools.partial(replay, capacity=cap, schedule=schedule, **kwargs)
                keys.append((name, schedule))
                names.append(f"the replay of {'the trace' if name is None else repr(name)} "
                             f"({schedule}, capacity {cap})")
                jobs.append(client.submit(one, trace, pure=False))
    results = _run(client, jobs, names, progress, timeout)
    out: Dict[Tuple[K, str], List[Any]] = {}
    for key, r in zip(keys, results):
        out.setdefault(key, []).append(r)
    return {key: SweepResult(rs) for key, rs in out.items()}
