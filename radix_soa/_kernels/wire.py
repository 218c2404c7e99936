"""vLLM's ``KVEventBatch`` read straight from its msgpack bytes into
arrays (``RouterIndex.apply_wire``): no Python object per event.

The schema is fixed (``radix_soa.integrations.vllm_wire`` restates it):
the batch is ``[ts, events, data_parallel_rank]`` (or ``[ts, events]``) or
the map of those names; an event is a map tagged under ``"type"`` or an
array tagged first, of ``BlockStored`` (``block_hashes``,
``parent_block_hash``, ``token_ids``, ``block_size``, ``lora_id``,
``medium``, ``lora_name``, ``extra_keys``, ``group_idx``, then fields read
past), ``BlockRemoved`` (``block_hashes``, ``medium``, ``group_idx``) or
``AllBlocksCleared``. Map keys are matched by a 64-bit FNV-1a hash of
their bytes (``name_hash``).

``read_batch`` runs twice: counting (``fill`` False: the events, hashes and
tokens, so the caller sizes the outputs) and filling. Per event a row of
``ev`` (``E_*`` columns); hashes as uint64 (an int's 64-bit pattern, bytes
by their low 64 bits big-endian: vLLM's int form), tokens as int64. A
malformed payload stops it with ``err = [code, byte offset, event index]``
(``W_*`` codes; the offset of the item at fault).

Call graph (callers after their callees): _fnv -> name_hash; _be, _fail,
_need -> _int, _signed, _span, _container, _is_map, _is_array -> _skip,
_hash -> _field -> _event -> read_batch
"""

import numpy as np

from .config import kernel, kernel_helper, kernel_inner

# ev's columns
E_KIND, E_H0, E_HN, E_PARENT, E_HASP, E_T0, E_TN, E_BS = 0, 1, 2, 3, 4, 5, 6, 7
E_LORA_ID, E_HAS_LORA_ID, E_NAME_OFF, E_NAME_LEN, E_MEDIUM = 8, 9, 10, 11, 12
E_X_OFF, E_X_LEN, E_GROUP, E_HAS_GROUP, E_POS, E_SEEN = 13, 14, 15, 16, 17, 18
E_SIZE = 19
MIN_EVENT = 13  # the fewest bytes of an event: an array head and "BlockStored"
K_STORED, K_REMOVED, K_CLEARED = 0, 1, 2
# out: the batch's scalars
O_TS_KIND, O_TS, O_RANK, O_HAS_RANK, O_EVENTS, O_HASHES, O_TOKENS = 0, 1, 2, 3, 4, 5, 6
O_SIZE = 7
# err codes
W_OK, W_TRUNCATED, W_BATCH, W_TS, W_EVENTS, W_EVENT, W_TYPE, W_HASH, W_INT, W_LIST = range(10)
W_STR, W_MISSING, W_TOKENS, W_BLOCK_SIZE, W_RANK, W_FIELDS, W_TRAILING = range(10, 17)

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


def name_hash(name):
    """FNV-1a 64 of ``name``'s UTF-8 bytes, as a uint64 (Python; the
    kernel's own is ``_fnv``)."""
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return np.uint64(h)


# the names the reader matches, by hash (ints: Numba folds them in)
N_TYPE, N_TS, N_EVENTS, N_RANK = (name_hash("type"), name_hash("ts"), name_hash("events"),
                                  name_hash("data_parallel_rank"))
N_STORED, N_REMOVED, N_CLEARED = (name_hash("BlockStored"), name_hash("BlockRemoved"),
                                  name_hash("AllBlocksCleared"))
N_HASHES, N_PARENT, N_TOKENS, N_BS = (name_hash("block_hashes"), name_hash("parent_block_hash"),
                                      name_hash("token_ids"), name_hash("block_size"))
N_LORA_ID, N_MEDIUM, N_LORA_NAME, N_EXTRA, N_GROUP = (
    name_hash("lora_id"), name_hash("medium"), name_hash("lora_name"), name_hash("extra_keys"),
    name_hash("group_idx"))
# the array form's fields in order (vLLM before PR #42892)
STORED_ORDER = (N_HASHES, N_PARENT, N_TOKENS, N_BS, N_LORA_ID, N_MEDIUM, N_LORA_NAME, N_EXTRA,
                N_GROUP)
