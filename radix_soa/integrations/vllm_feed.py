"""One vLLM publisher as the subscriber sees it: its addresses
(``Endpoint``, ``as_endpoint``, ``parse_worker``) and its sockets and
stream state (``Feed``: a SUB socket, a DEALER for replays, a ZMQ monitor
of the SUB socket's handshakes, and the worker's ``StreamRules``), touched
by the one thread of ``radix_soa.integrations.vllm.KVEventSubscriber``.
"""

import time
from typing import NamedTuple

from ..router_index.wire import decode as read_wire
from .stream_rules import StreamRules
from .vllm_wire import zmq

__all__ = ["Endpoint", "as_endpoint", "parse_worker", "Feed"]

SUB_HWM = 100_000  # vLLM's PUB high-water mark: batches queued before ZMQ drops
_IO_STATS = ("batches", "events", "skipped", "junk", "errors")


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


class Feed:
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
        self.rules = StreamRules(worker, has_replay=endpoint.replay is not None,
                                 decode=read_wire)
        self.deadline = None     # while a replay runs: when it is given up
        self.handshakes_seen = 0  # the SUB socket's: the first is its connect
        self.heard = False       # anything received from this publisher
        self.since = time.time()  # when the status shown last changed
        self.quiet_since = time.monotonic()  # the last PUB batch, or probe
        self.shown = False       # the syncing reason shown in the index (False: none yet)
        self.stats = dict.fromkeys(_IO_STATS, 0)
        self.stats.update(last_error=None, data_parallel_rank=None, ts=None)
        self.rules_error = None  # the rules' last_error already copied
        self.rules_errors = 0    # and their count of errors

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
