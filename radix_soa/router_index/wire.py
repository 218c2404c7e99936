"""``RouterIndex.apply_wire``: a vLLM ``KVEventBatch`` applied from its
msgpack bytes, read by a Numba kernel (``_kernels.wire``) into arrays and
applied by another (``_kernels.router_keys.rx_apply_events``), with no
Python object per event. Bound as a method by ``core.RouterIndex``.
"""

from typing import NamedTuple

import numpy as np

from .._events.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored, EventError,
                                 extra_hash)
from .._input.validate import check_int
from .._kernels import router_keys as hx
from .._kernels import wire as W
from .events import _engine_hashes_on, _interrupted, _settle
from .workers import worker_id

_BOOL = (bool, np.bool_)
MASK64 = (1 << 64) - 1
_SEG = 6  # a strict call's undo step: events a..b applied by the kernel
ONE_PASS = 1 << 20  # payloads up to this many bytes are read in one pass

_MESSAGES = {
    W.W_TRUNCATED: "the payload ends inside an item",
    W.W_BATCH: "a KVEventBatch is [ts, events, data_parallel_rank] or its map",
    W.W_TS: "the batch's ts must be a number",
    W.W_EVENTS: "the batch's events must be a list",
    W.W_EVENT: "an event is a map tagged by 'type' or an array tagged first",
    W.W_TYPE: "unknown event type (expected AllBlocksCleared, BlockRemoved or BlockStored)",
    W.W_HASH: "a block hash must be an int or non-empty bytes",
    W.W_INT: "lora_id and group_idx must be null or ints in [-2**63, 2**63)",
    W.W_LIST: "block_hashes and token_ids must be lists",
    W.W_STR: "medium and lora_name must be null or strings",
    W.W_MISSING: "a BlockStored needs block_hashes, parent_block_hash, token_ids and "
                 "block_size, a BlockRemoved block_hashes",
    W.W_TOKENS: "token_ids must hold len(block_hashes) * block_size ints in [-2**63, 2**63)",
    W.W_BLOCK_SIZE: "block_size must be a positive int",
    W.W_RANK: "data_parallel_rank must be null or an int",
    W.W_FIELDS: "an event with a number of fields vLLM's never has, or a map key that is not "
                "a string",
    W.W_TRAILING: "bytes after the batch",
}


class WireApplied(NamedTuple):
    """What ``RouterIndex.apply_wire`` read: ``events`` (the batch's events
    to apply), ``skipped`` (those of another medium or KV cache group), the
    batch's ``ts`` and ``data_parallel_rank`` (None when absent), and
    ``duplicate`` (a ``seq`` already applied: nothing changed)."""
    events: int
    skipped: int
    ts: float
    data_parallel_rank: object
    duplicate: bool


class WireBatch(NamedTuple):
    """A batch's payload read and checked by ``RouterIndex.read_wire``
    (``payload`` itself, its events as arrays, ``ts``, ``rank``), which
    ``apply_wire`` takes in place of the bytes: a feed that must know
    whether a payload is readable before it applies it reads it once."""
    payload: bytes
    ev: np.ndarray
    hashes: np.ndarray
    tokens: np.ndarray
    ts: float
    rank: object


def _fail(err, what=None):
    pos, i = int(err[1]), int(err[2])
    where = f"byte {pos}" + (f", event {i}" if i >= 0 else "")
    return EventError(f"{where}: {what or _MESSAGES.get(int(err[0]), 'malformed')}")


