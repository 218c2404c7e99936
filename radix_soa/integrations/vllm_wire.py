"""vLLM's KV-event wire format, restated from ``vllm/distributed/kv_events.py``
(``ZmqEventPublisher``; read at vLLM 0.34.0, and at commit ``b4e69e0``, vLLM
0.9.0, for the first array form): decoding into radix_soa's event dicts,
encoding, and ``WirePublisher``, a small publisher that writes exactly what
vLLM writes (for tests and demos on loopback).

The wire, as vLLM sends it:

- the PUB socket sends one multipart message per batch: ``(topic, seq,
  payload)``, the topic as UTF-8 (``""`` by default), ``seq`` as 8 bytes
  big-endian counting the publisher's batches from 0 (``itertools.count()``:
  a fresh engine starts again at 0), the payload a msgpack (msgspec)
  ``KVEventBatch``;
- the replay socket is a ROUTER bound at ``replay_endpoint``, keeping the
  last ``buffer_steps`` (10,000) batches. A client (a DEALER) sends ``(b"",
  start)``, ``start`` 8 bytes big-endian; the publisher answers each buffered
  batch whose seq is at least ``start``, in order, then an end marker whose
  seq is -1 (8 signed bytes) with an empty payload. From vLLM 0.34.0 each
  reply carries the topic, ``(b"", topic, seq, payload)``, the marker
  ``(b"", b"", -1, b"")``; before, ``(b"", seq, payload)`` and ``(b"", -1,
  b"")``. Both are read;
- ``KVEventBatch`` is ``array_like``: ``[ts, events, data_parallel_rank]``
  (vLLM 0.9.0 had ``[ts, events]``; msgspec writes every field of an
  ``array_like`` struct, None included). A map
  ``{"ts", "events", "data_parallel_rank"}`` is read too;
- each event is tagged by its class name. Until vLLM PR #42892 an event was
  an array, the tag first, then every field in declaration order:
  ``["BlockStored", block_hashes,
  parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
  extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window]``,
  ``["BlockRemoved", block_hashes, medium, group_idx]``,
  ``["AllBlocksCleared"]`` (vLLM 0.9.0 stopped at ``lora_id`` and at
  ``block_hashes``; shorter arrays are read too). Since, an event is a map
  with the tag under ``"type"`` and the fields at their default (None) left
  out (``lora_id``, ``medium``, ``lora_name`` have none: always present);
  vLLM 0.34.0's ``BlockStored`` adds ``locality``, ``ownership``,
  ``session_id``, ``lookahead_token_ids``, its ``BlockRemoved``
  ``locality``, ``ownership``;
- a block hash is an int (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, the
  default: the low 64 bits, big-endian, of the 32-byte hash; before vLLM
  0.10.2 the hash value itself, which Python's ``hash`` made a signed 64-bit
  int) or the 32 bytes themselves. A negative int is read as its 64-bit
  two's complement, so every int hash is in ``[0, 2**64)``.

>>> payload = encode_batch([{"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None,
...                          "token_ids": [1, 2], "block_size": 2}], ts=1.5)
>>> b = decode_batch(payload); b.ts, b.data_parallel_rank, b.events[0]["block_hashes"]
(1.5, 0, [7])
>>> decode_batch(encode_batch([{"type": "BlockRemoved", "block_hashes": [7]}],
...                           encoding="array")).events[0]["type"]
'BlockRemoved'
"""

import collections
import threading
import time
from typing import NamedTuple

try:
    import msgpack
    import zmq
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(f"radix_soa.integrations.vllm needs pyzmq and msgpack ({exc}): "
                      "pip install 'radix-soa[vllm]'") from None

from .._events.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored, EventError,
                                 event_from_dict)

__all__ = ["WireBatch", "decode_batch", "decode_events", "encode_batch", "encode_event",
           "WirePublisher",
           "ENCODINGS", "END_SEQ"]

END_SEQ = (-1).to_bytes(8, "big", signed=True)
MASK64 = (1 << 64) - 1
ENCODINGS = ("map", "array", "array-0.9")

