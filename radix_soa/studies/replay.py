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

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .._kernels import replay as KR
from .._storage import TreeStorage, resume
from .._kernels.layout import M_POLICY
from .._validate import check_int, check_policy
from ..batch import as_batches, pack
from .traces import Trace

__all__ = ["replay", "sweep", "ReplayResult", "SweepResult", "SCHEDULES"]

SCHEDULES = {"fcfs": KR.POLICY_FCFS, "lpm": KR.POLICY_LPM, "dfs": KR.POLICY_DFS}
DEFAULT_WINDOW = 64


@dataclass
class ReplayResult:
    """What a replay measured. Token counts are in the trace's id units
    (blocks for block-hash traces, tokens for token traces) unless the name
    says ``prefill``; ``block_size`` converts."""

    requests: int
    capacity: object
    host_capacity: object
    page_size: int
    schedule: str
    window: int
    block_size: int
    total_tokens: int
    hit_tokens: int
    host_hit_tokens: int
    request_hit_rate: float
    prefill_tokens: int
    prefill_tokens_saved: int
    rejected: int
    evicted_tokens: int
    host_evicted_tokens: int
    peak_tokens: int
    final_tokens: int
    peak_index_bytes: int
    final_index_bytes: int
    seconds: float
    hits: np.ndarray = field(repr=False)
    host_hits: np.ndarray = field(repr=False)
    order: np.ndarray = field(repr=False)

    @property
    def hit_rate(self):
        """Device hits / all request tokens (ids)."""
        return self.hit_tokens / self.total_tokens if self.total_tokens else 0.0

    @property
    def host_hit_rate(self):
        """Tokens loaded back from the host tier / all request tokens."""
        return self.host_hit_tokens / self.total_tokens if self.total_tokens else 0.0

    @property
    def combined_hit_rate(self):
        return self.hit_rate + self.host_hit_rate

    @property
    def prefill_saved_fraction(self):
        return self.prefill_tokens_saved / self.prefill_tokens if self.prefill_tokens else 0.0

    def summary(self):
        """The scalar results as a dict (per-request arrays left out)."""
        out = {k: v for k, v in self.__dict__.items() if not isinstance(v, np.ndarray)}
        out.update(hit_rate=self.hit_rate, host_hit_rate=self.host_hit_rate,
                   combined_hit_rate=self.combined_hit_rate,
                   prefill_saved_fraction=self.prefill_saved_fraction)
        return out


def _as_trace(trace):
    """A ``Trace`` as is; any batch input as a one-namespace token trace."""
    if isinstance(trace, Trace):
        return trace
    batches = as_batches(trace)
    if len(batches) != 1:
        batches = [pack([s for b in batches for s in b])]
    b = batches[0]
    n = len(b)
    flat = b.flat.astype(np.int64, copy=False)
    return Trace(name="sequences", flat=flat, offsets=b.offsets, timestamps=np.zeros(n),
                 input_tokens=b.lengths.astype(np.int64), output_tokens=np.zeros(n, np.int64),
                 namespace=np.zeros(n, np.int64), block_size=1)


