"""A subscriber of vLLM's KV-event publishers feeding a ``RouterIndex``.

vLLM (``--kv-events-config '{"enable_kv_cache_events": true, "publisher":
"zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'``)
publishes every engine's ``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared`` events in numbered batches on a ZMQ PUB socket and keeps
the last batches for replay behind a ROUTER socket (the wire:
``radix_soa.integrations.vllm_wire``, restated from vLLM 0.34.0 and 0.9.0,
both event encodings). ``KVEventSubscriber(index, {worker: endpoint})``
connects a SUB socket (and a DEALER for replays) to each worker's publisher
and applies every batch to ``index`` as the worker's, in order, from one
thread polling every socket (or from your own calls to ``poll_once``).

What it does with the sequence numbers (duplicates, gaps, restarts,
reconnects, probes of a quiet worker, junk) is judged by
``radix_soa.integrations.stream_rules.StreamRules``, one per worker; this
class is only its I/O. A worker is ``syncing`` until its replay confirms it
(``RouterIndex.status``). Nothing a publisher sends stops the thread.

Each batch applies with ``strict=False`` (the rules judged its order).
Events of another ``medium`` than ``"GPU"`` (CPU offloading tiers) or
another KV-cache group than ``group_idx`` 0 (a hybrid
model's other groups, which repeat the same block hashes) are skipped and
counted; ``medium=None`` / ``group_idx=None`` take them all.

>>> import radix_soa as rs
>>> from radix_soa.integrations.vllm_wire import WirePublisher
>>> pub = WirePublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
>>> ix = rs.RouterIndex(page_size=2)
>>> sub = KVEventSubscriber(ix, {"w0": (pub.endpoint, pub.replay_endpoint)})
>>> pub.wait_subscribers(1)
True
>>> sub.wait(lambda: ix.status("w0") == "exact", timeout=10)  # asked at once, from 0
True
>>> engine = rs.PrefixCache(page_size=2, events=True, values=False)   # stands in for vLLM's
>>> _ = engine.insert([1, 2]); _ = pub.publish(engine.take_events(), send=False)  # lost
>>> _ = engine.insert([1, 2, 3, 4]); _ = pub.publish(engine.take_events())
>>> sub.wait(lambda: sub.stats("w0")["last_seq"] == 1 and ix.status("w0") == "exact",
...          timeout=10)
True
>>> ix.overlap([1, 2, 3, 4]).tolist(), ix.status("w0"), sub.stats("w0")["gaps"]
([4], 'exact', 1)
>>> sub.close(); pub.close()
"""

import queue
import threading
import time

from .vllm_feed import Endpoint, Feed, as_endpoint, parse_worker
from .vllm_wire import END_SEQ, zmq
from .._events.kv_events import EventError
from ..router_index import RouterIndex, worker_id

__all__ = ["KVEventSubscriber", "Endpoint", "as_endpoint", "parse_worker", "main"]

_PUB, _REPLAY, _MONITOR = 0, 1, 2  # what a polled socket is