REMOVED_ORDER = (N_HASHES, N_MEDIUM, N_GROUP)


@kernel_inner
def _fnv(buf, s, n):
    h = _FNV_OFFSET
    for i in range(s, s + n):
        h = (h ^ np.uint64(buf[i])) * _FNV_PRIME
    return h


@kernel_inner
def _be(buf, s, n):
    """The big-endian unsigned int of ``buf[s:s+n]`` (n <= 8)."""
    v = np.uint64(0)
    for i in range(s, s + n):
        v = (v << np.uint64(8)) | np.uint64(buf[i])
    return v


@kernel_helper
def _fail(err, code, pos, i):
    if err[0] == W_OK:
        err[0] = code
        err[1] = pos
        err[2] = i
    return -1


@kernel_helper
def _need(buf, p, n, err, i):
    """``p`` if ``n`` bytes are there from ``p``, else -1 (truncated)."""
    if p < 0 or p + n > buf.shape[0]:
        return _fail(err, W_TRUNCATED, max(p, 0), i)
    return p


@kernel_inner
def _int(buf, p, err, i, code):
    """``(value as uint64 bits, signed?, next)`` of the int at ``p``
    (next -1 if it is not one: error ``code``)."""
    if _need(buf, p, 1, err, i) < 0:
        return np.uint64(0), False, -1
    b = np.int64(buf[p])
    if b <= 0x7F:
        return np.uint64(b), False, p + 1
    if b >= 0xE0:
        return np.uint64(b - 256), True, p + 1
    if 0xCC <= b <= 0xCF:
        n = 1 << (b - 0xCC)
        if _need(buf, p + 1, n, err, i) < 0:
            return np.uint64(0), False, -1
        return _be(buf, p + 1, n), False, p + 1 + n
    if 0xD0 <= b <= 0xD3:
        n = 1 << (b - 0xD0)
        if _need(buf, p + 1, n, err, i) < 0:
            return np.uint64(0), False, -1
        v = _be(buf, p + 1, n)
        if n < 8:  # sign-extend
            sh = np.uint64(64 - 8 * n)
            v = np.uint64(np.int64(v << sh) >> np.int64(sh))
        return v, True, p + 1 + n
    _fail(err, code, p, i)
    return np.uint64(0), False, -1


@kernel
def _signed(buf, p, err, i, code):
    """``(int64 value, next)`` of an int that must fit int64."""
    v, neg, q = _int(buf, p, err, i, code)
    if q < 0:
        return np.int64(0), -1
    if not neg and v > np.uint64(0x7FFFFFFFFFFFFFFF):
        _fail(err, code, p, i)
        return np.int64(0), -1
    return np.int64(v), q


@kernel_inner
def _span(buf, p, err, i, code, binary):
    """``(start, length, next)`` of the str (``binary``: bin) at ``p``."""
    if _need(buf, p, 1, err, i) < 0:
        return 0, 0, -1
    b = np.int64(buf[p])
    if not binary and 0xA0 <= b <= 0xBF:
        n, h = b & 0x1F, 1
    elif (not binary and 0xD9 <= b <= 0xDB) or (binary and 0xC4 <= b <= 0xC6):
        w = 1 << (b - (0xD9 if not binary else 0xC4))
        if _need(buf, p + 1, w, err, i) < 0:
            return 0, 0, -1
        n, h = np.int64(_be(buf, p + 1, w)), 1 + w
    else:
        _fail(err, code, p, i)
        return 0, 0, -1
    if _need(buf, p + h, n, err, i) < 0:
        return 0, 0, -1
    return p + h, n, p + h + n


@kernel_inner
def _container(buf, p, err, i, code, is_map):
    """``(items, next)`` of the array (``is_map``: map) head at ``p``."""
    if _need(buf, p, 1, err, i) < 0:
        return 0, -1
    b = np.int64(buf[p])
    fix, w16 = (0x80, 0xDE) if is_map else (0x90, 0xDC)
    if fix <= b <= fix + 15:
        return b - fix, p + 1
    if b == w16 or b == w16 + 1:
        w = 2 if b == w16 else 4
        if _need(buf, p + 1, w, err, i) < 0:
            return 0, -1
        return np.int64(_be(buf, p + 1, w)), p + 1 + w
    _fail(err, code, p, i)
    return 0, -1


