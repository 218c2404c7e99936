"""The router service: a ``RouterIndex`` fed by the workers' KV events,
answering over HTTP which worker a request should go to.

Endpoints (JSON bodies; tokens are a JSON list of ints):

- ``POST /overlap`` ``{"tokens": [...], "namespace": null}`` ->
  ``{"overlap": {worker: cached tokens}, "degraded": [worker, ...]}``;
- ``POST /route`` ``{"tokens": [...], "namespace": null, "policy": ...,
  "loads": {worker: {...}}}`` -> ``{"worker": w, "policy": p, "mode": m,
  "overlap": {...}, "load": {...}, "degraded": [...]}``: the pick of
  ``cache_aware``, ``kv_overlap``, ``least_loaded`` or ``prefix_hash``
  (``radix_soa.router_index.rules``, the rules the cluster study's
  routers follow) from each worker's overlap and the load it was told;
- ``POST /load`` ``{"loads": {worker: {...}}}`` sets loads, ``{"add":
  {worker: {...}}}`` adds to them (all or nothing);
- ``POST /events`` ``{"worker": w, "events": [event dicts], "seq": n}``:
  a worker's KV events posted instead of (or beside) subscribed ones;
- ``GET /workers``, ``GET /healthz``, ``GET /metrics`` (Prometheus text).

**Load** (what "the load it was told" means). A worker's load is four
counts: ``requests`` and ``tokens`` outstanding (``least_loaded``;
``cache_aware``'s balance check and shortest queue read ``requests``),
``active_blocks`` (KV blocks of its running requests) and
``prefill_tokens`` (prompt tokens waiting for prefill; ``kv_overlap``'s
cost reads both). The service does not proxy requests, so it cannot see
them finish: it keeps the loads it is told. SGLang's gateway counts the
requests it has in flight to each worker (up when it forwards one, down
when the answer ends) and polls the workers' load; Dynamo's KV router
counts each worker's active blocks and prefill tokens from its own
routing decisions (up on add, down on prefill end and on free) beside the
workers' reported metrics. Here the caller that forwards requests plays
that part: ``POST /load`` with ``add`` (+1 request, +its tokens when it
forwards, -1 when it ends) or with absolute ``loads`` (a load monitor's
poll); a ``/route`` body's ``loads`` overrides the stored loads for that
decision only. The service itself counts only ``routed`` (requests it
picked each worker for), the tie break of ``cache_aware``'s shortest queue
(SGLang's processed count). The response's ``load`` is the chosen
worker's load as the decision read it.

**Server library.** The service is a bare ASGI application served by
uvicorn (encode; releases monthly) with httptools' C parser and uvloop
when installed (the ``router`` extra). ``python
asv_bench/server_candidates.py`` ran the same JSON route on four
candidates, each in its own process, driven by ``loadgen`` (8 keep-alive
connections, 20,000 requests, 3 interleaved runs, busy 2-core VM): server
CPU per request with 64-token bodies 49 us under uvicorn (bare ASGI), 66
us aiohttp (uvloop), 70 us Starlette under uvicorn, 130 us the stdlib
ThreadingHTTPServer; with 1,024-token bodies 98, 119, 122 and 217 us.
Requests/s follow (1,024 tokens, median: 7,634, 6,699, 6,395, 4,580) but
swing with the machine's other load; the CPU a request costs is the
steadier measure, and what bounds routes/s on two cores. The bare ASGI
app is also the fewest layers (no framework: seven endpoints are a dict),
and uvicorn takes a pre-bound socket, so the command line, the tests and
the load test run it on a free port from a thread in a few lines.
"""

import asyncio
import gc
import io
import json
import os
import shutil
import tarfile
import tempfile
import socket
import threading
import time

from .._events.kv_events import EventError, namespace_seed
from ..router_index import rules
from ..router_index import RouterIndex
from .metrics import Histogram, family, label
from .schema import (LOAD_FIELDS, BadRequest, batch_of, check_keys, cut, keys_of, loads_of,
                     namespace_of, parse_body, read_tokens, shown)

__all__ = ["RouterService", "POLICIES", "restore"]

POLICIES = ("cache_aware", "kv_overlap", "least_loaded", "prefix_hash")
LOADS = ("requests", "tokens")
STATUSES = ("exact", "syncing", "degraded")  # a worker's status, one of these
ENDPOINTS = ("/overlap", "/route", "/load", "/events", "/workers", "/healthz", "/readyz",
             "/snapshot", "/metrics")
OVERLAP_FIELDS = ("tokens", "namespace", "lora_name", "extra_keys")
ROUTE_FIELDS = OVERLAP_FIELDS + ("policy", "loads")
MAX_BODY = 64 << 20
MAX_WORKER_ID = 256   # characters of a worker id posted to /events
OFF_LOOP = 1 << 20    # a body larger than this is parsed and applied off the event loop
_JSON = b"application/json"
_TEXT = b"text/plain; version=0.0.4; charset=utf-8"
_TAR = b"application/x-tar"