def decode(payload):
    """A batch's payload as arrays (``_kernels.wire``), checked: a
    ``WireBatch``, or an ``EventError`` naming the byte offset and the
    event.

    >>> from radix_soa.integrations.vllm_wire import encode_batch
    >>> b = decode(encode_batch([{"type": "AllBlocksCleared"}]))
    >>> b.ev.shape[0], b.rank
    (1, 0)
    """
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise EventError(f"a payload is bytes; got {type(payload).__name__}")
    buf = np.frombuffer(payload, np.uint8)
    out = np.zeros(W.O_SIZE, np.int64)
    err = np.zeros(3, np.int64)
    size = buf.shape[0]
    if size <= ONE_PASS:  # one pass into arrays as large as the bytes could fill
        ev = np.empty((size // W.MIN_EVENT + 1, W.E_SIZE), np.int64)
        hashes = np.empty(size, np.uint64)
        tokens = np.empty(size, np.int64)
        if W.read_batch(buf, True, ev, hashes, tokens, out, err) < 0:
            raise _fail(err)
        ev = ev[:int(out[W.O_EVENTS])]
        hashes = hashes[:int(out[W.O_HASHES])]
        tokens = tokens[:int(out[W.O_TOKENS])]
    else:  # a count, then the arrays of that size
        one = np.zeros((1, W.E_SIZE), np.int64)
        none64 = np.zeros(0, np.uint64)
        if W.read_batch(buf, False, one, none64, none64.view(np.int64), out, err) < 0:
            raise _fail(err)
        ev = np.empty((int(out[W.O_EVENTS]), W.E_SIZE), np.int64)
        hashes = np.empty(int(out[W.O_HASHES]), np.uint64)
        tokens = np.empty(int(out[W.O_TOKENS]), np.int64)
        W.read_batch(buf, True, ev, hashes, tokens, out, err)
    kind, bits = int(out[W.O_TS_KIND]), np.array([out[W.O_TS]], np.int64)
    ts = float(bits[0]) if kind == 0 else float(
        bits.view(np.float64)[0] if kind == 8 else bits.astype(np.uint32).view(np.float32)[0])
    rank = int(out[W.O_RANK]) if out[W.O_HAS_RANK] else None
    return WireBatch(payload, ev, hashes, tokens, ts, rank)


def _strings(payload, ev, rows, off, ln):
    """The str at ``ev[r, off]`` (``ev[r, ln]`` bytes) of each of ``rows``."""
    out = {}
    for r in rows.tolist():
        s, n = int(ev[r, off]), int(ev[r, ln])
        try:
            out[r] = bytes(payload[s:s + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise _fail([0, s, r], "a string that is not UTF-8") from None
    return out


def _extra_lists(payload, ev, rows):
    """The decoded ``extra_keys`` of each of ``rows`` (events that have them)."""
    if not rows.shape[0]:
        return {}
    import msgpack
    out = {}
    for r in rows.tolist():
        s, n = int(ev[r, W.E_X_OFF]), int(ev[r, W.E_X_LEN])
        x = msgpack.unpackb(bytes(payload[s:s + n]), raw=False, strict_map_key=False)
        if not isinstance(x, list) or len(x) > int(ev[r, W.E_HN]):
            raise _fail([0, s, r], "extra_keys must be null or a list of at most one entry "
                        "per block")
        out[r] = x
    return out


def _prepare(self, payload, b, medium, group_idx):
    """The batch's per-event seeds, per-page extras, wanted mask and its
    events' strings, checked before anything changes."""
    ev = b.ev
    kind = ev[:, W.E_KIND]
    stored = kind == W.K_STORED
    wanted = np.ones(ev.shape[0], np.int8)
    if medium is not None:
        mh = np.array([W.name_hash(medium)], np.uint64).view(np.int64)[0] | 1
        m = ev[:, W.E_MEDIUM]
        wanted &= ((m == 0) | (m == mh)).astype(np.int8)
    if group_idx is not None:
        wanted &= ((ev[:, W.E_HAS_GROUP] == 0) | (ev[:, W.E_GROUP] == group_idx)).astype(np.int8)
    wanted[kind == W.K_CLEARED] = 1
    bad = np.flatnonzero(stored & (wanted == 1) & (ev[:, W.E_BS] != self._page))
    if bad.shape[0]:
        r = int(bad[0])
        raise _fail([0, ev[r, W.E_POS], r], f"block_size {int(ev[r, W.E_BS])} but this index "
                    f"has page_size {self._page}")
    names = _strings(payload, ev, np.flatnonzero(stored & (ev[:, W.E_NAME_LEN] >= 0)),
                     W.E_NAME_OFF, W.E_NAME_LEN)
    extra = _extra_lists(payload, ev, np.flatnonzero(stored & (ev[:, W.E_X_LEN] >= 0)))
    seeds = np.full(ev.shape[0], self._seed_none, np.uint64)
    for r in np.flatnonzero(stored & ((ev[:, W.E_NAME_LEN] >= 0) | (
            (ev[:, W.E_HAS_LORA_ID] == 1) & (ev[:, W.E_LORA_ID] != 0)))).tolist():
        seeds[r] = self._seed(names[r] if r in names else int(ev[r, W.E_LORA_ID]))
    extras = np.zeros(b.hashes.shape[0] if extra else 0, np.uint64)
    for r, x in extra.items():
        h0 = int(ev[r, W.E_H0])
        try:
            for j, keys in enumerate(x):
                extras[h0 + j] = extra_hash(keys, names.get(r))
        except (TypeError, ValueError) as exc:
            raise _fail([0, ev[r, W.E_X_OFF], r], f"extra_keys: {exc}") from None
    return seeds, extras, wanted, names, extra


def _event_at(self, b, r, names, extra):
    """Event ``r`` of the batch as an object (the slow path's)."""
    ev = b.ev
    kind = int(ev[r, W.E_KIND])
    if kind == W.K_CLEARED:
        return AllBlocksCleared()
    h0, hn = int(ev[r, W.E_H0]), int(ev[r, W.E_HN])
    hs = b.hashes[h0:h0 + hn].tolist()
    if kind == W.K_REMOVED:
        return BlockRemoved(hs)
    t0 = int(ev[r, W.E_T0])
    parent = int(ev[r, W.E_PARENT]) & MASK64 if ev[r, W.E_HASP] else None
    lora_id = int(ev[r, W.E_LORA_ID]) if ev[r, W.E_HAS_LORA_ID] else None
    return BlockStored(hs, parent, b.tokens[t0:t0 + hn * self._page].tolist(), self._page,
                       lora_id, None, names.get(r), extra.get(r))


def apply_wire(self, worker, payload, *, seq=None, strict=None, medium=None, group_idx=None):
    """Apply the events of one vLLM ``KVEventBatch`` that ``worker``
    published, from its msgpack payload (the map and the array event
    forms, vLLM 0.9 to 0.34), as ``apply`` would apply them (``strict``,
    ``seq`` as there), without a Python object per event: the payload is
    read into arrays by a Numba kernel and the events applied by another,
    every page keyed by its tokens. A malformed payload raises
    ``EventError`` naming the byte offset and the event, before anything
    changes. ``medium`` / ``group_idx``: apply only the events of that
    medium / KV cache group (and those that name none). Returns a
    ``WireApplied``.

    Parameters
    ----------
    worker : int, str or tuple
        The worker id.
    payload : bytes or WireBatch
        The batch's msgpack payload, as vLLM's ``ZmqEventPublisher`` sends it
        (or what ``read_wire`` read of it).
    seq : int or None
        This batch's number in the worker's stream (a duplicate is skipped).
    strict : bool or None
        All or nothing (True), degrade instead (False), or the index's mode.
    medium : str or None
        The medium whose events apply (None: every one).
    group_idx : int or None
        The KV cache group whose events apply (None: every one).

    >>> import radix_soa as rs
    >>> from radix_soa.integrations.vllm_wire import encode_batch
    >>> ix = rs.RouterIndex(page_size=2)
    >>> payload = encode_batch([{"type": "BlockStored", "block_hashes": [b"x" * 32],
    ...                          "parent_block_hash": None, "token_ids": [1, 2], "block_size": 2}])
    >>> ix.apply_wire("w", payload).events, ix.overlap([1, 2, 3]).tolist()
    (1, [2])
    >>> ix.apply_wire("w", payload[:-3])
    Traceback (most recent call last):
    ...
    radix_soa._events.kv_events.EventError: byte 141, event 0: the payload ends inside an item
    """
    worker = worker_id(worker)
    if strict is None:
        strict = self._strict
    elif not isinstance(strict, _BOOL):
        raise TypeError(f"strict must be a bool or None; got {type(strict).__name__}")
    if seq is not None:
        seq = check_int("seq", seq, minimum=0)
    if medium is not None and not isinstance(medium, str):
        raise TypeError(f"medium must be None or a str; got {type(medium).__name__}")
    if group_idx is not None:
        group_idx = check_int("group_idx", group_idx)
    b = payload if isinstance(payload, WireBatch) else decode(payload)
    payload = b.payload
    prep = _prepare(self, payload, b, medium, group_idx)
    applied = int(np.count_nonzero(prep[2]))
    with self._writing:
        skip, gap = self._seq_check(worker, seq, strict)
        if skip:
            return WireApplied(applied, b.ev.shape[0] - applied, b.ts, b.rank, True)
        new = worker not in self._cols
        col = self._column(worker, True)
        if self._none_hash is not None or not _fits(self, b, prep[2]):
            seeds, extras, wanted, names, extra = prep
            parsed = [self._event_at(b, r, names, extra)
                      for r in np.flatnonzero(wanted).tolist()]
            if strict:
                self._apply_strict(worker, col, new, parsed)
            else:
                self._apply_lenient(worker, col, new, parsed, gap)
        elif strict:
            self._wire_strict(worker, col, new, b, prep)
        else:
            self._wire_lenient(worker, col, new, b, prep, gap)
        if new:
            self._register(worker, col)
        if seq is not None:
            self._seq[worker] = seq
        self._fit()
    return WireApplied(applied, b.ev.shape[0] - applied, b.ts, b.rank, False)


def _fits(self, b, wanted):
    """Whether the kernel may apply this batch: unbounded, or its stored
    pages within half the budget's nodes (room made for them at once,
    forgetting others; a larger batch goes event by event)."""
    if self._max_bytes is None:
        return True
    stored = (b.ev[:, W.E_KIND] == W.K_STORED) & (wanted == 1)
    return 2 * int(b.ev[:, W.E_HN][stored].sum()) <= self._node_budget()


def _run(self, col, b, prep, start, out, reached=None):
    """``rx_apply_events`` from event ``start`` (room made for the pages
    stored from there; the handle map grown when an event needs it); the
    event it stopped at. ``reached[0]``: the events applied so far (below
    it), kept up to date for a caller that must undo them on a fault."""
    seeds, extras, wanted = prep[0], prep[1], prep[2]
    ev = b.ev
    stored = (ev[start:, W.E_KIND] == W.K_STORED) & (wanted[start:] == 1)
    self._reserve(int(ev[start:, W.E_HN][stored].sum()))
    w, bit = self._bit(col)
    keys_out, parents_out, hasp_out, ehs_out, had_out, codes = out
    hn = int(ev[:, W.E_HN].max(initial=0))
    seen = self._seen_for(hn)
    pend = np.empty(hn, np.int64)
    while True:
        m = self._hmaps[col]
        hcount = np.array([m[2], 0], np.int64)
        k = hx.rx_apply_events(
            self._table, self._keys, self._pkeys, self._flags, self._masks, self._meta,
            self._etable, self._ehash, w, bit, m[0], m[1], seen, ev, b.hashes, b.tokens,
            extras, seeds, self._page, start, wanted, keys_out, parents_out, hasp_out, ehs_out,
            had_out, codes, hcount, self._stamps, pend)
        if reached is not None:
            reached[0] = k
        m[2] = int(hcount[0])
        if hcount[1] == 0:
            return k
        # event k - 1's entries the map had no room for: put, then on from event k
        h0 = int(ev[k - 1, W.E_H0])
        at = h0 + pend[:int(hcount[1])]
        self._handle_put(col, b.hashes[at], keys_out[at])
        start = k


def _outputs(b):
    n = b.hashes.shape[0]
    return (np.empty(n, np.uint64), np.empty(n, np.uint64), np.empty(n, np.int8),
            np.empty(n, np.uint64), np.zeros(n, np.int8), np.empty(n, np.int8))


def _wire_lenient(self, worker, col, new, b, prep, gap):
    """The kernel applies what applies as it is; each other event (a
    clear, a problem) the way ``apply`` does, the worker degraded by the
    first problem since its last clear."""
    out = _outputs(b)
    problem = self._status.get(worker, gap)
    n = b.ev.shape[0]
    k = 0
    try:
        while True:
            k = self._wire_run(col, b, prep, k, out)
            if k >= n:
                break
            e = self._event_at(b, k, prep[3], prep[4])
            found = self._apply_one(k, col, worker, e, None)
            if isinstance(e, AllBlocksCleared):
                problem = None
            elif problem is None:
                problem = found
            k += 1
    except BaseException:
        _interrupted(self, worker, col, new, n)
        raise
    _settle(self, worker, problem)
    _engine_hashes_on(self, col)


def _wire_strict(self, worker, col, new, b, prep):
    """All or nothing: the kernel's runs and the events applied one by one
    are undone together on the first problem."""
    out = _outputs(b)
    n = b.ev.shape[0]
    undo = []
    k = 0
    try:
        while True:
            reached = [k]
            try:  # (a fault while the handle map grows: the kernel's events undone too)
                j = self._wire_run(col, b, prep, k, out, reached)
            finally:
                undo.append((_SEG, col, b, prep[2], out, k, reached[0]))
            if j >= n:
                break
            self._apply_one(j, col, worker, self._event_at(b, j, prep[3], prep[4]), undo)
            k = j + 1
    except BaseException:
        self._undo(undo)
        if new:
            self._col_ids[col] = None
        raise
    _engine_hashes_on(self, col)


def undo_run(self, col, b, wanted, out, start, stop):
    """Undo the kernel's events ``start..stop-1`` (``_SEG``), last first."""
    keys_out, parents_out, hasp_out, ehs_out, had_out, _ = out
    w, bit = self._bit(col)
    ev = b.ev
    for e in range(stop - 1, start - 1, -1):
        if not wanted[e]:
            continue
        h0, hn = int(ev[e, W.E_H0]), int(ev[e, W.E_HN])
        eh, ks = b.hashes[h0:h0 + hn], keys_out[h0:h0 + hn]
        if ev[e, W.E_KIND] == W.K_STORED:
            self._handle_del(col, eh)  # the kernel stored only pages new to the worker
            self._drop_held(w, bit, ks)
        else:
            had = had_out[h0:h0 + hn] == 1
            self._add(w, bit, ks, parents_out[h0:h0 + hn], hasp_out[h0:h0 + hn],
                      ehs_out[h0:h0 + hn])
            self._handle_put(col, eh[had], ks[had])
