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

What it does with the sequence numbers (each publisher numbers its batches
from 0), per worker:

- the first batch seen starts the worker's stream: its pages in the index
  are cleared (``apply_snapshot(worker, [])``), and the batches before it,
  from 0, are asked of the replay socket;
- a batch past the next one expected is a gap: the missed ones are asked of
  the replay socket, from the last batch applied on (its payload replayed
  must be the one applied: another means the engine restarted and its new
  count passed the old one, handled as a restart below, its new stream
  asked from 0; a replay no longer holding it marks the worker degraded),
  the batches arriving meanwhile are held, and all are
  applied in order once the replay ends (its end marker, or
  ``replay_timeout`` seconds of silence; a gap left among the held batches
  is asked for again while replays make progress). A batch the replay
  cannot give (gone from the publisher's buffer, or no replay socket)
  leaves the gap to the index,
  which marks the worker degraded (``RouterIndex.status``) and goes on
  applying: the worker stays answerable;
- the first batch after the PUB socket reconnected (a ZMQ monitor sees
  its handshakes), even the one expected next, is checked the same way: a
  restarted engine whose new count came up to the old one shows no gap;
- a batch numbered below the highest seen on the PUB socket, or numbered
  the highest seen with another payload, is a restart (a
  new publisher counts from 0 again: the engine restarted and lost its
  cache): the worker's pages are cleared and its stream starts again as
  above. A batch numbered as the last one, with its payload, is a
  duplicate, skipped.
- a malformed frame, payload or event (or one the index refuses: another
  page size, bytes hashes in a ``fast64`` index) is counted in the worker's
  ``errors`` with ``last_error`` naming the worker and seq; the batch is
  lost, so the worker is marked degraded (``RouterIndex.mark_degraded``;
  also for a message too malformed to tell its seq).
  Nothing a publisher sends stops the thread.

Each batch applies with ``strict=False`` and ``seq`` = its number + 1 (0
is the stream's start). Events of another ``medium`` than ``"GPU"`` (CPU
offloading tiers) or another KV-cache group than ``group_idx`` 0 (a hybrid
model's other groups, which repeat the same block hashes) are skipped and
counted; ``medium=None`` / ``group_idx=None`` take them all.

>>> import radix_soa as rs
>>> from radix_soa.integrations.vllm_wire import WirePublisher
>>> pub = WirePublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
>>> ix = rs.RouterIndex(page_size=2)
>>> sub = KVEventSubscriber(ix, {"w0": (pub.endpoint, pub.replay_endpoint)})
>>> pub.wait_subscribers(1)
True
>>> engine = rs.PrefixCache(page_size=2, events=True, values=False)   # stands in for vLLM's
>>> _ = engine.insert([1, 2]); _ = pub.publish(engine.take_events(), send=False)  # lost
>>> _ = engine.insert([1, 2, 3, 4]); _ = pub.publish(engine.take_events())
>>> sub.wait(lambda: sub.stats("w0")["last_seq"] == 1, timeout=10)
True
>>> ix.overlap([1, 2, 3, 4]).tolist(), ix.status("w0"), sub.stats("w0")["gaps"]
([4], 'exact', 1)
>>> sub.close(); pub.close()
"""

import queue
import threading
import time
from typing import NamedTuple

from .vllm_wire import END_SEQ, zmq
from .._events.kv_events import EventError
from ..router_index import RouterIndex, worker_id

__all__ = ["KVEventSubscriber", "Endpoint"]

SUB_HWM = 100_000  # vLLM's PUB high-water mark: batches queued before ZMQ drops
_STATS = ("batches", "events", "skipped", "gaps", "replayed", "replay_timeouts", "restarts",
          "duplicates", "errors", "reconnects")


class Endpoint(NamedTuple):
    """Where a worker publishes: its PUB address (``tcp://host:5557``), its
    replay (ROUTER) address or None, and the topic it publishes under."""
    pub: str
    replay: object = None
    topic: str = ""


def as_endpoint(spec, name="endpoint"):
    """``spec`` as an ``Endpoint``: a PUB address str, a tuple ``(pub,
    replay[, topic])``, a dict or an object with ``pub`` (and ``replay``,
    ``topic``); ``TypeError`` / ``ValueError`` naming ``name`` otherwise.

    >>> as_endpoint("tcp://h:5557"), as_endpoint({"pub": "tcp://h:1", "replay": "tcp://h:2"}).replay
    (Endpoint(pub='tcp://h:5557', replay=None, topic=''), 'tcp://h:2')
    """
    if isinstance(spec, str):
        ep = Endpoint(spec)
    elif isinstance(spec, tuple) and not hasattr(spec, "pub"):
        if not 1 <= len(spec) <= 3:
            raise ValueError(f"{name}: a tuple is (pub, replay[, topic]); got {len(spec)} items")
        ep = Endpoint(*spec)
    elif isinstance(spec, dict):
        unknown = set(spec) - set(Endpoint._fields)
        if unknown or "pub" not in spec:
            raise ValueError(f"{name}: a dict has 'pub' and maybe 'replay', 'topic'; got "
                             f"{sorted(map(str, spec))}")
        ep = Endpoint(**spec)
    elif hasattr(spec, "pub"):
        ep = Endpoint(spec.pub, getattr(spec, "replay", None), getattr(spec, "topic", "") or "")
    else:
        raise TypeError(f"{name} must be an address str, a (pub, replay[, topic]) tuple, a dict "
                        f"or an object with .pub; got {type(spec).__name__}")
    if not isinstance(ep.pub, str) or not ep.pub:
        raise ValueError(f"{name}: the pub address must be a non-empty str; got {ep.pub!r}")
    if ep.replay is not None and (not isinstance(ep.replay, str) or not ep.replay):
        raise ValueError(f"{name}: the replay address must be None or a non-empty str; got "
                         f"{ep.replay!r}")
    if not isinstance(ep.topic, str):
        raise TypeError(f"{name}: the topic must be a str; got {type(ep.topic).__name__}")
    return ep


class _Feed:
    """One worker's sockets and stream state (touched by one thread)."""

    def __init__(self, worker, endpoint, ctx):
        self.worker, self.endpoint, self.ctx = worker, endpoint, ctx
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, SUB_HWM)
        self.sub.setsockopt(zmq.SUBSCRIBE, endpoint.topic.encode("utf-8"))
        self.replay = None
        self.monitor = None
        try:
            # the SUB socket's handshakes: one after the first is a reconnect
            # (a restarted publisher, or the network), told apart by a replay
            self.monitor = self.sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            self.sub.connect(endpoint.pub)
            self._connect_replay()
        except BaseException:
            self.close()
            raise
        self.last = None        # the last seq handled (applied or lost)
        self.last_payload = None  # its payload (by reference): a replay of it is compared
        self.verify = None      # while a gap's replay runs: the seq whose payload it must repeat
        self.unverified = None  # that seq, when the replay no longer held it
        self.reconnected = False  # a handshake since the last batch applied
        self.high = None        # the highest seq seen on the PUB socket
        self.high_payload = b""  # and its payload: the same seq again with another is a restart
        self.pending = {}       # seq -> payload, held while a replay runs
        self.deadline = None    # while a replay runs: when it is given up
        self.replay_start = 0   # the seq the last replay asked from
        self.stats = dict.fromkeys(_STATS, 0)
        self.stats.update(last_seq=None, last_error=None, data_parallel_rank=None, ts=None)

    def _connect_replay(self):
        if self.endpoint.replay is not None:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            # no limit: a ROUTER drops what a full peer cannot take, and a
            # replay is at most the publisher's buffer (10,000 batches)
            sock.setsockopt(zmq.RCVHWM, 0)
            try:
                sock.connect(self.endpoint.replay)
            except BaseException:
                sock.close(0)
                raise
            self.replay = sock

    def reset_replay(self):
        """A fresh DEALER: replies to a request given up never arrive."""
        if self.replay is not None:
            self.replay.close(0)
            self._connect_replay()

    def handshakes(self):
        """How many handshakes the SUB socket made since the last call."""
        n = 0
        while self.monitor is not None:
            try:
                self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            n += 1
        return n

    def close(self):
        if self.monitor is not None:
            if not self.sub.closed:  # a context destroyed by its owner closed it
                self.sub.disable_monitor()
            self.monitor.close(0)
        self.sub.close(0)
        if self.replay is not None:
            self.replay.close(0)


class KVEventSubscriber:
    """Apply the KV events of vLLM workers' publishers to ``index`` (a
    ``RouterIndex``) as they arrive: ``endpoints`` maps each worker id to
    its publisher (an ``Endpoint``, a PUB address str, a ``(pub, replay[,
    topic])`` tuple or a dict). ``start()`` runs one background thread
    polling every worker's sockets; without it, ``poll_once(timeout_ms)``
    does one round in the caller's thread. ``stats()`` counts per worker.
    The module's docstring says what happens on gaps, restarts and
    malformed frames.

    ``replay_timeout``: seconds the replay socket may stay silent (before
    its first reply, between replies) before the batches held are applied
    without the rest of it. ``poll_interval``: the thread's longest wait
    (seconds), which bounds how long ``stop`` and ``add_endpoint`` wait.
    ``medium`` / ``group_idx``: the events taken (see the module).
    ``context``: a ``zmq.Context`` to use (by default one of its own, ended
    by ``close``).
    """

    def __init__(self, index, endpoints=None, *, replay_timeout=5.0, poll_interval=0.05,
                 medium="GPU", group_idx=0, context=None):
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
        self.index = index
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
            return _Feed(worker, ep, self._ctx)
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
        self._register(feed.sub, feed, False)
        if feed.replay is not None:
            self._register(feed.replay, feed, True)

    def _register(self, sock, feed, is_replay):
        self._by_socket[sock] = (feed, is_replay)
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
        ``duplicates`` (a batch sent again), ``errors``, ``reconnects`` (of
        the SUB socket, each checked by a replay), ``last_seq``
        (the last batch handled), ``last_error``, ``data_parallel_rank``
        and ``ts`` of the last batch applied, ``replaying`` (a replay
        under way); without ``worker``, a dict of every worker's."""
        if worker is None:
            return {w: self._stats_of(f) for w, f in list(self._feeds.items())}
        return self._stats_of(self._feeds[worker_id(worker)])

    @staticmethod
    def _stats_of(feed):
        return dict(feed.stats, replaying=feed.deadline is not None)

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
        for sock, _ in self._poller.poll(wait) if self._by_socket else ():
            entry = self._by_socket.get(sock)
            if entry is None:
                continue  # a replay socket replaced during this round
            feed, is_replay = entry
            for _ in range(1000):  # a bound, so one busy worker cannot starve the rest
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                n += 1
                try:
                    if is_replay:
                        self._on_replay(feed, frames)
                    else:
                        self._on_pub(feed, frames)
                except Exception as exc:  # a bug must not stop the feed
                    self._error(feed, None, f"{type(exc).__name__}: {exc}")
                if self._by_socket.get(sock) is not entry:
                    break  # the worker removed, or this replay socket replaced
        if not self._by_socket and timeout_ms:
            self._stop.wait(timeout_ms / 1000)
        now = time.monotonic()
        for feed in list(self._feeds.values()):
            if feed.deadline is not None and now >= feed.deadline:
                feed.stats["replay_timeouts"] += 1
                self._drop_replay_socket(feed)
                self._finish_replay(feed, False)
        return n

    # ------------------------------------------------------------ the stream
    def _error(self, feed, seq, msg):
        feed.stats["errors"] += 1
        where = f"worker {feed.worker!r}" + ("" if seq is None else f" seq {seq}")
        feed.stats["last_error"] = f"{where}: {msg}"
        if feed.worker in self.index:
            self.index.mark_degraded(feed.worker, f"{where}: a batch was lost: {msg}")

    def _start_stream(self, feed):
        self.index.apply_snapshot(feed.worker, [], seq=0)
        feed.last = feed.last_payload = feed.verify = feed.unverified = None
        feed.reconnected = False

    def _on_pub(self, feed, frames):
        if len(frames) != 3 or len(frames[1]) != 8:
            self._error(feed, None, f"a PUB message is (topic, 8-byte seq, payload); got "
                        f"{len(frames)} frames" + (f", a seq of {len(frames[1])} bytes"
                                                   if len(frames) == 3 else ""))
            return
        seq = int.from_bytes(frames[1], "big")
        payload = frames[2]
        reconnects = feed.handshakes()
        if reconnects and (feed.last is not None or feed.deadline is not None):
            feed.stats["reconnects"] += reconnects
            feed.reconnected = True
        if feed.high is not None and (seq < feed.high
                                      or seq == feed.high and payload != feed.high_payload):
            feed.stats["restarts"] += 1
            if feed.deadline is not None:  # a replay of the old stream: dropped
                feed.deadline = None
                feed.pending.clear()
                self._drop_replay_socket(feed)
            feed.high = None
        if feed.high is None:
            self._start_stream(feed)
        elif seq == feed.high:
            feed.stats["duplicates"] += 1
            return
        feed.high, feed.high_payload = seq, payload  # kept by reference: no work per batch
        if feed.last is not None and seq <= feed.last:
            return  # a replay gave it already
        if feed.deadline is not None:
            feed.pending[seq] = payload
            if feed.reconnected and feed.replay is not None:
                # the replay under way may be answered by the engine gone:
                # asked again, of the one now up, from the last batch applied
                feed.reconnected = False
                self._drop_replay_socket(feed)
                self._replay_from_last_applied(feed)
            return
        expected = 0 if feed.last is None else feed.last + 1
        verify = feed.reconnected and feed.last is not None
        feed.reconnected = False
        if verify and feed.replay is None:
            self._restart_not_ruled_out(feed, seq, "the event socket reconnected and there is "
                                        "no replay socket to check the stream with: a restart "
                                        "cannot be ruled out")
            verify = False
        if seq == expected and not verify:
            self._apply(feed, seq, payload)
            return
        if seq != expected:
            feed.stats["gaps"] += 1
        if feed.replay is None:
            self._apply(feed, seq, payload)  # the index sees the gap: degraded
            return
        feed.pending[seq] = payload
        self._replay_from_last_applied(feed)

    def _replay_from_last_applied(self, feed):
        """Ask the replay from the last batch applied (from 0 at a stream's
        start), which it must repeat: the numbers alone cannot tell a gap
        from a restarted engine whose new count passed the old one."""
        if not self._request_replay(feed, 0 if feed.last is None else feed.last,
                                    verify=feed.last):
            self._finish_replay(feed, False)

    def _request_replay(self, feed, start, verify=None):
        feed.verify = verify  # a request that cannot be sent leaves it unverified
        try:
            feed.replay.send_multipart([b"", start.to_bytes(8, "big")], zmq.NOBLOCK)
        except zmq.Again:
            return False
        feed.replay_start = start
        feed.deadline = time.monotonic() + self.replay_timeout
        return True

    def _drop_replay_socket(self, feed):
        old = feed.replay
        if old is None:
            return
        self._unregister(old)
        feed.reset_replay()
        self._register(feed.replay, feed, True)

    def _on_replay(self, feed, frames):
        if frames and frames[0] == b"":
            frames = frames[1:]
        if len(frames) == 3:
            frames = frames[1:]  # vLLM 0.34.0: the topic first
        if len(frames) != 2 or len(frames[0]) != 8:
            self._error(feed, None, f"a replay reply is ([topic,] 8-byte seq, payload); got "
                        f"{len(frames)} frames")
            return
        if feed.deadline is None:
            return  # not asked for: ignore
        if frames[0] == END_SEQ:
            self._finish_replay(feed, True)
            return
        seq = int.from_bytes(frames[0], "big")
        feed.deadline = time.monotonic() + self.replay_timeout  # it answers: wait on
        if feed.verify is not None and seq >= feed.verify:
            # the first reply at or past the batch asked to be repeated
            verify, feed.verify = feed.verify, None
            if seq == verify and frames[1] != feed.last_payload:
                self._restarted_during_gap(feed)
                return
            if seq > verify:  # gone from the buffer: judged when the replay ends
                feed.unverified = verify
        feed.pending.pop(seq, None)
        if feed.last is not None and seq <= feed.last:
            return
        feed.stats["replayed"] += 1
        self._apply(feed, seq, frames[1])

    def _restarted_during_gap(self, feed):
        """The replay of a gap repeated the last batch applied with another
        payload: the engine restarted and its new count passed the old one.
        Its old pages go; its new stream is asked from 0 (the batches held
        are the new stream's)."""
        feed.stats["restarts"] += 1
        self._drop_replay_socket(feed)  # the rest of this reply: not wanted
        self._start_stream(feed)
        if not self._request_replay(feed, 0):
            self._finish_replay(feed, False)

    def _judge_unverified(self, feed):
        """A replay that did not repeat the last batch applied (no longer
        held, or no answer) cannot rule out a restart: unless the index
        already marked the worker degraded (a gap left open), mark it."""
        verify, feed.unverified = feed.unverified, None
        if verify is not None and self.index.status(feed.worker) == "exact":
            self._restart_not_ruled_out(feed, verify, "the replay did not repeat the last batch "
                                        "applied, so an engine restart cannot be ruled out")

    def _restart_not_ruled_out(self, feed, seq, why):
        msg = f"worker {feed.worker!r} seq {seq}: {why}"
        feed.stats["last_error"] = msg
        self.index.mark_degraded(feed.worker, msg)

    def _finish_replay(self, feed, answered):
        """Apply the batches held, in order. A gap among them that a replay
        which answered may fill (it moved the stream on: the publisher sent
        more since it was asked) is asked for again."""
        feed.deadline = None
        if feed.verify is not None:  # no reply reached it
            feed.unverified, feed.verify = feed.verify, None
        held = sorted(feed.pending.items())
        feed.pending = {}
        for i, (seq, payload) in enumerate(held):
            if feed.last is not None and seq <= feed.last:
                continue
            expected = 0 if feed.last is None else feed.last + 1
            if (seq > expected and answered and feed.replay is not None
                    and expected > feed.replay_start):
                feed.pending = dict(held[i:])
                if self._request_replay(feed, expected):
                    return
                feed.pending = {}
            self._apply(feed, seq, payload)
        self._judge_unverified(feed)

    def _apply(self, feed, seq, payload):
        feed.last, feed.last_payload = seq, payload
        st = feed.stats
        st["last_seq"] = seq
        try:  # read and applied from the bytes, no Python object per event
            got = self.index.apply_wire(feed.worker, payload, strict=False, seq=seq + 1,
                                        medium=self.medium, group_idx=self.group_idx)
        except EventError as exc:
            self._error(feed, seq, str(exc))
            return
        st["skipped"] += got.skipped
        st["batches"] += 1
        st["events"] += got.events
        st["data_parallel_rank"] = got.data_parallel_rank
        st["ts"] = got.ts

    def _wanted(self, e):
        if e["type"] == "AllBlocksCleared":
            return True
        if self.medium is not None and e.get("medium") not in (None, self.medium):
            return False
        return self.group_idx is None or e.get("group_idx") in (None, self.group_idx)


# ---------------------------------------------------------------- the command
def parse_worker(text):
    """``WORKER=PUB[,REPLAY[,TOPIC]]`` as ``(worker, Endpoint)``.

    >>> parse_worker("gpu0=tcp://h:5557,tcp://h:5558")
    ('gpu0', Endpoint(pub='tcp://h:5557', replay='tcp://h:5558', topic=''))
    """
    name, eq, rest = text.partition("=")
    parts = rest.split(",")
    if not eq or not name or not 1 <= len(parts) <= 3 or not parts[0]:
        raise ValueError(f"a worker is WORKER=PUB[,REPLAY[,TOPIC]]; got {text!r}")
    return name, as_endpoint((parts[0], parts[1] or None if len(parts) > 1 else None,
                              parts[2] if len(parts) > 2 else ""), name)


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
    p.add_argument("--event-hash", choices=["sha256_cbor", "fast64"], default="sha256_cbor",
                   help="the engines' hash: vLLM's sha256_cbor (--prefix-caching-hash-algo "
                        "sha256_cbor) by default")
    p.add_argument("--event-hash-seed", default=None,
                   help="the engines' PYTHONHASHSEED (needed to score queries)")
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
