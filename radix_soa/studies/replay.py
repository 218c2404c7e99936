"""Replaying request traces against a prefix cache: hit rates, saved
prefill, evictions and the index's memory, in one compiled call per replay.

>>> from radix_soa.studies import workloads
>>> seqs = workloads.shared_prefix(n_sequences=200, n_prompts=4, prompt_len=400, tail_len=(20, 50))
>>> full = replay(seqs)                  # unbounded: every repeated prompt token hits
>>> small = replay(seqs, capacity=1000)  # LRU under a capacity
>>> full.requests, round(full.hit_rate, 2), small.hit_rate < full.hit_rate
(200, 0.9, True)
>>> table = sweep(seqs, [500, 1000, 2000])
>>> [row["capacity"] for row in table.rows]
[500, 1000, 2000]
"""

import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional

import numpy as np

from .._kernels import replay as replay_kernels
from .._tree.storage import TreeStorage, resume
from .._kernels.layout import M_POLICY
from .._input.validate import check_int, check_policy
from .runs import (SweepProgress, TraceLike, as_trace, check_warmup, namespace_roots,
                   readonly_int64, run_replays, scored_from)

__all__ = ["replay", "sweep", "ReplayResult", "SweepResult", "SCHEDULES"]

SCHEDULES = {
    "fcfs": replay_kernels.POLICY_FCFS,
    "lpm": replay_kernels.POLICY_LPM,
    "dfs": replay_kernels.POLICY_DFS,
}
DEFAULT_WINDOW = 64



@dataclass
class ReplayResult:
    """What a replay measured.

    Units: names ending in ``_ids`` count the trace's ids (one id per block
    of ``block_size`` tokens: 512-token blocks on Mooncake, tokens on token
    traces); names ending in ``_tokens`` count real prompt tokens.

    Scope: the per-request measures (``total_ids``, ``hit_ids``,
    ``host_hit_ids``, ``request_hit_rate``, ``prefill_tokens*`` and every
    rate) count the ``scored_requests`` after the ``warmup`` share of
    arrivals; the cache measures (``rejected``, ``evicted_ids``,
    ``peak_ids``, ``final_ids``, index bytes, ``seconds``) cover the whole
    replay. ``hits``/``host_hits`` hold every request, in arrival order.

    >>> r = replay([[1, 2, 3], [1, 2, 4], [1, 2, 3]], warmup=0.5)
    >>> r.scored_requests, r.hit_ids, r.total_ids, r.hits.tolist()
    (2, 5, 6, [0, 2, 3])
    """

    requests: int
    capacity: Optional[int]
    host_capacity: Optional[int]
    page_size: int
    schedule: str
    window: int
    block_size: int
    total_ids: int
    hit_ids: int
    host_hit_ids: int
    request_hit_rate: float
    prefill_tokens: int
    prefill_tokens_saved: int
    rejected: int
    evicted_ids: int
    host_evicted_ids: int
    peak_ids: int
    final_ids: int
    peak_index_bytes: int
    final_index_bytes: int
    seconds: float
    hits: np.ndarray = field(repr=False)
    host_hits: np.ndarray = field(repr=False)
    order: np.ndarray = field(repr=False)
    prefill_tokens_hit: int = 0
    warmup: float = 0.0
    scored_requests: Optional[int] = None

    def __post_init__(self) -> None:
        if self.scored_requests is None:
            self.scored_requests = self.requests

    @property
    def hit_rate(self) -> float:
        """Device hit ids / all ids of the scored requests (a block hit
        rate on block traces)."""
        return self.hit_ids / self.total_ids if self.total_ids else 0.0

    @property
    def token_hit_rate(self) -> float:
        """Prompt tokens served by the device cache / all prompt tokens of
        the scored requests, a request's hit weighing ``min(hits x
        block_size, input tokens)`` (kvcache-simulator's definition; equal
        to ``hit_rate`` on token traces)."""
        return self.prefill_tokens_hit / self.prefill_tokens if self.prefill_tokens else 0.0

    @property
    def host_hit_rate(self) -> float:
        """Ids loaded back from the host tier / all ids of the scored requests."""
        return self.host_hit_ids / self.total_ids if self.total_ids else 0.0

    @property
    def combined_hit_rate(self) -> float:
        """``hit_rate + host_hit_rate``: ids not recomputed."""
        return self.hit_rate + self.host_hit_rate

    @property
    def prefill_saved_fraction(self) -> float:
        """Prompt tokens not recomputed (device and host hits) / all prompt
        tokens of the scored requests."""
        return self.prefill_tokens_saved / self.prefill_tokens if self.prefill_tokens else 0.0

    def summary(self) -> Dict[str, Any]:
        """The scalar results as a dict (per-request arrays left out), under
        the current names.

        >>> sorted(k for k in replay([[1, 2], [1, 3]]).summary() if k.endswith("_ids"))[:3]
        ['evicted_ids', 'final_ids', 'hit_ids']
        """
        out = {k: v for k, v in self.__dict__.items() if not isinstance(v, np.ndarray)}
        out.update(hit_rate=self.hit_rate, token_hit_rate=self.token_hit_rate,
                   host_hit_rate=self.host_hit_rate, combined_hit_rate=self.combined_hit_rate,
                   prefill_saved_fraction=self.prefill_saved_fraction)
        return out


