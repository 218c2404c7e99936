"""A trace replayed over N workers behind a router: how much prefill
cache-aware routing saves over round robin, and at what load imbalance.

>>> from radix_soa.studies import workloads
>>> seqs = workloads.shared_prefix(n_sequences=400, n_prompts=8, prompt_len=300, tail_len=(20, 50))
>>> rr = replay_cluster(seqs, workers=4, capacity=1000, router="round_robin")
>>> ca = replay_cluster(seqs, workers=4, capacity=1000, router="cache_aware")
>>> rr.assignments[:6].tolist(), ca.hit_rate > rr.hit_rate
([0, 1, 2, 3, 0, 1], True)
>>> table = sweep_cluster(seqs, workers=[1, 4], capacities=[1000], routers=["round_robin"])
>>> [(row["workers"], row["router"]) for row in table.rows]
[(1, 'round_robin'), (4, 'round_robin')]

**Workers.** Each worker has its own prefix cache of ``capacity`` ids and
replays the requests routed to it exactly as ``radix_soa.replay`` (FCFS, no
host tier) replays them: a worker's hits, evictions and peak equal
``replay`` of its share of the trace. One worker is ``replay`` itself.

**Time** (what load means). Requests arrive at the trace's timestamps
(seconds; ``arrival_rate`` replaces them by ``i / arrival_rate``), are routed on
arrival and take their worker's earliest free of ``slots`` slots. A request
computes its uncached prompt tokens at ``prefill_rate`` tokens/s, then
emits its output tokens at ``decode_rate`` tokens/s: it is *in prefill*
until ``first_token`` and *outstanding* until ``finish``. While
outstanding it holds its input + output tokens and its KV blocks (those
tokens in pages of ``page_size`` ids x ``block_size`` tokens). The cache
itself is updated on arrival (as ``replay`` has no time): the model only
decides what the load-aware routers see.

**Routers** (``ROUTERS``):

- ``round_robin``: request ``i`` to worker ``i % workers``.
- ``random``: ``numpy.random.default_rng(seed).integers(0, workers, n)``.
- ``least_loaded``: the fewest outstanding requests (``load="requests"``)
  or tokens (``load="tokens"``), lowest id on ties.
- ``prefix_hash``: consistent hashing of the first ``prefix_pages`` pages
  (and the namespace) onto a ring of ``vnodes`` points per worker, the
  first point clockwise (``ring_points``, ``prefix_hash_route``): requests
  sharing their first pages share a worker, and adding a worker moves only
  about ``1 / workers`` of the keys (as the consistent-hash policies of
  SGLang's gateway and of vLLM's production stack route by a key).
- ``cache_aware``: SGLang's router (``lightseekorg/smg``,
  ``model_gateway/src/policies/cache_aware.rs``, approximate token tree).
  It keeps an *approximate tree* per worker of what it routed there (not
  the worker's cache). If the outstanding request counts are imbalanced
  (``max - min > balance_abs_threshold`` and ``max > min x
  balance_rel_threshold``) it routes to the shortest queue (fewest
  outstanding, then fewest routed so far, then lowest id); otherwise, if
  the longest match over the trees covers more than ``cache_threshold`` of
  the request, to that tree's worker (lowest id on ties), else to the
  shortest queue (smg's header comment says "the smallest tree" there;
  its code takes the min-load worker, as here). The request is then
  recorded in the chosen worker's tree. Every ``eviction_interval`` seconds of trace time each tree is
  trimmed to ``max_tree_size`` ids, least recently routed leaf tails
  first (``0``: after every request; ``None``: never). Defaults are
  smg's (0.5, 32, 1.1, 30 s), except ``max_tree_size`` (smg: 10,000
  tokens), which defaults to the worker ``capacity``. Differences: trees
  are per worker (smg shares one tree with a tenant set per node, which
  matches the same lengths), ties go to the lowest id (smg: whichever
  tenant touched the node last), eviction trims tails by ids (smg removes
  whole nodes), load is the model's outstanding count.
- ``kv_overlap``: NVIDIA Dynamo's KV router (``ai-dynamo/dynamo``,
  ``DefaultWorkerSelector`` in ``lib/kv-router/src/scheduling/selector.rs``,
  earlier ``lib/llm/src/kv_router/scheduler.rs``; temperature 0). Per
  worker, ``overlap`` is the ids of the request the worker's cache holds
  (whole pages), computed here from the worker trees themselves: that is
  exactly what a router index built from the workers' KV events answers
  (its invariant: after a worker's events, its overlap equals that
  worker's ``match_length``). Cost = ``overlap_score_weight`` x prefill
  blocks (the worker's queued prefill tokens + the request's uncached
  ones, in blocks) + decode blocks (the worker's active blocks + the
  request's); the lowest cost wins, ties broken at random (seeded, as
  Dynamo samples among equal logits). Differences: active blocks of
  requests sharing a prefix are counted once each (Dynamo deduplicates),
  and a running request holds its input + output blocks from arrival to
  finish (Dynamo grows them as tokens are generated); the request's own
  blocks are the same on every worker, so they never change the pick.

``load_imbalance`` is the largest worker's busy seconds (the model's
prefill + decode time of its requests) over the mean; ``request_imbalance``
the same for request counts. Both are 1.0 for a perfect split.
"""