@kernel_inner
def _is_map(buf, p):
    b = buf[p]
    return (0x80 <= b <= 0x8F) or b == 0xDE or b == 0xDF


@kernel_inner
def _is_array(buf, p):
    b = buf[p]
    return (0x90 <= b <= 0x9F) or b == 0xDC or b == 0xDD


@kernel_inner
def _skip(buf, p, err, i):
    """The position past the object at ``p`` (any msgpack), or -1."""
    left = 1
    while left > 0:
        if _need(buf, p, 1, err, i) < 0:
            return -1
        b = np.int64(buf[p])
        left -= 1
        if b <= 0x7F or b >= 0xE0 or b == 0xC0 or b == 0xC2 or b == 0xC3:
            p += 1
        elif b <= 0x8F:
            left += 2 * (b - 0x80)
            p += 1
        elif b <= 0x9F:
            left += b - 0x90
            p += 1
        elif b <= 0xBF:
            p += 1 + (b - 0xA0)
        elif 0xC4 <= b <= 0xC6 or 0xD9 <= b <= 0xDB:
            w = 1 << (b - (0xC4 if b <= 0xC6 else 0xD9))
            if _need(buf, p + 1, w, err, i) < 0:
                return -1
            p += 1 + w + np.int64(_be(buf, p + 1, w))
        elif 0xC7 <= b <= 0xC9:
            w = 1 << (b - 0xC7)
            if _need(buf, p + 1, w, err, i) < 0:
                return -1
            p += 2 + w + np.int64(_be(buf, p + 1, w))
        elif b == 0xCA or b == 0xCB:
            p += 5 if b == 0xCA else 9
        elif 0xCC <= b <= 0xD3:
            p += 1 + (1 << ((b - 0xCC) & 3))
        elif 0xD4 <= b <= 0xD8:
            p += 2 + (1 << (b - 0xD4))
        elif b == 0xDC or b == 0xDD or b == 0xDE or b == 0xDF:
            w = 2 if b == 0xDC or b == 0xDE else 4
            if _need(buf, p + 1, w, err, i) < 0:
                return -1
            n = np.int64(_be(buf, p + 1, w))
            left += n if b <= 0xDD else 2 * n
            p += 1 + w
        else:  # 0xC1: never used
            return _fail(err, W_FIELDS, p, i)
    return _need(buf, p, 0, err, i)


@kernel
def _hash(buf, p, err, i):
    """``(hash as uint64, next)``: an int's bits, or bytes' low 64 bits."""
    if _need(buf, p, 1, err, i) < 0:
        return np.uint64(0), -1
    b = buf[p]
    if 0xC4 <= b <= 0xC6:
        s, n, q = _span(buf, p, err, i, W_HASH, True)
        if q < 0:
            return np.uint64(0), -1
        if n == 0:
            _fail(err, W_HASH, p, i)
            return np.uint64(0), -1
        k = min(n, 8)
        return _be(buf, s + n - k, k), q
    v, neg, q = _int(buf, p, err, i, W_HASH)
    return v, q