class KVEventSubscriber:
    """Apply the KV events of vLLM workers' publishers to ``index`` (a
    ``RouterIndex``) as they arrive: ``endpoints`` maps each worker id to
    its publisher (an ``Endpoint``, a PUB address str, a ``(pub, replay[,
    topic])`` tuple or a dict). ``start()`` runs one background thread
    polling every worker's sockets; without it, ``poll_once(timeout_ms)``
    does one round in the caller's thread. ``stats()`` counts per worker.
    The module's docstring says what happens on gaps, restarts and
    malformed frames.

    Parameters
    ----------
    index : RouterIndex
        The index the batches apply to, each worker's as its own.
    endpoints : mapping, optional
        Worker id -> publisher endpoint.
    replay_timeout : float
        Seconds the replay socket may stay silent (before its first reply,
        between replies) before the replay is given up (default 5).
    poll_interval : float
        The thread's longest wait (seconds), which bounds how long ``stop``
        and ``add_endpoint`` wait.
    medium, group_idx : str or None, int or None
        The events taken (see the module).
    context : zmq.Context, optional
        A context to use (by default one of its own, ended by ``close``).
    probe_every : float or None
        Seconds a worker may stay quiet before its replay socket is probed
        (default 2; None: never).
    positions : mapping, optional
        Worker id -> ``(last seq applied, its payload)``, as ``positions()``
        returns them: the workers' pages in ``index`` are kept and their
        streams resumed from there (a checkpoint's).
    """

    def __init__(self, index, endpoints=None, *, replay_timeout=5.0, poll_interval=0.05,
                 medium="GPU", group_idx=0, context=None, probe_every=2.0, positions=None):
        if not isinstance(index, RouterIndex):
            raise TypeError(f"index must be a RouterIndex; got {type(index).__name__}")
        for name, v in (("replay_timeout", replay_timeout), ("poll_interval", poll_interval)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e6:
                raise ValueError(f"{name} must be a positive number of seconds; got {v!r}")
        if medium is not None and not isinstance(medium, str):
            raise TypeError(f"medium must be a str or None; got {type(medium).__name__}")
        if group_idx is not None and type(group_idx) is not int:
            raise TypeError(f"group_idx must be an int or None; got {type(group_idx).__name__}")
        if endpoints is None:
            endpoints = {}
        if not hasattr(endpoints, "items"):
            raise TypeError("endpoints must be a mapping from worker id to endpoint; got "
                            f"{type(endpoints).__name__}")
        specs = {}
        for w, spec in endpoints.items():
            w = worker_id(w)
            if w in specs:
                raise ValueError(f"endpoints names worker {w!r} twice")
            specs[w] = as_endpoint(spec, f"endpoints[{w!r}]")
        if probe_every is not None and (isinstance(probe_every, bool) or not isinstance(
                probe_every, (int, float)) or not 0 < probe_every < 1e6):
            raise ValueError(f"probe_every must be a positive number of seconds or None; got "
                             f"{probe_every!r}")
        resume = {}
        for w, pos in (positions or {}).items():
            if not (isinstance(pos, tuple) and len(pos) == 2 and type(pos[0]) is int
                    and pos[0] >= 0 and isinstance(pos[1], bytes)):
                raise ValueError(f"positions[{w!r}] must be (last seq applied, its payload "
                                 f"bytes); got {type(pos).__name__}")
            resume[worker_id(w)] = pos
        self._resume = resume
        self.index = index
        self.probe_every = None if probe_every is None else float(probe_every)
        self.replay_timeout = float(replay_timeout)
        self.poll_interval = float(poll_interval)
        self.medium, self.group_idx = medium, group_idx
        self._own_ctx = context is None
        self._ctx = zmq.Context() if context is None else context
        self._feeds = {}
        self._by_socket = {}
        self._poller = zmq.Poller()
        self._io = threading.RLock()  # socket use outside the thread
        self._commands = queue.SimpleQueue()
        self._thread = None
        self._stop = threading.Event()
        self._closed = False
        feeds = []
        try:  # every socket made before anything is registered
            for w, ep in specs.items():
                feeds.append(self._feed(w, ep))
        except BaseException:
            for f in feeds:
                f.close()
            if self._own_ctx:
                self._ctx.destroy(0)
            raise
        for feed in feeds:
            self._attach(feed)

    # ------------------------------------------------------------ workers
    def _feed(self, worker, ep):
        try:
            return Feed(worker, ep, self._ctx)
        except zmq.ZMQError as exc:
            raise ValueError(f"the endpoint of worker {worker!r} ({ep.pub}, {ep.replay}): "
                             f"{exc}") from None

    def _add(self, worker, ep):
        if worker in self._feeds:
            raise ValueError(f"worker {worker!r} already has an endpoint")
        self._attach(self._feed(worker, ep))

    def _attach(self, feed):
        self.index.add_worker(feed.worker)
        self._feeds[feed.worker] = feed
        self._register(feed.sub, feed, _PUB)
        if feed.replay is not None:
            self._register(feed.replay, feed, _REPLAY)
        if feed.monitor is not None:
            self._register(feed.monitor, feed, _MONITOR)
        # ask, don't wait: from 0, or from the position a checkpoint saved
        self._do(feed, feed.rules.on_start(resume=self._resume.pop(feed.worker, None)))

    def _register(self, sock, feed, kind):
        self._by_socket[sock] = (feed, kind)
        self._poller.register(sock, zmq.POLLIN)

    def _unregister(self, sock):
        self._poller.unregister(sock)
        del self._by_socket[sock]

    def _remove(self, worker, drop):
        feed = self._feeds.pop(worker, None)
        if feed is None:
            raise KeyError(f"worker {worker!r} has no endpoint")
        self._unregister(feed.sub)
        if feed.replay is not None:
            self._unregister(feed.replay)
        if feed.monitor is not None:
            self._unregister(feed.monitor)
        feed.close()
        if drop and worker in self.index:
            self.index.remove_worker(worker)

    def _call(self, fn, *args):
        """Run ``fn`` where the sockets live: in the thread while it runs."""
        if self._closed:
            raise RuntimeError("the subscriber is closed")
        thread = self._thread
        if thread is None or threading.current_thread() is thread:
            with self._io:
                return fn(*args)
        done, box = threading.Event(), []
        self._commands.put((fn, args, done, box))
        while not done.wait(self.poll_interval):
            if not thread.is_alive():  # it stopped meanwhile: run what it left
                with self._io:
                    self._run_commands()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def _run_commands(self):
        while True:
            try:
                fn, args, done, box = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                box.append(fn(*args))
            except BaseException as exc:
                box.append(exc)
            done.set()

    def add_endpoint(self, worker, endpoint):
        """Subscribe to a new worker's publisher (also while running); the
        worker joins the index. ``ValueError`` if it already has one."""
        worker = worker_id(worker)
        ep = as_endpoint(endpoint, f"endpoint of {worker!r}")
        self._call(self._add, worker, ep)

    def remove_endpoint(self, worker, *, drop=True):
        """Stop subscribing to ``worker`` (``KeyError`` if unknown); with
        ``drop`` (the default) it leaves the index too."""
        self._call(self._remove, worker_id(worker), bool(drop))

    def positions(self, snapshot=None):
        """Each worker's stream position: ``{worker: (last seq applied, its
        payload)}`` (what ``positions=`` resumes from); with ``snapshot`` (a
        callable), ``(snapshot(), positions)`` taken at one instant, no
        batch applied between (``snapshot`` runs in the polling thread).

        >>> import radix_soa as rs
        >>> KVEventSubscriber(rs.RouterIndex(page_size=2)).positions()
        {}
        """
        def grab():
            pos = {w: (f.rules.last, bytes(f.rules.last_payload))
                   for w, f in self._feeds.items()
                   if f.rules.last is not None and f.rules.last_payload is not None}
            return pos if snapshot is None else (snapshot(), pos)
        return self._call(grab)

    @property
    def workers(self):
        """The workers subscribed to, in the order they were added."""
        return list(self._feeds)

    def endpoint(self, worker):
        """The ``Endpoint`` of ``worker``."""
        return self._feeds[worker_id(worker)].endpoint

    def stats(self, worker=None):
        """A worker's counts (a new dict): ``batches`` applied, ``events``
        applied, ``skipped`` (another medium or group), ``gaps`` seen,
        ``replayed`` batches, ``replay_timeouts``, ``restarts``,
        ``duplicates`` (a batch sent again), ``errors``, ``junk`` (messages
        that cannot be tied to a seq, dropped), ``unreadable`` (payloads
        that cannot be decoded, asked again), ``reconnects`` (of the SUB
        socket, each checked by a replay), ``probes`` (replays asked of a
        quiet worker), ``last_seq`` (the last batch handled),
        ``last_error``, ``data_parallel_rank`` and ``ts`` of the last batch
        applied, ``replaying`` (a replay under way), ``status`` and
        ``reason`` (the index's); without ``worker``, a dict of every
        worker's."""
        statuses = self.index.statuses()  # once: O(workers)
        if worker is None:
            return {w: self._stats_of(f, statuses) for w, f in list(self._feeds.items())}
        return self._stats_of(self._feeds[worker_id(worker)], statuses)

    @staticmethod
    def _stats_of(feed, statuses):
        rules = feed.rules
        out = dict(rules.stats, **feed.stats)
        out["errors"] = feed.stats["errors"] + feed.rules_errors
        out.update(last_seq=rules.last, replaying=rules.replaying)
        out["status"], out["reason"] = statuses.get(feed.worker, ("unknown", None))
        return out

    # ------------------------------------------------------------ running
    def start(self):
        """Start the polling thread (one for every worker); returns self."""
        if self._closed:
            raise RuntimeError("the subscriber is closed")
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="radix-soa-kv-events")
            self._thread.start()
        return self

    def stop(self, timeout=5.0):
        """Stop the thread and wait for it (at most ``timeout`` seconds; it
        stops within about ``poll_interval``). ``True`` if it stopped."""
        thread = self._thread
        if thread is None:
            return True
        self._stop.set()
        thread.join(timeout)
        if thread.is_alive():
            return False
        self._thread = None
        return True

    @property
    def running(self):
        """Whether the polling thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def close(self):
        """Stop, close every socket (and the context, if its own)."""
        if self._closed:
            return
        if not self.stop():
            raise RuntimeError("the subscriber's thread did not stop")
        with self._io:
            for w in list(self._feeds):
                self._remove(w, False)
            self._closed = True
            if self._own_ctx:
                self._ctx.destroy(0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if not getattr(self, "_closed", True) and getattr(self, "_thread", None) is None:
            try:
                self.close()
            except Exception:
                pass

    def __repr__(self):
        return (f"KVEventSubscriber({len(self._feeds)} workers, "
                f"{'running' if self.running else 'stopped'})")

    def _run(self):
        while not self._stop.is_set():
            try:
                self._round(int(self.poll_interval * 1000))
            except Exception:  # pragma: no cover - a bug; keep serving the others
                time.sleep(self.poll_interval)
        self._run_commands()

    def poll_once(self, timeout_ms=0):
        """One round in the caller's thread (not while ``start``ed): wait up
        to ``timeout_ms`` for messages, handle those waiting, give up
        overdue replays. The number of messages handled."""
        if self._closed:
            raise RuntimeError("the subscriber is closed")
        if self.running:
            raise RuntimeError("poll_once is for a subscriber not start()ed")
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
            raise ValueError(f"timeout_ms must be a non-negative int; got {timeout_ms!r}")
        with self._io:
            return self._round(timeout_ms)

    def wait(self, condition, timeout=10.0, *, step_ms=20):
        """Poll (or, while running, wait) until ``condition()`` is true or
        ``timeout`` seconds pass; whether it became true."""
        deadline = time.monotonic() + timeout
        while True:
            if condition():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self.running:
                time.sleep(min(step_ms / 1000, left))
            else:
                self.poll_once(max(1, min(step_ms, int(left * 1000))))

    def _round(self, timeout_ms):
        n = 0
        self._run_commands()
        wait = timeout_ms
        if any(f.deadline is not None for f in self._feeds.values()):
            wait = min(wait, 20)
        ready = self._poller.poll(wait) if self._by_socket else ()
        # a monitor first: a reconnect is judged before the batches after it
        for sock, _ in sorted(ready, key=lambda r: self._by_socket.get(r[0], (0, 0))[1] != 2):
            entry = self._by_socket.get(sock)
            if entry is None:
                continue  # a replay socket replaced during this round
            feed, kind = entry
            for _ in range(1000):  # a bound, so one busy worker cannot starve the rest
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                n += 1
                try:
                    if kind == _REPLAY:
                        self._on_replay(feed, frames)
                    elif kind == _PUB:
                        self._on_pub(feed, frames)
                    else:
                        self._on_handshakes(feed, 1)
                except Exception as exc:  # a bug must not stop the feed
                    feed.stats["errors"] += 1
                    feed.stats["last_error"] = (f"worker {feed.worker!r}: "
                                                f"{type(exc).__name__}: {exc}")
                if self._by_socket.get(sock) is not entry:
                    break  # the worker removed, or this replay socket replaced
        if not self._by_socket and timeout_ms:
            self._stop.wait(timeout_ms / 1000)
        now = time.monotonic()
        for feed in list(self._feeds.values()):
            if feed.deadline is not None and now >= feed.deadline:
                self._do(feed, feed.rules.on_replay_timeout())
            elif (self.probe_every is not None and feed.deadline is None
                  and now - feed.quiet_since >= self.probe_every):
                feed.quiet_since = now
                self._do(feed, feed.rules.on_quiet())
        return n

    # ------------------------------------------------------------ the stream
    def _do(self, feed, actions):
        """Carry out what the stream rules said, then show the status."""
        rules, worker = feed.rules, feed.worker
        for a in actions:
            if a.kind == "apply":
                self._apply(feed, a.seq, a.decoded)
            elif a.kind == "clear":
                self.index.apply_snapshot(worker, [])
            elif a.kind == "ask":
                try:
                    feed.replay.send_multipart([b"", a.seq.to_bytes(8, "big")], zmq.NOBLOCK)
                    feed.deadline = time.monotonic() + self.replay_timeout
                except zmq.Again:
                    feed.deadline = time.monotonic()  # not sent: given up next round
            elif a.kind == "drop_replay":
                self._drop_replay_socket(feed)
                feed.deadline = None
            elif a.kind == "degrade":
                self.index.mark_degraded(worker, a.data)
        if not rules.replaying:
            feed.deadline = None
        if rules.last_error is not feed.rules_error:
            feed.rules_error = feed.stats["last_error"] = rules.last_error
        feed.rules_errors = rules.stats["errors"]  # after its message: stats() read elsewhere
        reason = rules.syncing
        if reason != feed.shown:
            feed.shown = reason
            feed.since = time.time()
            if reason is not None:
                ep = feed.endpoint
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(feed.since))
                if not feed.heard:
                    where = ep.pub if ep.replay is None else f"{ep.pub} or {ep.replay}"
                    reason = f"nothing from {where} since {stamp}: {reason}"
                else:
                    reason = f"{reason} (since {stamp})"
            self.index.mark_syncing(worker, reason)

    def _junk(self, feed, msg):
        """A message that cannot be tied to a seq: counted and dropped (the
        next seq decides whether anything numbered was lost)."""
        feed.stats["junk"] += 1
        feed.stats["errors"] += 1
        feed.stats["last_error"] = f"worker {feed.worker!r}: {msg}"

    def _on_handshakes(self, feed, n):
        """``n`` handshakes of the SUB socket: the first is its connect,
        the others reconnects."""
        for _ in range(n):
            feed.handshakes_seen += 1
            if feed.handshakes_seen > 1:
                self._do(feed, feed.rules.on_reconnect())

    def _on_pub(self, feed, frames):
        n = feed.handshakes()  # a reconnect is judged before the batch after it
        if n:
            self._on_handshakes(feed, n)
        if len(frames) != 3 or len(frames[1]) != 8:
            self._junk(feed, f"a PUB message is (topic, 8-byte seq, payload); got "
                       f"{len(frames)} frames" + (f", a seq of {len(frames[1])} bytes"
                                                  if len(frames) == 3 else ""))
            return
        feed.heard = True
        feed.quiet_since = time.monotonic()
        self._do(feed, feed.rules.on_batch(int.from_bytes(frames[1], "big"), frames[2]))

    def _drop_replay_socket(self, feed):
        old = feed.replay
        if old is None:
            return
        self._unregister(old)
        feed.reset_replay()
        self._register(feed.replay, feed, _REPLAY)

    def _on_replay(self, feed, frames):
        if frames and frames[0] == b"":
            frames = frames[1:]
        if len(frames) == 3:
            frames = frames[1:]  # vLLM 0.34.0: the topic first
        if len(frames) != 2 or len(frames[0]) != 8:
            self._junk(feed, f"a replay reply is ([topic,] 8-byte seq, payload); got "
                       f"{len(frames)} frames")
            return
        feed.heard = True
        if not feed.rules.replaying:
            return  # not asked for: ignore
        if frames[0] == END_SEQ:
            self._do(feed, feed.rules.on_replay_end())
            return
        feed.deadline = time.monotonic() + self.replay_timeout  # it answers: wait on
        self._do(feed, feed.rules.on_replay(int.from_bytes(frames[0], "big"), frames[1]))

    def _apply(self, feed, seq, decoded):
        st = feed.stats
        try:  # read once by the stream rules (read_wire); no Python object per event
            # the stream rules judged order, gaps and restarts: no seq here
            got = self.index.apply_wire(feed.worker, decoded, strict=False,
                                        medium=self.medium, group_idx=self.group_idx)
        except EventError as exc:
            self._do(feed, feed.rules.on_refused(seq, str(exc)))
            return
        st["skipped"] += got.skipped
        st["batches"] += 1
        st["events"] += got.events
        st["data_parallel_rank"] = got.data_parallel_rank
        st["ts"] = got.ts


def main(argv=None):
    """``python -m radix_soa.integrations.vllm WORKER=PUB[,REPLAY[,TOPIC]]
    ...``: subscribe to vLLM publishers and print, every ``--interval``
    seconds, one JSON line of each worker's status, pages and counts (for
    ``--duration`` seconds, or until interrupted). Bad arguments exit 2
    with one line."""
    import argparse
    import json
    import sys

    p = argparse.ArgumentParser(prog="python -m radix_soa.integrations.vllm",
                                description="Follow vLLM KV-event publishers into a "
                                            "RouterIndex and print its state.")
    p.add_argument("workers", nargs="+", metavar="WORKER=PUB[,REPLAY[,TOPIC]]")
    p.add_argument("--page-size", type=int, default=16, help="vLLM's block_size (16)")
    p.add_argument("--event-hash", choices=["fast64", "sha256_cbor"], default="fast64",
                   help="fast64 (the default): pages keyed by their tokens, any engine hash; "
                        "sha256_cbor: the engine-hash form, for events without token_ids")
    p.add_argument("--event-hash-seed", default=None,
                   help="with --event-hash sha256_cbor: the engines' PYTHONHASHSEED")
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--duration", type=float, default=None)
    args = p.parse_args(argv)
    try:
        endpoints = dict(parse_worker(w) for w in args.workers)
        if len(endpoints) != len(args.workers):
            raise ValueError("a worker is named twice")
        if not args.interval > 0 or (args.duration is not None and not args.duration >= 0):
            raise ValueError("--interval must be positive and --duration not negative")
        ix = RouterIndex(args.page_size, event_hash=args.event_hash,
                         event_hash_seed=args.event_hash_seed if args.event_hash ==
                         "sha256_cbor" else None, strict=False)
        sub = KVEventSubscriber(ix, endpoints)
    except (TypeError, ValueError, zmq.ZMQError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    end = None if args.duration is None else time.monotonic() + args.duration
    try:
        with sub.start():
            while True:
                left = args.interval if end is None else min(args.interval,
                                                             end - time.monotonic())
                if left > 0:
                    time.sleep(left)
                stats = sub.stats()
                print(json.dumps({str(w): {"status": ix.status(w), "pages": len(ix.blocks_of(w)),
                                           **s} for w, s in stats.items()}), flush=True)
                if end is not None and time.monotonic() >= end:
                    return 0
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