import math
import time
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np

from .._kernels import cluster as cluster_kernels
from .._kernels.directory import SLOTS
from .._kernels.layout import M_POLICY
from .._tree.results import InvariantError
from .._tree import storage
from .._tree.storage import TreeStorage, resume
from .._input.validate import check_int, check_policy
from ..router_index.rules import LOADS, ClusterOptions
from .runs import (SweepProgress, TraceLike, as_trace, check_warmup, listed, namespace_roots,
                   readonly_int64, run_replays, scored_from)

__all__ = ["replay_cluster", "sweep_cluster", "ClusterOptions", "ClusterResult", "ClusterSweep",
           "ROUTERS",
           "ring_points", "prefix_hash_route"]

ROUTERS = {"round_robin": cluster_kernels.ROUND_ROBIN, "random": cluster_kernels.RANDOM,
           "least_loaded": cluster_kernels.LEAST_LOADED, "prefix_hash": cluster_kernels.PREFIX_HASH,
           "cache_aware": cluster_kernels.CACHE_AWARE, "kv_overlap": cluster_kernels.KV_OVERLAP}
MAX_WORKERS = 4096



@dataclass
class ClusterResult:
    """What a cluster replay measured. Units and scope as for
    ``ReplayResult``: ``_ids`` fields count trace ids, ``prefill_tokens*``
    prompt tokens; the rates count the requests after ``warmup``; cache
    measures (``evicted_ids``, ``peak_ids``) the whole replay.

    ``assignments``, ``hits``, ``rejected``, ``modes`` (``MODE_*`` of
    ``radix_soa._kernels.cluster``: how ``cache_aware`` decided),
    ``first_token`` and ``finish`` (model seconds) hold every request in
    arrival order. ``per_worker``: column -> one value per worker
    (``requests``, ``total_ids``, ``hit_ids``, ``hit_rate``,
    ``prefill_tokens``, ``prefill_tokens_saved``, ``evicted_ids``,
    ``peak_ids``, ``final_ids``, ``rejected``, ``peak_outstanding``,
    ``busy_seconds``).

    >>> r = replay_cluster([[1, 2], [1, 2], [1, 2], [1, 2]], workers=2, router="round_robin")
    >>> r.assignments.tolist(), r.hits.tolist(), r.per_worker["hit_ids"].tolist()
    ([0, 1, 0, 1], [0, 0, 2, 2], [2, 2])
    """

    workers: int
    router: str
    requests: int
    capacity: Optional[int]
    page_size: int
    block_size: int
    total_ids: int
    hit_ids: int
    prefill_tokens: int
    prefill_tokens_saved: int
    evicted_ids: int
    load_imbalance: float
    request_imbalance: float
    mean_ttft: float
    seconds: float
    assignments: np.ndarray = field(repr=False)
    hits: np.ndarray = field(repr=False)
    rejected: np.ndarray = field(repr=False)
    modes: np.ndarray = field(repr=False)
    first_token: np.ndarray = field(repr=False)
    finish: np.ndarray = field(repr=False)
    per_worker: Dict[str, np.ndarray] = field(repr=False)
    warmup: float = 0.0
    scored_requests: int = 0

    @property
    def hit_rate(self) -> float:
        """Hit ids / all ids of the scored requests, over every worker."""
        return self.hit_ids / self.total_ids if self.total_ids else 0.0

    @property
    def prefill_saved_fraction(self) -> float:
        """Prompt tokens not recomputed / all prompt tokens (scored)."""
        return self.prefill_tokens_saved / self.prefill_tokens if self.prefill_tokens else 0.0

    def summary(self) -> Dict[str, Any]:
        """The scalar results as a dict (per-request and per-worker arrays
        left out).

        >>> s = replay_cluster([[1, 2], [1, 3]], workers=2).summary()
        >>> s["workers"], s["hit_rate"], s["request_imbalance"]
        (2, 0.0, 1.0)
        """
        out = {k: v for k, v in self.__dict__.items()
               if not isinstance(v, (np.ndarray, dict))}
        out.update(hit_rate=self.hit_rate, prefill_saved_fraction=self.prefill_saved_fraction)
        return out