@kernel_inner
def _field(buf, p, name, row, hashes, tokens, counts, fill, err, i):
    """Read the value at ``p`` of field ``name`` into ``row``; the next position."""
    nil = buf[p] == 0xC0 if p < buf.shape[0] else False
    if name == N_HASHES or name == N_TOKENS:
        n, p = _container(buf, p, err, i, W_LIST, False)
        if p < 0:
            return -1
        is_h = name == N_HASHES
        at = counts[0] if is_h else counts[1]
        if is_h:
            row[E_H0], row[E_HN] = at, n
        else:
            row[E_T0], row[E_TN] = at, n
        if _need(buf, p, n, err, i) < 0:  # at least a byte an item
            return -1
        end = buf.shape[0]
        for j in range(n):
            if is_h:
                v, p = _hash(buf, p, err, i)
                if p >= 0 and fill:
                    hashes[at + j] = v
            else:
                b = buf[p]
                if b <= 0x7F:  # the common token forms, inline
                    t = np.int64(b)
                    p += 1
                elif b == 0xCD and p + 3 <= end:
                    t = (np.int64(buf[p + 1]) << 8) | np.int64(buf[p + 2])
                    p += 3
                elif b == 0xCE and p + 5 <= end:
                    t = np.int64(_be(buf, p + 1, 4))
                    p += 5
                elif b == 0xCC and p + 2 <= end:
                    t = np.int64(buf[p + 1])
                    p += 2
                else:
                    t, p = _signed(buf, p, err, i, W_TOKENS)
                if p >= 0 and fill:
                    tokens[at + j] = t
            if p < 0:
                return -1
        if is_h:
            counts[0] += n
        else:
            counts[1] += n
        row[E_SEEN] |= 1 if is_h else 4
        return p
    if name == N_PARENT:
        row[E_SEEN] |= 2
        if nil:
            return p + 1
        v, p = _hash(buf, p, err, i)
        row[E_PARENT], row[E_HASP] = np.int64(v), 1
        return p
    if name == N_BS:
        v, q = _signed(buf, p, err, i, W_BLOCK_SIZE)
        row[E_BS] = v
        row[E_SEEN] |= 8
        return q
    if nil:
        return p + 1
    if name == N_LORA_ID or name == N_GROUP:
        v, q = _signed(buf, p, err, i, W_INT)
        if name == N_LORA_ID:
            row[E_LORA_ID], row[E_HAS_LORA_ID] = v, 1
        else:
            row[E_GROUP], row[E_HAS_GROUP] = v, 1
        return q
    if name == N_MEDIUM or name == N_LORA_NAME:
        s, n, q = _span(buf, p, err, i, W_STR, False)
        if q >= 0:
            if name == N_MEDIUM:
                row[E_MEDIUM] = np.int64(_fnv(buf, s, n)) | 1  # never 0 (none)
            else:
                row[E_NAME_OFF], row[E_NAME_LEN] = s, n
        return q
    q = _skip(buf, p, err, i)
    if name == N_EXTRA and q >= 0:
        row[E_X_OFF], row[E_X_LEN] = p, q - p
    return q


@kernel
def _event(buf, p, row, hashes, tokens, counts, fill, err, i):
    """Read event ``i`` at ``p`` into ``row``; the next position, or -1."""
    row[:] = 0
    row[E_NAME_LEN] = row[E_X_LEN] = -1
    row[E_POS] = p
    if _need(buf, p, 1, err, i) < 0:
        return -1
    kind = -1
    if _is_map(buf, p):
        n, p = _container(buf, p, err, i, W_EVENT, True)
        for _ in range(n):
            s, ln, q = _span(buf, p, err, i, W_FIELDS, False)
            if q < 0:
                return -1
            name = _fnv(buf, s, ln)
            if name == N_TYPE:
                s, ln, p = _span(buf, q, err, i, W_TYPE, False)
                if p < 0:
                    return -1
                t = _fnv(buf, s, ln)
                kind = (K_STORED if t == N_STORED else K_REMOVED if t == N_REMOVED
                        else K_CLEARED if t == N_CLEARED else -1)
                if kind < 0:
                    return _fail(err, W_TYPE, s - 1, i)
            else:
                p = _field(buf, q, name, row, hashes, tokens, counts, fill, err, i)
            if p < 0:
                return -1
    elif _is_array(buf, p):
        n, p = _container(buf, p, err, i, W_EVENT, False)
        if n < 1:
            return _fail(err, W_EVENT, row[E_POS], i)
        s, ln, p = _span(buf, p, err, i, W_TYPE, False)
        if p < 0:
            return -1
        t = _fnv(buf, s, ln)
        kind = (K_STORED if t == N_STORED else K_REMOVED if t == N_REMOVED
                else K_CLEARED if t == N_CLEARED else -1)
        if kind < 0:
            return _fail(err, W_TYPE, s - 1, i)
        lo, hi = (4, 11) if kind == K_STORED else (1, 3) if kind == K_REMOVED else (0, 0)
        if not lo <= n - 1 <= hi:
            return _fail(err, W_FIELDS, row[E_POS], i)
        for j in range(n - 1):
            if kind == K_STORED and j < len(STORED_ORDER):
                name = np.uint64(STORED_ORDER[j])
            elif kind == K_REMOVED and j < len(REMOVED_ORDER):
                name = np.uint64(REMOVED_ORDER[j])
            else:
                name = np.uint64(0)
            p = _field(buf, p, name, row, hashes, tokens, counts, fill, err, i)
            if p < 0:
                return -1
    else:
        return _fail(err, W_EVENT, p, i)
    if kind < 0:
        return _fail(err, W_TYPE, row[E_POS], i)
    row[E_KIND] = kind
    seen = row[E_SEEN]
    if kind == K_STORED:
        if seen & 15 != 15:
            return _fail(err, W_MISSING, row[E_POS], i)
        if row[E_BS] < 1:
            return _fail(err, W_BLOCK_SIZE, row[E_POS], i)
        if row[E_TN] != row[E_HN] * row[E_BS]:
            return _fail(err, W_TOKENS, row[E_POS], i)
    elif kind == K_REMOVED and seen & 1 == 0:
        return _fail(err, W_MISSING, row[E_POS], i)
    return p