# field order of vLLM's structs (0.34.0): the fields without a default first
STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name")
STORED_OPTIONAL = ("extra_keys", "group_idx", "kv_cache_spec_kind",
                   "kv_cache_spec_sliding_window", "locality", "ownership", "session_id",
                   "lookahead_token_ids")
REMOVED_FIELDS = ("block_hashes", "medium")
REMOVED_OPTIONAL = ("group_idx", "locality", "ownership")
_FIELDS = {"BlockStored": (STORED_FIELDS, STORED_OPTIONAL),
           "BlockRemoved": (REMOVED_FIELDS, REMOVED_OPTIONAL),
           "AllBlocksCleared": ((), ())}
# the positions of the array form, as the last vLLM before PR #42892 had them
_ARRAY = {"BlockStored": STORED_FIELDS + STORED_OPTIONAL[:4],
          "BlockRemoved": REMOVED_FIELDS + REMOVED_OPTIONAL[:1], "AllBlocksCleared": ()}
_ARRAY_09 = {"BlockStored": STORED_FIELDS[:5], "BlockRemoved": ("block_hashes",),
             "AllBlocksCleared": ()}
_REQUIRED = {"BlockStored": 4, "BlockRemoved": 1, "AllBlocksCleared": 0}


class WireBatch(NamedTuple):
    """A decoded ``KVEventBatch``: its timestamp, its events as radix_soa
    event dicts (``event_from_dict``'s shape, vLLM's other fields kept
    beside), and the publisher's data-parallel rank (None when absent)."""
    ts: float
    events: list
    data_parallel_rank: object


def _hash(name, h):
    if isinstance(h, bool):
        raise EventError(f"{name} must hold ints or bytes; got bool")
    if isinstance(h, int):
        return h & MASK64
    if isinstance(h, (bytes, bytearray)) and h:
        return bytes(h)
    raise EventError(f"{name} must hold ints or non-empty bytes; got {type(h).__name__}")


def _event(raw, i):
    """One wire event (a tagged map or a tagged array) as a checked dict."""
    if isinstance(raw, dict):
        kind = raw.get("type")
        if kind not in _FIELDS:
            raise EventError(f"event {i}: unknown event type {kind!r}")
        d = dict(raw)
    elif isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        kind = raw[0]
        if kind not in _FIELDS:
            raise EventError(f"event {i}: unknown event type {kind!r}")
        names = _ARRAY[kind]
        if not _REQUIRED[kind] <= len(raw) - 1 <= len(names):
            raise EventError(f"event {i}: a {kind} array has {len(raw) - 1} fields; vLLM's "
                             f"has {_REQUIRED[kind]} to {len(names)}")
        d = dict(zip(names, raw[1:]))
        d["type"] = kind
    else:
        raise EventError(f"event {i}: an event is a map tagged by 'type' or an array tagged "
                         f"first; got {type(raw).__name__}")
    if kind != "AllBlocksCleared":
        hashes = d.get("block_hashes")
        if not isinstance(hashes, (list, tuple)):
            raise EventError(f"event {i}: block_hashes must be a list; got "
                             f"{type(hashes).__name__}")
        d["block_hashes"] = [_hash("block_hashes", h) for h in hashes]
        if kind == "BlockStored" and d.get("parent_block_hash") is not None:
            d["parent_block_hash"] = _hash("parent_block_hash", d["parent_block_hash"])
    try:
        return d, event_from_dict(d)
    except EventError as exc:
        raise EventError(f"event {i}: {exc}") from None


def decode_batch(payload):
    """A batch's payload (bytes) as a ``WireBatch``, in either event
    encoding; ``EventError`` says what is malformed."""
    ts, events, rank = decode_events(payload)
    return WireBatch(ts, [d for d, _ in events], rank)