def ring_points(workers: int, vnodes: int) -> Tuple[np.ndarray, np.ndarray]:
    """The consistent-hash ring: ``(points, owner)``, ``vnodes`` points per
    worker (point ``(w, v)`` is splitmix64 of ``w * 2**32 + v``, as int64),
    sorted by (point, worker)."""
    keys = (np.repeat(np.arange(workers, dtype=np.uint64), vnodes) << np.uint64(32)) \
        + np.tile(np.arange(vnodes, dtype=np.uint64), workers)
    pts = _mix64(keys).view(np.int64)
    owner = np.repeat(np.arange(workers, dtype=np.int64), vnodes)
    order = np.lexsort((owner, pts))
    return pts[order], owner[order]


def _mix64(x):
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def prefix_hash_route(hashes: np.ndarray, points: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Worker of each key hash: the owner of the first ring point at or
    after it (wrapping to the first point)."""
    at = np.searchsorted(points, hashes, side="left")
    return owner[np.where(at == len(points), 0, at)]


def _arrivals(tr, arrival_rate):
    n = len(tr)
    if arrival_rate is not None:
        return np.arange(n, dtype=np.float64) / arrival_rate
    t = np.asarray(tr.timestamps, dtype=np.float64)
    if t.shape != (n,) or not np.isfinite(t).all():
        raise ValueError("trace timestamps must be one finite number per request")
    return np.ascontiguousarray(t)


def replay_cluster(trace: TraceLike, workers: int = 8, capacity: Optional[int] = None,
                   router: str = "cache_aware", page_size: int = 1, schedule: str = "fcfs",
                   eviction_policy: str = "lru", warmup: float = 0.0,
                   options: Optional[ClusterOptions] = None, **changes: Any) -> ClusterResult:
    """Replay ``trace`` over ``workers`` prefix caches of ``capacity`` ids
    each (``None``: unbounded), routing every request with ``router``; see
    the module docstring for the workers, the time model and the routers.
    ``trace``, ``capacity``, ``page_size``, ``eviction_policy`` and
    ``warmup`` as for ``radix_soa.replay``; ``schedule`` must be ``"fcfs"``
    (each worker serves its requests in arrival order). The router and
    time-model options are a ``ClusterOptions`` (``options``; ``changes``
    names fields to change in it: ``replay_cluster(t, slots=4)`` is
    ``replay_cluster(t, options=ClusterOptions(slots=4))``). Returns a
    ``ClusterResult``. Every option is checked before anything runs
    (TypeError/ValueError naming it).
    """
    tr = as_trace(trace)
    if schedule != "fcfs":
        raise ValueError(f"schedule must be 'fcfs' for a cluster replay (each worker serves "
                         f"its requests in arrival order); got {schedule!r}")
    if not isinstance(router, str) or router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)}; got {router!r}")
    o = ClusterOptions.of(options, **changes)
    nw = check_int("workers", workers, minimum=1, maximum=MAX_WORKERS)
    page = check_int("page_size", page_size, minimum=1)
    policy = check_policy(eviction_policy)
    warmup = check_warmup(warmup)
    cap = -1 if capacity is None else check_int("capacity", capacity, minimum=0)
    n = len(tr)
    if n == 0:
        raise ValueError("cannot replay an empty trace")
    times = _arrivals(tr, o.arrival_rate)
    kind = ROUTERS[router]
    flat = readonly_int64(tr.flat)
    offsets = readonly_int64(tr.offsets)
    ns = np.ascontiguousarray(tr.namespace, dtype=np.int64)
    inputs = np.ascontiguousarray(tr.input_tokens, dtype=np.int64)
    outputs = np.ascontiguousarray(tr.output_tokens, dtype=np.int64)
    lengths = np.diff(offsets)
    bs = int(tr.block_size)

    t0 = time.perf_counter()
    pre = np.zeros(n, np.int64)
    if kind in (cluster_kernels.RANDOM, cluster_kernels.KV_OVERLAP):
        pre[:] = np.random.default_rng(o.seed).integers(0, nw, n)
    elif kind == cluster_kernels.PREFIX_HASH:
        cluster_kernels.prefix_hashes(flat, offsets, ns, o.prefix_pages * page, pre)
        pre = prefix_hash_route(pre, *ring_points(nw, o.vnodes))
    # sized for a fair share of the trace up front: growth runs in Python
    # between kernel calls, and 2N trees growing from empty took ~10 calls each
    share = int(lengths.sum()) // nw + 1
    tokens = share if cap < 0 else min(share, 2 * cap) + int(lengths.max())
    nodes = 2 * (n // nw) + 64
    stores = [_store(policy, page, tokens, nodes) for _ in range(nw)]
    approx = (
        [_store(0, 1, tokens, nodes) for _ in range(nw)]
        if kind == cluster_kernels.CACHE_AWARE
        else []
    )
    roots = namespace_roots(stores[0], ns)
    for s in stores[1:] + approx:
        if not np.array_equal(namespace_roots(s, ns), roots):
            raise InvariantError("worker trees gave one namespace different roots")

    tree_max = o.max_tree_size
    if tree_max is None:
        tree_max = cap
    interval = o.eviction_interval
    params = np.zeros(cluster_kernels.PARAMS_SIZE, np.int64)
    params[cluster_kernels.P_WORKERS] = nw
    params[cluster_kernels.P_ROUTER] = kind
    params[cluster_kernels.P_PAGE] = page
    params[cluster_kernels.P_CAPACITY] = cap
    params[cluster_kernels.P_MAX_LEN] = int(lengths.max())
    params[cluster_kernels.P_SLOTS] = o.slots
    params[cluster_kernels.P_LOAD] = LOADS.index(o.load)
    params[cluster_kernels.P_ABS] = o.balance_abs_threshold
    params[cluster_kernels.P_TREE_MAX] = tree_max
    params[cluster_kernels.P_BLOCK] = bs
    fparams = np.zeros(cluster_kernels.FPARAMS_SIZE, np.float64)
    fparams[cluster_kernels.F_REL] = o.balance_rel_threshold
    fparams[cluster_kernels.F_CACHE] = o.cache_threshold
    fparams[cluster_kernels.F_WEIGHT] = o.overlap_score_weight
    fparams[cluster_kernels.F_PREFILL] = o.prefill_rate
    fparams[cluster_kernels.F_DECODE] = o.decode_rate
    fparams[cluster_kernels.F_INTERVAL] = -1.0 if interval is None else interval
    state = np.zeros(cluster_kernels.STATE_SIZE, np.int64)
    fstate = np.zeros(cluster_kernels.FSTATE_SIZE, np.float64)
    fstate[cluster_kernels.FS_TIME] = -math.inf
    fstate[cluster_kernels.FS_NEXT_EVICT] = 0.0 if interval is None else interval
    wstate = np.zeros((nw, cluster_kernels.W_SIZE), np.int64)
    wbusy = np.zeros(nw, np.float64)
    slot_free = np.zeros((nw, o.slots), np.float64)
    ev_t = np.zeros(2 * n, np.float64)
    ev_v = np.zeros(2 * n, np.int64)
    assign = np.zeros(n, np.int64)
    hits = np.zeros(n, np.int64)
    rejected = np.zeros(n, np.bool_)
    modes = np.zeros(n, np.int64)
    first_token = np.zeros(n, np.float64)
    finish = np.zeros(n, np.float64)
    out = np.empty(0, np.int64)
    like = stores[0].like

    def run():
        W = _trees(stores)
        R = _trees(approx) if approx else W
        return cluster_kernels.cluster_run(
            W,
            R,
            like,
            roots,
            flat,
            offsets,
            times,
            inputs,
            outputs,
            pre,
            params,
            fparams,
            state,
            fstate,
            wstate,
            wbusy,
            slot_free,
            ev_t,
            ev_v,
            assign,
            hits,
            rejected,
            modes,
            first_token,
            finish,
            out,
        )

    resume(run, stores + approx)
    seconds = time.perf_counter() - t0

    first = scored_from(n, warmup)
    sc = slice(first, None)
    saved = np.minimum(hits * bs, inputs)
    a = assign[sc]

    def per(values):
        return np.bincount(a, weights=values[sc], minlength=nw).astype(np.int64)

    final = np.array([s.count("tokens") for s in stores], np.int64)
    reqs = np.bincount(a, minlength=nw).astype(np.int64)
    total_w, hit_w = per(lengths), per(hits)
    per_worker = {
        "requests": reqs,
        "total_ids": total_w,
        "hit_ids": hit_w,
        "hit_rate": np.divide(hit_w, total_w, out=np.zeros(nw), where=total_w > 0),
        "prefill_tokens": per(inputs),
        "prefill_tokens_saved": per(saved),
        "evicted_ids": wstate[:, cluster_kernels.W_INSERTED] - final,
        "peak_ids": wstate[:, cluster_kernels.W_PEAK].copy(),
        "final_ids": final,
        "rejected": per(rejected.astype(np.int64)),
        "peak_outstanding": wstate[:, cluster_kernels.W_PEAK_OUTSTANDING].copy(),
        "busy_seconds": wbusy,
    }
    return ClusterResult(
        workers=nw, router=router, requests=n, capacity=capacity, page_size=page,
        block_size=bs, total_ids=int(lengths[sc].sum()), hit_ids=int(hits[sc].sum()),
        prefill_tokens=int(inputs[sc].sum()), prefill_tokens_saved=int(saved[sc].sum()),
        evicted_ids=int(per_worker["evicted_ids"].sum()),
        load_imbalance=imbalance(wbusy), request_imbalance=imbalance(reqs),
        mean_ttft=float(np.mean(first_token[sc] - times[sc])) if n > first else 0.0,
        seconds=seconds, assignments=assign, hits=hits, rejected=rejected, modes=modes,
        first_token=first_token, finish=finish, per_worker=per_worker, warmup=warmup,
        scored_requests=n - first)


def imbalance(values: Any) -> float:
    """max / mean of per-worker ``values`` (1.0 when all are 0).

    >>> imbalance([3, 1]), imbalance([0, 0])
    (1.5, 1.0)
    """
    v = np.asarray(values, dtype=np.float64)
    m = v.mean()
    return float(v.max() / m) if m > 0 else 1.0


def _store(policy, page, tokens, nodes):
    s = TreeStorage(np.int64, values=False, track=True, page_size=page, token_capacity=tokens,
                    node_capacity=nodes)
    s.meta[M_POLICY] = policy
    return s


def _trees(stores):
    """The kernel's view of several trees: one directory row per tree, or
    (without directories) the tuple of their ``T`` tuples."""
    if not storage.USE_DIRECTORY or not all(isinstance(s.directory, np.ndarray) for s in stores):
        return tuple(s.arrays for s in stores)
    W = np.empty((len(stores), SLOTS), np.int64)
    for k, s in enumerate(stores):
        W[k] = s.directory
    return W


@dataclass
class ClusterSweep:
    """Cluster replays over (workers, router, capacity): ``rows`` (one dict
    per replay) and the ``results``."""

    results: List[ClusterResult]

    COLUMNS = ("workers", "router", "capacity", "hit_rate", "prefill_tokens_saved",
               "prefill_saved_fraction", "load_imbalance", "request_imbalance", "mean_ttft",
               "evicted_ids", "seconds")

    @property
    def rows(self) -> List[Dict[str, Any]]:
        """One dict of ``COLUMNS`` per replay."""
        return [{c: r.summary()[c] for c in self.COLUMNS} for r in self.results]

    def to_dict(self) -> Dict[str, List[Any]]:
        """Column name -> list of values (ready for ``pandas.DataFrame``)."""
        rows = self.rows
        return {c: [row[c] for row in rows] for c in self.COLUMNS}

    def to_csv(self) -> str:
        """Every column, one row per replay, as CSV text."""
        import csv
        import io
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(self.COLUMNS)
        for row in self.rows:
            w.writerow(["" if row[c] is None else row[c] for c in self.COLUMNS])
        return buf.getvalue()

    def table(self) -> str:
        """The sweep as an aligned text table."""
        head = ("workers", "router", "capacity", "hit rate", "prefill saved", "imbalance",
                "req imbalance", "mean TTFT s")
        body = [(str(r["workers"]), r["router"],
                 "unbounded" if r["capacity"] is None else f"{r['capacity']:,}",
                 f"{r['hit_rate']:.3f}",
                 f"{r['prefill_tokens_saved']:,} ({r['prefill_saved_fraction']:.1%})",
                 f"{r['load_imbalance']:.2f}", f"{r['request_imbalance']:.2f}",
                 f"{r['mean_ttft']:.3f}") for r in self.rows]
        widths = [max(len(x) for x in col) for col in zip(head, *body)]
        lines = ["  ".join(x.rjust(wd) for x, wd in zip(row, widths)) for row in [head, *body]]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def sweep_cluster(trace: TraceLike, workers: Union[int, Iterable[int]] = (1, 2, 4, 8),
                  capacities: Union[Optional[int], Iterable[Optional[int]]] = (None,),
                  routers: Union[str, Iterable[str]] = ("cache_aware",), *,
                  threads: Optional[int] = None, progress: SweepProgress = None,
                  **kwargs: Any) -> ClusterSweep:
    """``replay_cluster`` for every (workers, router, capacity), in that
    nesting order, on ``threads`` threads (default: the CPU count; the
    kernel releases the GIL). Other arguments as for ``replay_cluster``;
    every combination is checked before any runs. ``progress`` is called
    with the number of replays done after each one.
    """
    tr = as_trace(trace)
    combos = [(w, r, c) for w in listed("workers", workers) for r in listed("routers", routers)
              for c in listed("capacities", capacities)]
    options = ClusterOptions.of(kwargs.pop("options", None),
                                **{k: kwargs.pop(k) for k in list(kwargs) if k in _OPTION_NAMES})
    for w, r, c in combos:  # check every argument now, not after half the sweep ran
        check_int("workers", w, minimum=1, maximum=MAX_WORKERS)
        if not isinstance(r, str) or r not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}; got {r!r}")
        if c is not None:
            check_int("capacity", c, minimum=0)
    return ClusterSweep(run_replays(
        lambda combo: replay_cluster(tr, workers=combo[0], capacity=combo[2], router=combo[1],
                                     options=options, **kwargs), combos, threads, progress))


_OPTION_NAMES = {f.name for f in fields(ClusterOptions)}