@kernel
def read_batch(buf, fill, ev, hashes, tokens, out, err):
    """Read a ``KVEventBatch`` (see the module); with ``fill``, ``ev``,
    ``hashes``, ``tokens`` sized by a counting run. ``out``: ``O_*``.
    Returns the events read, or -1 (``err`` says why)."""
    counts = out[O_HASHES:O_TOKENS + 1]  # [hashes, tokens] so far (a view)
    counts[0] = counts[1] = 0
    out[O_TS_KIND] = -1
    out[O_HAS_RANK] = 0
    if buf.shape[0] == 0:
        return _fail(err, W_TRUNCATED, 0, -1)
    p = 0
    ev_at = -1
    if _is_array(buf, 0):
        n, p = _container(buf, 0, err, -1, W_BATCH, False)
        if n != 2 and n != 3:
            return _fail(err, W_BATCH, 0, -1)
        order = (N_TS, N_EVENTS, N_RANK)
        pairs = False
    elif _is_map(buf, 0):
        n, p = _container(buf, 0, err, -1, W_BATCH, True)
        order = (N_TS, N_EVENTS, N_RANK)
        pairs = True
    else:
        return _fail(err, W_BATCH, 0, -1)
    nev = 0
    for j in range(n):
        if pairs:
            s, ln, p = _span(buf, p, err, -1, W_BATCH, False)
            if p < 0:
                return -1
            name = _fnv(buf, s, ln)
        else:
            name = np.uint64(order[j])
        if p < 0 or _need(buf, p, 1, err, -1) < 0:
            return -1
        if name == N_TS:
            b = buf[p]
            if b == 0xCB or b == 0xCA:
                w = 8 if b == 0xCB else 4
                if _need(buf, p + 1, w, err, -1) < 0:
                    return -1
                out[O_TS_KIND], out[O_TS] = w, np.int64(_be(buf, p + 1, w))
                p += 1 + w
            else:
                v, p = _signed(buf, p, err, -1, W_TS)
                out[O_TS_KIND], out[O_TS] = 0, v
        elif name == N_EVENTS:
            ev_at = p
            nev, p = _container(buf, p, err, -1, W_EVENTS, False)
            for i in range(nev):
                if p < 0:
                    return -1
                if fill and i >= ev.shape[0]:  # (never, given MIN_EVENT bytes an event)
                    return _fail(err, W_EVENTS, p, i)
                row = ev[i] if fill else ev[0]
                p = _event(buf, p, row, hashes, tokens, counts, fill, err, i)
        elif name == N_RANK:
            if buf[p] == 0xC0:
                p += 1
            else:
                v, p = _signed(buf, p, err, -1, W_RANK)
                out[O_RANK], out[O_HAS_RANK] = v, 1
        else:
            p = _skip(buf, p, err, -1)
        if p < 0:
            return -1
    if ev_at < 0:
        return _fail(err, W_EVENTS, 0, -1)
    if out[O_TS_KIND] < 0:
        return _fail(err, W_TS, 0, -1)
    if p != buf.shape[0]:
        return _fail(err, W_TRAILING, p, -1)
    out[O_EVENTS] = nev
    return nev