def replay(trace: TraceLike, capacity: Optional[int] = None, page_size: int = 1,
           host_capacity: Optional[int] = None, schedule: str = "fcfs",
           window: int = DEFAULT_WINDOW, eviction_policy: str = "lru",
           warmup: float = 0.0) -> ReplayResult:
    """Replay ``trace`` against a prefix cache of ``capacity`` ids.

    ``trace``: a ``radix_soa.studies.traces.Trace`` (its namespaces are kept apart)
    or anything ``radix_soa.pack`` takes (one namespace). ``capacity`` is in
    the trace's id units (tokens, or blocks for block-hash traces);
    ``None`` means unbounded. ``host_capacity`` likewise, except that
    ``None`` means no host tier (give a large number for an unbounded one).

    Each request, in the order ``schedule`` picks, is handled like
    ``PrefixCache.match`` then ``PrefixCache.insert``:

    - **hit definition**: the request's device hit is the length of the
      longest prefix (whole pages) of its ids already in the device cache
      when it is scheduled; with a host tier, ids beyond that prefix found in
      the host tier count as host hits (loaded back rather than recomputed).
      ``hit_rate`` = device hits / all ids; ``request_hit_rate`` = share of
      requests with any device hit; ``prefill_tokens_hit`` converts device
      hits to prompt tokens (``min(hits * block_size, input tokens)`` per
      request; ``token_hit_rate`` is its share of the prompt tokens) and
      ``prefill_tokens_saved`` does the same with device + host hits.
    - **scoring**: ``warmup`` (in [0, 1)) is the share of requests, first in
      arrival order, that are replayed to warm the cache but not scored;
      ``warmup=0.5`` with ``token_hit_rate`` is kvcache-simulator's score.
    - then the request is inserted; the cache first evicts leaf tails in the
      order of ``eviction_policy`` (``"lru"`` by default; any policy of
      ``PrefixCache``: priorities are all 0 in a replay) to stay within ``capacity`` (never the request's own
      prefix); a request whose new ids cannot fit even then is not cached at
      all (``rejected``), so hit rates are 0 below the largest request's new
      ids (simulators that admit single blocks differ there).
    - ``hits[i]`` and ``host_hits[i]`` belong to request ``i`` in arrival
      order; ``order`` is the order the schedule ran them in.
    - **host tier**: what the device evicts is inserted (with its whole
      prefix) into a second LRU cache of ``host_capacity``, whose own
      evictions are dropped.

    ``schedule``: ``"fcfs"`` (arrival order), ``"lpm"`` (of the ``window``
    oldest waiting requests, the one with the longest device match runs
    next) or ``"dfs"`` (arrival order cut into windows of ``window``
    requests, each run in depth-first order of its prefix trie, so requests
    sharing a prefix run back to back).
    """
    tr = as_trace(trace)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}; got {schedule!r}")
    page = check_int("page_size", page_size, minimum=1)
    window = check_int("window", window, minimum=1)
    policy = check_policy(eviction_policy)
    warmup = check_warmup(warmup)
    cap = -1 if capacity is None else check_int("capacity", capacity, minimum=0)
    hcap = -1 if host_capacity is None else check_int("host_capacity", host_capacity, minimum=0)
    has_host = host_capacity is not None
    n = len(tr)
    if n == 0:
        raise ValueError("cannot replay an empty trace")
    flat = readonly_int64(tr.flat)
    offsets = readonly_int64(tr.offsets)
    lengths = np.diff(offsets)
    max_len = int(lengths.max())

    t0 = time.perf_counter()
    dev = TreeStorage(np.int64, values=has_host, track=True, page_size=page,
                      token_capacity=_token_room(lengths, cap, max_len))
    dev.meta[M_POLICY] = policy
    host = TreeStorage(np.int64, values=False, track=True, page_size=page,
                       token_capacity=_token_room(lengths, hcap, max_len) if has_host else 0)
    roots_d, roots_h = namespace_roots(dev, tr.namespace), namespace_roots(host, tr.namespace)
    positions = readonly_int64(np.arange(flat.shape[0], dtype=np.int64) if has_host else flat[:0])
    order = np.arange(n, dtype=np.int64)
    if schedule == "dfs":
        replay_kernels.dfs_order(
            flat, offsets, np.ascontiguousarray(tr.namespace, dtype=np.int64), window, order
        )
    slots = min(window, n)  # a window wider than the trace is the whole trace
    win = np.full(slots, -1, np.int64)
    params = np.zeros(replay_kernels.PARAMS_SIZE, np.int64)
    params[replay_kernels.P_PAGE] = page
    params[replay_kernels.P_CAPACITY] = cap
    params[replay_kernels.P_HOST_CAPACITY] = hcap
    params[replay_kernels.P_HOST] = int(has_host)
    params[replay_kernels.P_POLICY] = SCHEDULES[schedule]
    params[replay_kernels.P_WINDOW] = slots
    params[replay_kernels.P_MAX_LEN] = max_len
    state = np.zeros(replay_kernels.STATE_SIZE, np.int64)
    hits = np.zeros(n, np.int64)
    host_hits = np.zeros(n, np.int64)
    rejected = np.zeros(n, np.bool_)
    evict_out = np.empty(max_len if has_host else 0, np.int64)
    peak_bytes = [0]

    def run():
        status = replay_kernels.replay_run(
            dev.arrays,
            host.arrays,
            roots_d,
            roots_h,
            flat,
            offsets,
            positions,
            order,
            win,
            params,
            state,
            hits,
            host_hits,
            rejected,
            evict_out,
        )
        # index bytes are measured at every stop (the arrays only grow in between)
        peak_bytes[0] = max(peak_bytes[0], _used(dev) + (_used(host) if has_host else 0))
        return status

    resume(run, (dev, host))
    index_bytes = _used(dev) + (_used(host) if has_host else 0)
    seconds = time.perf_counter() - t0

    bs = int(tr.block_size)
    first = scored_from(n, warmup)
    inputs = np.asarray(tr.input_tokens, dtype=np.int64)[first:]
    dev_hits, all_hits = hits[first:], hits[first:] + host_hits[first:]
    return ReplayResult(
        requests=n, capacity=capacity, host_capacity=host_capacity, page_size=page,
        schedule=schedule, window=window, block_size=bs, total_ids=int(lengths[first:].sum()),
        hit_ids=int(dev_hits.sum()), host_hit_ids=int(host_hits[first:].sum()),
        request_hit_rate=float((dev_hits > 0).mean()), prefill_tokens=int(inputs.sum()),
        prefill_tokens_saved=int(np.minimum(all_hits * bs, inputs).sum()),
        rejected=int(rejected.sum()),
        evicted_ids=int(state[replay_kernels.S_INSERTED]) - dev.count("tokens"),
        host_evicted_ids=int(state[replay_kernels.S_HOST_INSERTED]) - host.count("tokens"),
        peak_ids=int(state[replay_kernels.S_PEAK]), final_ids=dev.count("tokens"),
        peak_index_bytes=peak_bytes[0], final_index_bytes=index_bytes,
        seconds=seconds, hits=hits, host_hits=host_hits, order=order,
        prefill_tokens_hit=int(np.minimum(dev_hits * bs, inputs).sum()), warmup=warmup,
        scored_requests=n - first)