def replay(trace, capacity=None, page_size=1, host_capacity=None, schedule="fcfs",
           window=DEFAULT_WINDOW, eviction_policy="lru"):
    """Replay ``trace`` against a prefix cache of ``capacity`` tokens.

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
      requests with any device hit; ``prefill_tokens_saved`` converts hits to
      tokens (``hits * block_size``, at most each request's input tokens).
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
    tr = _as_trace(trace)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}; got {schedule!r}")
    page = check_int("page_size", page_size, minimum=1)
    window = check_int("window", window, minimum=1)
    policy = check_policy(eviction_policy)
    cap = -1 if capacity is None else check_int("capacity", capacity, minimum=0)
    hcap = -1 if host_capacity is None else check_int("host_capacity", host_capacity, minimum=0)
    has_host = host_capacity is not None
    n = len(tr)
    if n == 0:
        raise ValueError("cannot replay an empty trace")
    flat = np.ascontiguousarray(tr.flat, dtype=np.int64)
    offsets = np.ascontiguousarray(tr.offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    max_len = int(lengths.max())

    t0 = time.perf_counter()
    dev = TreeStorage(np.int64, values=has_host, track=True, page_size=page)
    dev.meta[M_POLICY] = policy
    host = TreeStorage(np.int64, values=False, track=True, page_size=page)
    roots_d, roots_h = _roots(dev, tr.namespace), _roots(host, tr.namespace)
    positions = np.arange(flat.shape[0], dtype=np.int64) if has_host else flat[:0]
    order = np.arange(n, dtype=np.int64)
    if schedule == "dfs":
        KR.dfs_order(flat, offsets, np.ascontiguousarray(tr.namespace, dtype=np.int64), window,
                     order)
    slots = min(window, n)  # a window wider than the trace is the whole trace
    win = np.full(slots, -1, np.int64)
    params = np.zeros(KR.PARAMS_SIZE, np.int64)
    params[KR.P_PAGE] = page
    params[KR.P_CAPACITY] = cap
    params[KR.P_HOST_CAPACITY] = hcap
    params[KR.P_HOST] = int(has_host)
    params[KR.P_POLICY] = SCHEDULES[schedule]
    params[KR.P_WINDOW] = slots
    params[KR.P_MAX_LEN] = max_len
    state = np.zeros(KR.STATE_SIZE, np.int64)
    hits = np.zeros(n, np.int64)
    host_hits = np.zeros(n, np.int64)
    rejected = np.zeros(n, np.bool_)
    evict_out = np.empty(max_len if has_host else 0, np.int64)
    peak_bytes = [0]

    def run():
        status = KR.replay_run(dev.T, host.T, roots_d, roots_h, flat, offsets, positions, order,
                               win, params, state, hits, host_hits, rejected, evict_out)
        # index bytes are measured at every stop (the arrays only grow in between)
        peak_bytes[0] = max(peak_bytes[0], _used(dev) + (_used(host) if has_host else 0))
        return status

    resume(run, (dev, host))
    index_bytes = _used(dev) + (_used(host) if has_host else 0)
    seconds = time.perf_counter() - t0

    total = int(lengths.sum())
    bs = int(tr.block_size)
    inputs = np.asarray(tr.input_tokens, dtype=np.int64)
    saved = np.minimum((hits + host_hits) * bs, inputs)
    return ReplayResult(
        requests=n, capacity=capacity, host_capacity=host_capacity, page_size=page,
        schedule=schedule, window=window, block_size=bs, total_tokens=total,
        hit_tokens=int(hits.sum()), host_hit_tokens=int(host_hits.sum()),
        request_hit_rate=float((hits > 0).mean()), prefill_tokens=int(inputs.sum()),
        prefill_tokens_saved=int(saved.sum()), rejected=int(rejected.sum()),
        evicted_tokens=int(state[KR.S_INSERTED]) - dev.count("tokens"),
        host_evicted_tokens=int(state[KR.S_HOST_INSERTED]) - host.count("tokens"),
        peak_tokens=int(state[KR.S_PEAK]), final_tokens=dev.count("tokens"),
        peak_index_bytes=peak_bytes[0], final_index_bytes=index_bytes,
        seconds=seconds, hits=hits, host_hits=host_hits, order=order)


def _roots(store, namespace):
    """Root id per request: one root per distinct namespace."""
    uniq, inverse = np.unique(np.asarray(namespace, dtype=np.int64), return_inverse=True)
    ids = np.array([store.root] + [store.new_root(i) for i in range(1, len(uniq))], np.int64)
    return ids[inverse]


def _used(store):
    return store.memory_report()["used_bytes"]


@dataclass
class SweepResult:
    """Replays of one trace over several capacities: ``rows`` (one dict per
    capacity) and the ``results`` themselves."""

    results: list

    COLUMNS = ("capacity", "hit_rate", "host_hit_rate", "request_hit_rate",
               "prefill_saved_fraction", "evicted_tokens", "rejected", "peak_index_bytes",
               "seconds")

    @property
    def rows(self):
        out = []
        for r in self.results:
            summary = r.summary()
            out.append({c: summary[c] for c in self.COLUMNS})
        return out

    def to_dict(self):
        """Column name -> list of values (ready for ``pandas.DataFrame``)."""
        rows = self.rows
        return {c: [row[c] for row in rows] for c in self.COLUMNS}

    def __str__(self):
        head = ["capacity", "hit rate", "host hits", "req. hit", "prefill saved", "evicted",
                "rejected", "index bytes", "ms"]
        lines = ["  ".join(f"{h:>13}" for h in head)]
        for r in self.rows:
            cap = "unbounded" if r["capacity"] is None else f"{r['capacity']:,}"
            cells = [cap, f"{r['hit_rate']:.4f}", f"{r['host_hit_rate']:.4f}",
                     f"{r['request_hit_rate']:.4f}", f"{r['prefill_saved_fraction']:.4f}",
                     f"{r['evicted_tokens']:,}", f"{r['rejected']:,}",
                     f"{r['peak_index_bytes']:,}", f"{r['seconds'] * 1e3:.1f}"]
            lines.append("  ".join(f"{c:>13}" for c in cells))
        return "\n".join(lines)


def sweep(trace, capacities, *, threads=None, progress=None, **kwargs):
    """``replay`` at each of ``capacities`` (other arguments as for
    ``replay``), run on ``threads`` threads (default: the CPU count; the
    replay kernel releases the GIL). ``progress`` is called with the number
    of replays done after each one. Returns a ``SweepResult`` in the order
    of ``capacities``.
    """
    tr = _as_trace(trace)
    caps = list(capacities)
    if not caps:
        raise ValueError("capacities is empty")
    if threads is None:
        threads = min(len(caps), os.cpu_count() or 1)
    threads = check_int("threads", threads, minimum=1, maximum=1024)
    done = [0]

    def one(cap):
        r = replay(tr, capacity=cap, **kwargs)
        done[0] += 1
        if progress is not None:
            progress(done[0])
        return r

    if threads <= 1:
        return SweepResult([one(c) for c in caps])
    with ThreadPoolExecutor(threads) as pool:
        return SweepResult(list(pool.map(one, caps)))