def decode_events(payload):
    """``decode_batch`` with each event as ``(dict, event object)``: the
    object checked, for ``RouterIndex.apply``, the dict with vLLM's
    further fields."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise EventError(f"a payload is bytes; got {type(payload).__name__}")
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several kinds for bad bytes
        raise EventError(f"the payload is not msgpack: {type(exc).__name__}: {exc}") from None
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, (list, tuple)) and len(raw) in (2, 3):
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) == 3 else None
    else:
        raise EventError("a KVEventBatch is [ts, events, data_parallel_rank] or its map; got "
                         f"{type(raw).__name__}" + (f" of {len(raw)}" if isinstance(raw, list)
                                                    else ""))
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise EventError(f"the batch's ts must be a number; got {type(ts).__name__}")
    if not isinstance(events, (list, tuple)):
        raise EventError(f"the batch's events must be a list; got {type(events).__name__}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
        raise EventError(f"data_parallel_rank must be an int; got {type(rank).__name__}")
    return float(ts), [_event(e, i) for i, e in enumerate(events)], rank


def _as_dict(event):
    if isinstance(event, (BlockStored, BlockRemoved, AllBlocksCleared)):
        return event.to_dict()
    if isinstance(event, dict):
        return event
    raise TypeError(f"an event is an event object or its dict; got {type(event).__name__}")


def encode_event(event, encoding="map"):
    """``event`` (an event object or dict; vLLM's further fields, such as
    ``group_idx``, taken from a dict) as vLLM encodes it, before msgpack:
    a dict (``"map"``: the fields at their default, None, left out) or a
    list of every field (``"array"``, ``"array-0.9"``: msgspec leaves no
    field out of an ``array_like`` struct)."""
    d = _as_dict(event)
    kind = d.get("type")
    if kind not in _FIELDS:
        raise ValueError(f"unknown event type {kind!r}")
    if encoding == "map":
        fields, optional = _FIELDS[kind]
        out = {"type": kind}
        out.update((f, d.get(f)) for f in fields)
        out.update((f, d[f]) for f in optional if d.get(f) is not None)
        return out
    if encoding in ("array", "array-0.9"):
        return [kind] + [d.get(f) for f in (_ARRAY if encoding == "array" else _ARRAY_09)[kind]]
    raise ValueError(f"encoding must be one of {ENCODINGS}; got {encoding!r}")


def _pack_event(e, encoding):
    body = encode_event(e, encoding)
    kind = body["type"] if isinstance(body, dict) else body[0]
    if isinstance(body, dict) and 1 + sum(map(len, _FIELDS[kind])) > 15:
        # msgspec sizes a struct's map header by the fields it may have:
        # BlockStored's 16 take a map16 even when fewer are written
        return (b"\xde" + len(body).to_bytes(2, "big")
                + b"".join(msgpack.packb(k) + msgpack.packb(v, use_bin_type=True)
                           for k, v in body.items()))
    return msgpack.packb(body, use_bin_type=True)


def encode_batch(events, *, ts=None, data_parallel_rank=0, encoding="map"):
    """The payload vLLM's publisher sends for ``events``, byte for byte:
    msgpack of ``[ts, events, data_parallel_rank]`` (``[ts, events]`` for
    ``"array-0.9"``), ``ts`` now by default."""
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}; got {encoding!r}")
    packer = msgpack.Packer(use_bin_type=True)
    parts = [packer.pack_array_header(2 if encoding == "array-0.9" else 3),
             packer.pack(float(time.time() if ts is None else ts)),
             packer.pack_array_header(len(events))]
    parts += [_pack_event(e, encoding) for e in events]
    if encoding != "array-0.9":
        parts.append(packer.pack(data_parallel_rank))
    return b"".join(parts)


class WirePublisher:
    """A publisher speaking vLLM's KV-event protocol, as ``ZmqEventPublisher``
    does: a PUB socket (high-water mark ``hwm``) bound at ``endpoint`` (an
    XPUB, which is a PUB on the wire and hears subscriptions:
    ``wait_subscribers``), a ROUTER at ``replay_endpoint`` (optional)
    answering replays from the last ``buffer_steps`` batches, with
    ``replay_topic`` (vLLM 0.34.0's replies, the default) or without
    (earlier ones). ``publish`` sends from the caller's thread; replay
    requests are served by ``serve_replay`` (call it) or by a thread
    (``serve=True``, the default). For tests: ``publish(..., send=False)``
    numbers and buffers a batch without sending it (a batch lost on the
    way), ``send_raw`` sends any frames, ``restart`` counts from 0 again.

    >>> pub = WirePublisher("tcp://127.0.0.1:*")
    >>> pub.endpoint.startswith("tcp://127.0.0.1:")
    True
    >>> pub.publish([BlockRemoved([1])], send=False), pub.publish([]), pub.seq
    (0, 1, 2)
    >>> pub.close()
    """

    def __init__(self, endpoint, replay_endpoint=None, *, topic="", buffer_steps=10_000,
                 hwm=100_000, encoding="map", data_parallel_rank=0, replay_topic=True,
                 serve=True, context=None):
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}; got {encoding!r}")
        self._ctx = context or zmq.Context.instance()
        self.encoding = encoding
        self.data_parallel_rank = data_parallel_rank
        self.topic = topic.encode("utf-8")
        self.replay_topic = replay_topic
        self.buffer = collections.deque(maxlen=buffer_steps)
        self.seq = 0
        self._lock = threading.Lock()
        # XPUB: a PUB on the wire that also hears subscriptions (wait_subscribers)
        self._pub = self._ctx.socket(zmq.XPUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._pub.setsockopt(zmq.SNDHWM, hwm)  # vLLM's hwm
        self.subscriptions = 0
        self.endpoint = self._bind(self._pub, endpoint)
        self._replay = None
        self.replay_endpoint = None
        if replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))  # as vLLM 0.34.0
            self.replay_endpoint = self._bind(self._replay, replay_endpoint)
        self._stop = threading.Event()
        self._thread = None
        if serve and self._replay is not None:
            self._thread = threading.Thread(target=self._serve, daemon=True,
                                            name="radix-soa-wire-replay")
            self._thread.start()

    @staticmethod
    def _bind(sock, endpoint):
        """Bind; a ``*`` port binds a free one (the endpoint says which)."""
        if endpoint.startswith("tcp://") and endpoint.endswith(":*"):
            port = sock.bind_to_random_port(endpoint[:-2])
            return f"{endpoint[:-2]}:{port}"
        sock.bind(endpoint)
        return endpoint

    def publish(self, events, *, ts=None, send=True):
        """Number, encode, buffer and send a batch; its seq."""
        payload = encode_batch(events, ts=ts, data_parallel_rank=self.data_parallel_rank,
                               encoding=self.encoding)
        with self._lock:
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, payload))
            if send:
                self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        return seq

    def wait_subscribers(self, n=1, timeout=10.0):
        """Wait until ``n`` subscriptions in all have reached the socket (a
        batch sent before a subscriber's subscription arrives is lost to
        it, as with vLLM's); whether they did within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.subscriptions < n:
            left = deadline - time.monotonic()
            with self._lock:
                if left <= 0 or not self._pub.poll(max(1, int(left * 1000))):
                    return self.subscriptions >= n
                msg = self._pub.recv()
            if msg[:1] == b"\x01":
                self.subscriptions += 1
        return True

    def restart(self):
        """Count from 0 again with an empty buffer, as the publisher of a
        restarted engine does (on the same sockets)."""
        with self._lock:
            self.seq = 0
            self.buffer.clear()

    def send_raw(self, frames):
        """Send ``frames`` as one multipart message on the PUB socket."""
        with self._lock:
            self._pub.send_multipart(list(frames))

    def serve_replay(self, timeout_ms=0):
        """Answer the replay requests waiting (after up to ``timeout_ms``);
        how many."""
        n = 0
        while self._replay is not None and self._replay.poll(timeout_ms if n == 0 else 0):
            frames = self._replay.recv_multipart()
            n += 1
            if len(frames) != 3:
                continue  # vLLM logs and drops a malformed request
            client, _, start = frames
            start = int.from_bytes(start, "big")
            with self._lock:
                held = [(s, p) for s, p in self.buffer if s >= start]
            head = [client, b""] + ([self.topic] if self.replay_topic else [])
            for s, p in held:
                self._replay.send_multipart(head + [s.to_bytes(8, "big"), p])
            end = [client, b""] + ([b""] if self.replay_topic else [])
            self._replay.send_multipart(end + [END_SEQ, b""])
        return n

    def _serve(self):
        while not self._stop.is_set():
            try:
                self.serve_replay(50)
            except zmq.ZMQError:
                if self._stop.is_set():
                    return
                raise

    def close(self):
        """Stop serving and close the sockets."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._pub.close(0)
        if self._replay is not None:
            self._replay.close(0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