def _token_room(lengths, cap, max_len):
    """The token buffer a tier starts with: every id of the trace when it is
    unbounded (``cap`` -1), else room for twice what it may hold. Growing
    by doubling copied the buffer about as many times as it has bytes and
    took half of a long trace's replay (the new pages are also touched by
    the copy); an allocation is only address space until written (NumPy
    zeros are lazily mapped), and dead runs still compact it when it fills
    (``TreeStorage.reserve``)."""
    total = int(lengths.sum())
    return total if cap < 0 else min(total, 2 * (cap + max_len))


def _used(store):
    return store.memory_report()["used_bytes"]


@dataclass
class SweepResult:
    """Replays of one trace over several capacities: ``rows`` (one dict per
    capacity) and the ``results`` themselves."""

    results: List[ReplayResult]

    COLUMNS = ("capacity", "hit_rate", "token_hit_rate", "host_hit_rate", "request_hit_rate",
               "prefill_saved_fraction", "evicted_ids", "rejected", "peak_index_bytes",
               "seconds")

    @property
    def rows(self) -> List[Dict[str, Any]]:
        """One dict of ``COLUMNS`` per capacity."""
        out: List[Dict[str, Any]] = []
        for r in self.results:
            summary = r.summary()
            out.append({c: summary[c] for c in self.COLUMNS})
        return out

    def to_dict(self) -> Dict[str, List[Any]]:
        """Column name -> list of values (ready for ``pandas.DataFrame``)."""
        rows = self.rows
        return {c: [row[c] for row in rows] for c in self.COLUMNS}

    def table(self, capacity_unit: str = "ids", kv_bytes_per_token: Optional[float] = None,
              legend: bool = True) -> str:
        """The table with units and legend (``radix_soa.studies.report.table``)."""
        from .report import table
        return table(self.results, capacity_unit, kv_bytes_per_token, legend)

    def to_csv(self, capacity_unit: str = "ids",
               kv_bytes_per_token: Optional[float] = None) -> str:
        """Every number, one row per capacity (``radix_soa.studies.report.to_csv``)."""
        from .report import to_csv
        return to_csv(self.results, capacity_unit, kv_bytes_per_token)

    def __str__(self) -> str:
        return self.table()


def sweep(trace: TraceLike, capacities: Iterable[Optional[int]], *, threads: Optional[int] = None,
          progress: SweepProgress = None, **kwargs: Any) -> SweepResult:
    """``replay`` at each of ``capacities`` (other arguments as for
    ``replay``), run on ``threads`` threads (default: the CPU count; the
    replay kernel releases the GIL). ``progress`` is called with the number
    of replays done after each one. Returns a ``SweepResult`` in the order
    of ``capacities``.
    """
    tr = as_trace(trace)
    caps = list(capacities)
    if not caps:
        raise ValueError("capacities is empty")
    return SweepResult(run_replays(lambda cap: replay(tr, capacity=cap, **kwargs), caps,
                                   threads, progress))