def _dumps(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


def restore(state_dir, workers, *, page_size=16, event_hash="fast64", event_hash_seed=None,
            max_bytes=None):
    """``(index, positions, error)`` for a router over ``workers``: the
    checkpoint in ``state_dir`` when it loads and fits (its page size and
    event hash; its workers made ``workers``), else a fresh index, no
    positions and ``error`` saying why (None when there was none to load)."""
    from .checkpoint import CheckpointError, load

    def fresh():
        return RouterIndex(page_size, workers=workers, event_hash=event_hash,
                           event_hash_seed=event_hash_seed, strict=False, max_bytes=max_bytes)
    if state_dir is None:
        return fresh(), {}, None
    try:
        ix, positions, _ = load(state_dir)
    except FileNotFoundError:
        return fresh(), {}, None
    except (CheckpointError, OSError) as exc:
        return fresh(), {}, f"the checkpoint was not loaded: {exc}"
    want = fresh()
    if (ix.page_size, ix.event_hash, ix._max_bytes) != (want.page_size, want.event_hash,
                                                          want._max_bytes) or \
            getattr(ix, "_seed_none", None) != getattr(want, "_seed_none", None):
        return want, {}, (f"the checkpoint in {state_dir} is of another index (page size "
                          f"{ix.page_size}, event hash {ix.event_hash}): not loaded")
    for w in ix.workers:
        if w not in workers:
            ix.remove_worker(w)
    for w in workers:
        if w not in ix:
            ix.add_worker(w)
    return ix, {w: p for w, p in positions.items() if w in workers}, None


class _View:
    """The workers at one instant: ids in ``RouterIndex.workers`` order,
    their names (str ids, the JSON keys) and positions by name."""

    def __init__(self, ids):
        self.ids = ids
        self.names = [str(w) for w in ids]
        self.pos = {n: i for i, n in enumerate(self.names)}
        self.ring = None


class RouterService:
    """An HTTP router over ``index`` (a ``RouterIndex``; ``strict=False`` so
    a worker with a lost event is marked degraded, not refused).

    ``subscriber``: what feeds the index, such as
    ``radix_soa.integrations.vllm.KVEventSubscriber`` (anything with
    ``start()``, ``stop()`` and ``stats(worker)``), started and stopped
    with the service; None: events come by ``POST /events`` only.
    ``policy``: the default of ``/route``. The policy options are those of
    ``radix_soa.replay_cluster`` (SGLang's and Dynamo's defaults).
    ``POST /events`` for a worker the index does not hold is a 400 unless
    ``allow_new_workers=True`` (then the post registers it, up to
    ``max_workers`` workers in all). ``max_body``: bytes a request body may
    have (a larger one is refused before it is read). ``state_dir``: where
    the index and the subscriber's stream positions are checkpointed every
    ``checkpoint_every`` seconds and on a clean stop (``from_endpoints``
    loads them); ``GET /snapshot`` serves that checkpoint.

    >>> import http.client, json
    >>> import radix_soa as rs
    >>> ix = rs.RouterIndex(page_size=2, workers=["a", "b"], strict=False)
    >>> svc = RouterService(ix).start("127.0.0.1", 0)
    >>> c = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=10)
    >>> pc = rs.PrefixCache(page_size=2, events=True, values=False); _ = pc.insert([1, 2, 3, 4])
    >>> c.request("POST", "/events", json.dumps({"worker": "b", "events":
    ...     [e.to_dict() for e in pc.take_events()]})); c.getresponse().read()
    b'{"worker":"b","applied":1}'
    >>> c.request("POST", "/route", json.dumps({"tokens": [1, 2, 3, 4, 5]}))
    >>> r = c.getresponse(); r.status, json.loads(r.read())["worker"]
    (200, 'b')
    >>> svc.stop()
    """

    def __init__(self, index, *, subscriber=None, policy="cache_aware", cache_threshold=0.5,
                 balance_abs_threshold=32, balance_rel_threshold=1.1, overlap_weight=1.0,
                 load="requests", prefix_pages=4, vnodes=64, allow_new_workers=False,
                 max_workers=1024, max_body=MAX_BODY, state_dir=None, checkpoint_every=5.0):
        if not isinstance(index, RouterIndex):
            raise TypeError(f"index must be a RouterIndex; got {type(index).__name__}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
        if load not in LOADS:
            raise ValueError(f"load must be one of {', '.join(LOADS)}; got {load!r}")
        for name, v, lo in (("cache_threshold", cache_threshold, 0),
                            ("balance_abs_threshold", balance_abs_threshold, 0),
                            ("balance_rel_threshold", balance_rel_threshold, 0),
                            ("overlap_weight", overlap_weight, 0),
                            ("checkpoint_every", checkpoint_every, 1e-3)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v < 1e18:
                raise ValueError(f"{name} must be a number >= {lo}; got {v!r}")
        for name, v in (("prefix_pages", prefix_pages), ("vnodes", vnodes),
                        ("max_workers", max_workers), ("max_body", max_body)):
            top = 1 << 40 if name == "max_body" else 1 << 16
            if type(v) is not int or not 1 <= v <= top:
                raise ValueError(f"{name} must be an int in [1, {top}]; got {v!r}")
        self.index = index
        self.subscriber = subscriber
        self.allow_new_workers = bool(allow_new_workers)
        self._owns_subscriber = False
        self.policy = policy
        self.options = {"cache_threshold": cache_threshold,
                        "balance_abs_threshold": balance_abs_threshold,
                        "balance_rel_threshold": balance_rel_threshold,
                        "overlap_weight": overlap_weight, "load": load,
                        "prefix_pages": prefix_pages, "vnodes": vnodes}
        self._loads = {}      # worker id -> [requests, tokens, active_blocks, prefill_tokens]
        self._routed = {}     # worker id -> requests routed to it
        self._posted = {}     # worker id -> [batches, events] posted to /events
        self._posted_seq = {}  # worker id -> the last seq posted to /events and applied
        self.max_workers = max_workers
        self.max_body = max_body
        self._executor = None  # one thread: /events, and any large body, off the event loop
        self._readers = None   # threads for reads while a large write runs
        self._heavy = 0        # large writes running in ``_executor``
        self._health = (len(index.workers), len(index.degraded))
        self.state_dir = None if state_dir is None else os.path.abspath(os.fspath(state_dir))
        self.checkpoint_every = float(checkpoint_every)
        self.checkpoint_info = {"count": 0, "bytes": None, "write_seconds": None,
                                "copy_seconds": None, "at": None, "error": None}
        self._ckpt_lock = threading.Lock()
        self._ckpt_stop = threading.Event()
        self._ckpt_thread = None
        self.load_error = None  # why a checkpoint was not loaded (from_endpoints)
        self._kv_turn = 0     # kv_overlap's tie-break start
        self._view = _View([])
        self._hist = {e: Histogram() for e in ENDPOINTS}
        self._counts = {}     # (endpoint, status) -> requests
        self._loop = None
        self._thread = None
        self._server = None
        self._routes = self._table()
        self.port = None
        self.started = time.time()

    @classmethod
    def from_endpoints(cls, endpoints, *, page_size=16, event_hash="fast64",
                       event_hash_seed=None, max_bytes=None, probe_every=2.0,
                       replay_timeout=5.0, **options):
        """A service over a ``RouterIndex`` fed by a ``KVEventSubscriber``
        of ``endpoints`` (worker id -> vLLM publisher endpoint, as the
        subscriber takes them); needs the ``vllm`` extra. With
        ``state_dir=`` among the options, the index and the stream
        positions come from the checkpoint there when one loads (else it
        starts empty, ``load_error`` saying why), and the workers resume
        from their positions."""
        from ..integrations.vllm import KVEventSubscriber
        ix, positions, error = restore(options.get("state_dir"), list(endpoints),
                                       page_size=page_size, event_hash=event_hash,
                                       event_hash_seed=event_hash_seed, max_bytes=max_bytes)
        svc = cls(ix, subscriber=KVEventSubscriber(ix, endpoints, positions=positions,
                                                   probe_every=probe_every,
                                                   replay_timeout=replay_timeout), **options)
        svc._owns_subscriber = True  # made here: closed by stop()
        svc.load_error = error
        return svc

    # ------------------------------------------------------------ state
    def _current(self, ids):
        v = self._view
        if v.ids != ids:
            v = self._view = _View(ids)
        return v

    def _load_row(self, w):
        row = self._loads.get(w)
        if row is None:
            row = self._loads[w] = [0, 0, 0, 0]
        return row

    def loads(self):
        """Every worker's stored load: ``{name: {field: count}}``."""
        v = self._current(self.index.workers)
        return {n: dict(zip(LOAD_FIELDS, self._load_row(w))) for n, w in zip(v.names, v.ids)}

    # ------------------------------------------------------------ the decision
    def choose(self, policy, tokens, namespace, view, overlaps, loads):
        """``(position, mode)`` of the worker ``policy`` picks, from the
        ``overlaps`` (tokens each worker caches) and ``loads`` (a row of
        ``LOAD_FIELDS`` counts per worker), in ``view``'s order."""
        o = self.options
        n = len(tokens)
        if policy == "cache_aware":
            return rules.cache_aware_choice(
                overlaps, [r[0] for r in loads], [self._routed.get(w, 0) for w in view.ids], n,
                o["cache_threshold"], o["balance_abs_threshold"], o["balance_rel_threshold"])
        if policy == "kv_overlap":
            page = self.index.page_size
            start = self._kv_turn % len(overlaps)
            self._kv_turn += 1
            return rules.kv_overlap_choice(
                overlaps, [r[3] for r in loads], [r[2] for r in loads], n, page,
                -(-n // page), o["overlap_weight"], start), "cost"
        if policy == "least_loaded":
            col = 1 if o["load"] == "tokens" else 0
            return rules.least_loaded_choice([r[col] for r in loads]), "load"
        if view.ring is None:
            view.ring = rules.ring_points([rules.ring_key(w) for w in view.ids], o["vnodes"])
        ns = 0 if namespace is None else (namespace_seed(namespace)
                                          if isinstance(namespace, str) else namespace)
        key = rules.prefix_key(tokens[:o["prefix_pages"] * self.index.page_size].tolist(), ns,
                               o["prefix_pages"] * self.index.page_size)
        return rules.prefix_hash_choice(key, view.ring), "hash"

    # ------------------------------------------------------------ handlers
    def _overlap(self, raw):
        if b'"batch"' in raw:  # (only then: the one-list body keeps its fast path)
            body = parse_body(raw)
            if "batch" in body:
                return self._overlap_batch(body)
        body, tokens = read_tokens(raw, OVERLAP_FIELDS)
        lora, extra = keys_of(body)
        rep = self.index.overlap_report(tokens, namespace_of(body), lora_name=lora,
                                        extra_keys=extra)
        v = self._current(list(rep.scores))
        return 200, {"overlap": dict(zip(v.names, rep.scores.values())),
                     "degraded": [n for n, w in zip(v.names, v.ids) if w in rep.degraded],
                     "syncing": [n for n, w in zip(v.names, v.ids) if w in rep.syncing]}

    def _overlap_batch(self, body):
        """``POST /overlap`` of a waiting queue: ``{"batch": [tokens, ...]}``
        scored against every worker in one kernel call."""
        check_keys(body, ("batch",) + OVERLAP_FIELDS[1:])
        rows = batch_of(body)
        lora, extra = keys_of(body)
        with self.index._lock:  # the columns and the statuses at the instant of the scores
            ids = self.index.workers
            statuses = self.index.statuses()
        scores = self.index.overlap_batch(rows, namespace_of(body), lora_name=lora,
                                          extra_keys=extra)
        v = self._current(ids)
        st = [statuses.get(w, ("exact", None))[0] for w in v.ids]
        return 200, {"workers": v.names, "overlaps": scores.tolist(),
                     "degraded": [n for n, x in zip(v.names, st) if x == "degraded"],
                     "syncing": [n for n, x in zip(v.names, st) if x == "syncing"]}

    def _route(self, raw):
        body, tokens = read_tokens(raw, ROUTE_FIELDS)
        ns = namespace_of(body)
        lora, extra = keys_of(body)
        policy = body.get("policy", self.policy)
        if policy not in POLICIES:
            raise BadRequest(f"policy must be one of {', '.join(POLICIES)}; got {shown(policy)}")
        rep = self.index.overlap_report(tokens, ns, lora_name=lora, extra_keys=extra)
        v = self._current(list(rep.scores))
        if not v.ids:
            return 503, {"error": "no workers are registered"}
        rows = [self._load_row(w) for w in v.ids]
        told = body.get("loads")
        if told is not None:
            told = loads_of(told, v.pos)
            rows = [list(r) for r in rows]
            for name, one in told.items():
                r = rows[v.pos[name]]
                for k, x in one.items():
                    r[LOAD_FIELDS.index(k)] = x
        overlaps = list(rep.scores.values())
        pos, mode = self.choose(policy, tokens, ns, v, overlaps, rows)
        w = v.ids[pos]
        self._routed[w] = self._routed.get(w, 0) + 1
        return 200, {"worker": v.names[pos], "policy": policy, "mode": mode,
                     "overlap": dict(zip(v.names, overlaps)),
                     "load": dict(zip(LOAD_FIELDS, rows[pos])),
                     "degraded": [n for n, x in zip(v.names, v.ids) if x in rep.degraded],
                     "syncing": [n for n, x in zip(v.names, v.ids) if x in rep.syncing]}

    def _load(self, raw):
        body = parse_body(raw)
        check_keys(body, ("loads", "add"))
        if not body:
            raise BadRequest("give loads (counts to set) or add (counts to add)")
        v = self._current(self.index.workers)
        sets = loads_of(body["loads"], v.pos) if "loads" in body else {}
        adds = loads_of(body["add"], v.pos, "add", delta=True) if "add" in body else {}
        new = {}
        for name in set(sets) | set(adds):  # checked whole before any change
            row = list(self._load_row(v.ids[v.pos[name]]))
            for k, x in sets.get(name, {}).items():
                row[LOAD_FIELDS.index(k)] = x
            for k, x in adds.get(name, {}).items():
                i = LOAD_FIELDS.index(k)
                if row[i] + x < 0:
                    raise BadRequest(f"add[{shown(name)}][{k!r}]: {row[i]} + {x} would be below 0")
                row[i] += x
            new[name] = row
        for name, row in new.items():
            self._loads[v.ids[v.pos[name]]] = row
        return 200, {"loads": {n: dict(zip(LOAD_FIELDS, self._load_row(w)))
                               for n, w in zip(v.names, v.ids)}}

    def _events_wire(self, raw):
        """``POST /events`` of a msgpack body ``{"worker": name, "seq": n or
        nil, "batch": <a vLLM KVEventBatch's msgpack bytes>}``: the batch
        applied from its bytes (``RouterIndex.apply_wire``)."""
        try:
            import msgpack
            body = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except ImportError:
            raise BadRequest("a msgpack body needs msgpack: pip install msgpack") from None
        except Exception as e:  # msgpack raises several kinds for bad bytes
            raise BadRequest(f"the body is neither JSON nor msgpack ({type(e).__name__})") from None
        if not isinstance(body, dict):
            raise BadRequest("a msgpack body is a map of worker, seq and batch")
        check_keys(body, ("worker", "seq", "batch"))
        batch = body.get("batch")
        if not isinstance(batch, bytes):
            raise BadRequest("batch must be the bytes of a vLLM KVEventBatch (msgpack bin)")
        w, name, seq, duplicate = self._poster(body)
        if duplicate:
            return 200, {"worker": name, "applied": 0, "duplicate": True}
        try:
            got = self.index.apply_wire(w, batch, seq=seq)
        except (EventError, TypeError, ValueError, OverflowError, KeyError) as e:
            raise BadRequest(f"batch: {e}") from None
        if seq is not None:
            self._posted_seq[w] = seq
        p = self._posted.setdefault(w, [0, 0])
        p[0] += 1
        p[1] += got.events
        return 200, {"worker": name, "applied": got.events}

    def _poster(self, body):
        """``(worker id, name, seq, duplicate)`` of an ``/events`` body,
        checked (``duplicate``: ``seq`` is at most the last one applied)."""
        name = body.get("worker")
        if (not isinstance(name, str) or not name or len(name) > MAX_WORKER_ID
                or not name.isprintable()):
            raise BadRequest(f"worker must be a non-empty printable string of at most "
                             f"{MAX_WORKER_ID} characters; got {shown(name)}")
        seq = body.get("seq")
        if seq is not None and (type(seq) is not int or not 0 <= seq < 1 << 63):
            raise BadRequest(f"seq must be an integer >= 0; got {shown(seq)}")
        v = self._current(self.index.workers)
        if name not in v.pos and not self.allow_new_workers:
            # a typo must not become a worker that routes then prefer (no load, no cache)
            raise BadRequest(f"worker: unknown worker {shown(name)}; the workers are "
                             f"{cut(', '.join(map(repr, v.names))) or 'none'} (start the service "
                             "with --allow-new-workers, or allow_new_workers=True in "
                             "Python, to let a POST add one)")
        if name not in v.pos and len(v.ids) >= self.max_workers:
            raise BadRequest(f"worker: {shown(name)} would be worker {len(v.ids) + 1}, past "
                             f"max_workers={self.max_workers} (--max-workers)")
        w = v.ids[v.pos[name]] if name in v.pos else name
        # the index's own record (kept across a checkpoint) when this service posted none
        last = self._posted_seq.get(w, getattr(self.index, "_seq", {}).get(w))
        return w, name, seq, seq is not None and last is not None and seq <= last

    def _events(self, raw):
        if raw[:1] and (0x80 <= raw[0] <= 0x8F or raw[0] in (0xDE, 0xDF)):  # a msgpack map
            return self._events_wire(raw)
        body = parse_body(raw, stream=("events",))
        check_keys(body, ("worker", "events", "seq"))
        events = body.get("events")
        if not isinstance(events, list):
            raise BadRequest("events must be a list of event objects")
        w, name, seq, duplicate = self._poster(body)
        if duplicate:
            return 200, {"worker": name, "applied": 0, "duplicate": True}
        try:
            self.index.apply(w, events, seq=seq)
        except EventError as e:
            raise BadRequest(f"events: {e}") from None
        except (TypeError, ValueError, OverflowError, KeyError) as e:
            raise BadRequest(f"events: {e}") from None
        if seq is not None:
            self._posted_seq[w] = seq
        p = self._posted.setdefault(w, [0, 0])
        p[0] += 1
        p[1] += len(events)
        return 200, {"worker": name, "applied": len(events)}

    def _event_stats(self):
        """Every worker's event counts (the subscriber's, asked once, and
        what was posted)."""
        out = {}
        sub = self.subscriber
        if sub is not None:
            try:
                out = {w: dict(x) for w, x in sub.stats().items()}
            except TypeError:  # a feed with stats(worker) only
                for w in self.index.workers:
                    try:
                        out[w] = dict(sub.stats(w))
                    except KeyError:
                        pass
        for w, p in self._posted.items():
            one = out.setdefault(w, {})
            one["posted_batches"], one["posted_events"] = p
        return out

    def _workers(self, raw):
        ix = self.index
        v = self._current(ix.workers)
        statuses = ix.statuses()
        every = self._event_stats()
        out = []
        for n, w in zip(v.names, v.ids):
            stats = every.get(w, {})
            status, reason = statuses.get(w, ("exact", None))
            out.append({"id": n, "status": status, "reason": reason,
                        "problem": reason if status == "degraded" else None,
                        "load": dict(zip(LOAD_FIELDS,
                                                                     self._load_row(w))),
                        "routed": self._routed.get(w, 0),
                        "events": {k: x for k, x in stats.items()
                                   if isinstance(x, (int, float, str, type(None)))}})
        return 200, {"workers": out, "page_size": ix.page_size, "event_hash": ix.event_hash,
                     "policy": self.policy, "pages": len(ix),
                     "checkpoint": dict(self.checkpoint_info, state_dir=self.state_dir,
                                        load_error=self.load_error)}

    def _healthz(self, raw):
        ix = self.index
        # liveness: never waits for the index (a large apply holds its lock);
        # the counts are those of the last instant it was free
        if ix._lock.acquire(blocking=False):
            try:
                self._health = (len(ix.workers), len(ix.degraded))
            finally:
                ix._lock.release()
        n, bad = self._health
        sub = self.subscriber
        events_ok = sub is None or getattr(sub, "running", True)
        # a stopped feed means a stale index: 503, so a probe reading only the status sees it
        return 200 if events_ok else 503, {"status": "ok" if events_ok else "events stopped", "workers": n,
                     "degraded": bad, "uptime_seconds": round(time.time() - self.started, 3)}

    def _snapshot(self, raw):
        """The current checkpoint as a tar of its directory (a fresh one
        when the service keeps no state directory)."""
        from .checkpoint import save
        buf = io.BytesIO()
        with self._ckpt_lock:
            if self.state_dir is not None and os.path.isdir(self.state_dir):
                src, tmp = self.state_dir, None
            else:
                tmp = tempfile.mkdtemp(prefix="radix-soa-snapshot-")
                src = os.path.join(tmp, "state")
                save(src, *self._consistent_copy()[:2])
            try:
                with tarfile.open(fileobj=buf, mode="w") as tar:
                    for name in sorted(os.listdir(src)):
                        tar.add(os.path.join(src, name), arcname=name, recursive=False)
            finally:
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
        return 200, buf.getvalue()

    def _consistent_copy(self):
        """``(state, positions, copy seconds)``: the index copied with the
        stream positions of the same instant."""
        from .checkpoint import snapshot
        t0 = time.perf_counter()
        sub = self.subscriber
        if sub is not None and hasattr(sub, "positions") and not getattr(sub, "_closed", False):
            state, positions = sub.positions(lambda: snapshot(self.index))
        else:
            state, positions = snapshot(self.index), {}
        return state, positions, time.perf_counter() - t0

    def checkpoint(self):
        """Write a checkpoint to ``state_dir`` now (``ValueError`` without
        one): the index copied at one instant with the stream positions,
        then written aside and renamed into place. Returns
        ``checkpoint_info``."""
        from .checkpoint import save
        if self.state_dir is None:
            raise ValueError("the service has no state_dir to checkpoint to")
        with self._ckpt_lock:
            state, positions, copy_s = self._consistent_copy()
            out = save(self.state_dir, state, positions)
            info = self.checkpoint_info
            info.update(count=info["count"] + 1, bytes=out["bytes"],
                        write_seconds=round(out["seconds"], 6), copy_seconds=round(copy_s, 6),
                        at=time.time(), error=None)
            return dict(info)

    def _checkpoints(self):
        while not self._ckpt_stop.wait(self.checkpoint_every):
            try:
                self.checkpoint()
            except Exception as exc:  # a full disk must not stop the service
                self.checkpoint_info["error"] = f"{type(exc).__name__}: {exc}"

    def _readyz(self, raw):
        """200 when every worker is exact (and the feed runs), else 503 with
        the workers that are not and why."""
        sub = self.subscriber
        events_ok = sub is None or getattr(sub, "running", True)
        statuses = self.index.statuses()
        v = self._current(list(statuses))
        waiting = [{"id": n, "status": st[0], "reason": st[1]}
                   for n, st in zip(v.names, statuses.values()) if st[0] != "exact"]
        ready = events_ok and not waiting
        out = {"ready": ready, "workers": len(statuses), "not_exact": waiting}
        if not events_ok:
            out["error"] = "events stopped"
        return (200 if ready else 503), out

    def metrics_text(self):
        """The Prometheus text of ``/metrics``."""
        ix = self.index
        v = self._current(ix.workers)
        degraded = ix.degraded
        mem = ix.memory_report()
        p = "radix_soa_router_"
        out = family(p + "requests_total", "counter", "HTTP requests answered, by endpoint "
                     "and status", [(f'endpoint="{label(e)}",status="{s}"', c)
                                    for (e, s), c in sorted(self._counts.items())])
        out += [f"# HELP {p}request_seconds Time to answer a request, by endpoint\n",
                f"# TYPE {p}request_seconds histogram\n"]
        for e, h in self._hist.items():
            if h.count:
                out += h.lines(p + "request_seconds", f'endpoint="{label(e)}"')
        wl = [(n, w, f'worker="{label(n)}"') for n, w in zip(v.names, v.ids)]
        out += family(p + "routed_total", "counter", "Requests routed to each worker",
                      [(lab, self._routed.get(w, 0)) for n, w, lab in wl])
        every = self._event_stats()
        stats = {w: every.get(w, {}) for _, w, _ in wl}
        for name, key, what in (("events_applied_total", "events", "KV events applied"),
                                ("event_batches_total", "batches", "event batches applied"),
                                ("event_gaps_total", "gaps", "gaps in the batch numbers seen"),
                                ("event_errors_total", "errors", "malformed batches"),
                                ("event_restarts_total", "restarts", "publisher restarts seen"),
                                ("event_reconnects_total", "reconnects",
                                 "reconnects of the event socket")):
            out += family(p + name, "counter", f"{what}, by worker (subscribed)",
                          [(lab, stats[w].get(key, 0)) for n, w, lab in wl])
        out += family(p + "events_posted_total", "counter", "KV events posted to /events",
                      [(lab, stats[w].get("posted_events", 0)) for n, w, lab in wl])
        out += family(p + "worker_degraded", "gauge", "1 if the worker's pages are not known "
                      "exactly", [(lab, int(w in degraded)) for n, w, lab in wl])
        statuses = ix.statuses()
        out += family(p + "worker_status", "gauge", "Each worker's status as a state set: 1 "
                      "for the one it is in (exact, syncing, degraded), 0 for the others; why "
                      "is in GET /workers (a free-text label would make a series per reason)", [
                          (f'{lab},status="{s}"', int(statuses.get(w, ("exact", None))[0] == s))
                          for n, w, lab in wl for s in STATUSES])
        out += family(p + "worker_load", "gauge", "The load each worker was told to have",
                      [(f'{lab},kind="{k}"', x) for n, w, lab in wl
                       for k, x in zip(LOAD_FIELDS, self._load_row(w))])
        out += family(p + "workers", "gauge", "Registered workers", [("", len(v.ids))])
        out += family(p + "degraded_workers", "gauge", "Degraded workers",
                      [("", len(degraded))])
        out += family(p + "syncing_workers", "gauge", "Workers not confirmed yet (syncing)",
                      [("", sum(st[0] == "syncing" for st in statuses.values()))])
        out += family(p + "index_bytes", "gauge", "Bytes of the index's arrays",
                      [("", mem["bytes"])])
        out += family(p + "index_pages", "gauge", "Distinct pages some worker holds",
                      [("", mem["pages"])])
        return "".join(out)

    def _metrics(self, raw):
        return 200, self.metrics_text()

    # ------------------------------------------------------------ plumbing
    def _table(self):
        return {"/overlap": ("POST", self._overlap), "/route": ("POST", self._route),
                "/load": ("POST", self._load), "/events": ("POST", self._events),
                "/workers": ("GET", self._workers), "/healthz": ("GET", self._healthz),
                "/readyz": ("GET", self._readyz), "/snapshot": ("GET", self._snapshot),
                "/metrics": ("GET", self._metrics)}

    async def __call__(self, scope, receive, send):
        """The ASGI application (HTTP only)."""
        if scope["type"] != "http":
            return
        t0 = time.perf_counter()
        path = scope["path"]
        entry = self._routes.get(path)
        limit = self.max_body
        declared = None
        for k, val in scope.get("headers", ()):
            if k == b"content-length":
                try:
                    declared = int(val)
                except ValueError:
                    declared = None
        chunks = []
        size = 0
        if declared is None or declared <= limit:
            while True:  # the whole body, bounded: reading stops past the limit
                m = await receive()
                if m["type"] == "http.disconnect":
                    return
                part = m.get("body", b"")
                size += len(part)
                if size > limit:
                    break
                chunks.append(part)
                if not m.get("more_body"):
                    break
        else:
            size = declared  # refused before it is read
        extra = []
        if entry is None:
            status, out = 404, {"error": f"no endpoint {cut(path, 100)}; the endpoints are "
                                         f"{', '.join(ENDPOINTS)}"}
        elif scope["method"] != entry[0]:
            status, out = 405, {"error": f"{path} takes {entry[0]}"}
            extra = [(b"allow", entry[0].encode())]
        elif size > limit:
            status, out = 413, {"error": f"the body is larger than {limit} bytes"}
            extra = [(b"connection", b"close")]
        else:
            body = chunks[0] if len(chunks) == 1 else chunks  # joined where it is handled
            if path in ("/events", "/snapshot") or size > OFF_LOOP:
                # parsed and applied in one thread beside the loop: others are answered
                heavy = size > OFF_LOOP
                self._heavy += heavy
                try:
                    status, out = await asyncio.get_running_loop().run_in_executor(
                        self._pool(), self._handle, entry[1], body, heavy)
                finally:
                    self._heavy -= heavy
            elif self._heavy and path != "/healthz":
                # the index may be held by that write: wait for it in a thread
                status, out = await asyncio.get_running_loop().run_in_executor(
                    self._read_pool(), self._handle, entry[1], body)
            else:
                status, out = self._handle(entry[1], body)
        if isinstance(out, str):
            payload, ctype = out.encode(), _TEXT
        elif isinstance(out, bytes):
            payload, ctype = out, _TAR
        else:
            payload, ctype = _dumps(out), _JSON
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype),
                                (b"content-length", str(len(payload)).encode())] + extra})
        await send({"type": "http.response.body", "body": payload})
        key = (path if entry is not None else "other", status)
        self._counts[key] = self._counts.get(key, 0) + 1
        if entry is not None:
            self._hist[path].observe(time.perf_counter() - t0)

    @staticmethod
    def _handle(handler, body, heavy=False):
        # a large body makes objects by the million: the cyclic collector's
        # passes over them would hold the GIL for 100s of ms (the event loop
        # waits), and reference counting frees them anyway
        collecting = heavy and gc.isenabled()
        if collecting:
            gc.disable()
        try:
            return handler(body if isinstance(body, bytes) else b"".join(body))
        except BadRequest as e:
            return 400, {"error": cut(" ".join(str(e)[:4096].split()), 1024)}
        finally:
            if collecting:
                gc.enable()

    def _pool(self):
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="radix-soa-router-body")
        return self._executor

    def _read_pool(self):
        if self._readers is None:
            from concurrent.futures import ThreadPoolExecutor
            self._readers = ThreadPoolExecutor(4, thread_name_prefix="radix-soa-router-read")
        return self._readers

    def _warm(self):
        """Compile (or load) the kernels a route runs before the first one."""
        read_tokens(b'{"tokens": [1, 2]}', ("tokens",))
        self.index.overlap([1, 2])

    @staticmethod
    def _new_loop():
        try:
            import uvloop
            return uvloop.new_event_loop()
        except ImportError:
            return asyncio.new_event_loop()

    def start(self, host="127.0.0.1", port=0):
        """Serve from a background thread (the subscriber started too);
        ``port`` 0 takes a free one (``self.port``). ``OSError`` if it
        cannot listen there. Returns self."""
        import importlib.util

        import uvicorn
        if self._thread is not None:
            raise RuntimeError("the service is already running")
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                    flags=socket.AI_PASSIVE)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        try:
            self._warm()
        except BaseException:
            sock.close()
            raise
        http = "httptools" if importlib.util.find_spec("httptools") else "h11"
        config = uvicorn.Config(self, http=http, lifespan="off", log_config=None,
                                access_log=False, log_level="warning", backlog=2048)
        server = self._server = uvicorn.Server(config)
        failed = []

        def run():
            loop = self._loop = self._new_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(server.serve(sockets=[sock]))
            except BaseException as e:  # pragma: no cover - reported to start's caller
                failed.append(e)
            finally:
                loop.close()
                sock.close()

        self._thread = threading.Thread(target=run, daemon=True, name="radix-soa-router")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        if not server.started:
            self.stop()
            raise failed[0] if failed else RuntimeError("the service did not start")
        if self.subscriber is not None:
            try:
                self.subscriber.start()
            except BaseException:
                self.stop()  # no server left answering from an index nothing feeds
                raise
        if self.state_dir is not None:
            self._ckpt_stop.clear()
            self._ckpt_thread = threading.Thread(target=self._checkpoints, daemon=True,
                                                 name="radix-soa-router-checkpoint")
            self._ckpt_thread.start()
        return self

    def stop(self):
        """Stop serving and the subscriber (a last checkpoint written, with
        ``state_dir``); waits for the threads."""
        if self._ckpt_thread is not None:
            self._ckpt_stop.set()
            self._ckpt_thread.join(60)
            self._ckpt_thread = None
        if self.subscriber is not None:
            self.subscriber.stop()
        if self.state_dir is not None and self._thread is not None:
            try:
                self.checkpoint()  # a clean stop: the state as it ends
            except Exception as exc:
                self.checkpoint_info["error"] = f"{type(exc).__name__}: {exc}"
        if self.subscriber is not None and self._owns_subscriber:
            self.subscriber.close()
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(30)
            self._thread = None
        for pool in (self._executor, self._readers):
            if pool is not None:
                pool.shutdown(wait=True)
        self._executor = self._readers = None

    def serve_forever(self, host="127.0.0.1", port=8000, announce=None):
        """Serve until SIGINT or SIGTERM (the command line; from the main
        thread); ``announce(port)`` is called once listening."""
        import signal
        self.start(host, port)
        stop = threading.Event()
        old = {sig: signal.signal(sig, lambda *_: stop.set())
               for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            if announce is not None:
                announce(self.port)
            while not stop.wait(0.5):
                if not self._thread.is_alive():
                    break
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)
            self.stop()
