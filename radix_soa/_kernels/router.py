"""The router index (``RouterIndex``): one node per cached page of any
worker, keyed by the page's chained hash (``chain``), with the set of
workers holding it as a bitmask row (64 workers a word).

Arrays (allocated and grown by the class): ``keys`` uint64 per node (its
page hash; for a free node, the next free id), ``pkeys`` uint64 (the hash of
the page before it), ``flags`` int8 (-1 free, 0 a first page, 1 a page with
a parent), ``masks`` int64 ``[node, word]`` (bit ``c % 64`` of word
``c // 64``: worker column ``c`` holds the page), ``table`` int32
open-addressing slots keyed by the hash itself (already mixed), -1 empty,
``meta`` int64 (``X_*`` slots). Mutation kernels assume the class made room
first (``X_LIVE`` + the new nodes within the arrays, the table under the
load limit).
"""

import numpy as np

from .chain import page_hash
from .config import kernel, kernel_nogil

X_END = 0    # high-water mark of node ids
X_FREE = 1   # first free node id, or -1
X_LIVE = 2   # live nodes
X_SIZE = 4

OK = 0
E_PARENT = 1     # the parent page is not held by the worker
E_HELD = 2       # a page the worker holds already
E_MISMATCH = 3   # a page known under another parent (another hash chain)
E_UNKNOWN = 4    # a removed page the worker does not hold


@kernel
def rx_find(table, keys, h):
    """The live node of hash ``h``, or -1 (the table holds live nodes only)."""
    mask = table.shape[0] - 1
    i = np.int64(h & np.uint64(mask))
    while True:
        v = table[i]
        if v < 0:
            return -1
        if keys[v] == h:
            return v
        i = (i + 1) & mask


@kernel
def _table_delete(table, keys, v):
    """Remove node ``v`` from the table (backward-shift deletion)."""
    mask = table.shape[0] - 1
    i = np.int64(keys[v] & np.uint64(mask))
    while table[i] != v:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        c = table[j]
        if c < 0:
            break
        home = np.int64(keys[c] & np.uint64(mask))
        if i <= j:
            movable = home <= i or home > j
        else:
            movable = home <= i and home > j
        if movable:
            table[i] = c
            i = j
    table[i] = -1


@kernel
def rx_table_rebuild(table, keys, flags, end):
    """Fill ``table`` (all -1) with every live node below ``end``."""
    mask = table.shape[0] - 1
    for v in range(end):
        if flags[v] >= 0:
            i = np.int64(keys[v] & np.uint64(mask))
            while table[i] >= 0:
                i = (i + 1) & mask
            table[i] = v


@kernel
def _held(masks, v, word, bit):
    return (masks[v, word] & bit) != 0


@kernel
def rx_check_store(table, keys, pkeys, flags, masks, word, bit, hashes, parent, has_parent):
    """Whether worker ``(word, bit)`` can store the chain ``hashes`` after
    ``parent``: ``(OK, 0)`` or ``(E_*, index of the offending hash)``."""
    if has_parent:
        p = rx_find(table, keys, parent)
        if p < 0 or not _held(masks, p, word, bit):
            return E_PARENT, 0
    before = parent
    hasp = has_parent
    for i in range(hashes.shape[0]):
        h = hashes[i]
        v = rx_find(table, keys, h)
        if v >= 0:
            if _held(masks, v, word, bit):
                return E_HELD, i
            if (flags[v] == 1) != hasp or (hasp and pkeys[v] != before):
                return E_MISMATCH, i
        before = h
        hasp = True
    return OK, 0


@kernel
def rx_add(table, keys, pkeys, flags, masks, meta, word, bit, hashes, parents, hasp):
    """Give worker ``(word, bit)`` the pages ``hashes`` (the page before
    each in ``parents``, ``hasp`` 1 if it has one), making the nodes not
    there yet. Unchecked: ``rx_check_store`` first."""
    mask = table.shape[0] - 1
    for i in range(hashes.shape[0]):
        h = hashes[i]
        v = rx_find(table, keys, h)
        if v < 0:
            v = meta[X_FREE]
            if v >= 0:
                meta[X_FREE] = np.int64(keys[v])
            else:
                v = meta[X_END]
                meta[X_END] = v + 1
            keys[v] = h
            pkeys[v] = parents[i]
            flags[v] = hasp[i]
            for w in range(masks.shape[1]):
                masks[v, w] = 0
            j = np.int64(h & np.uint64(mask))
            while table[j] >= 0:
                j = (j + 1) & mask
            table[j] = v
            meta[X_LIVE] += 1
        masks[v, word] |= bit


@kernel
def rx_check_remove(table, keys, masks, word, bit, hashes):
    """The first index of ``hashes`` worker ``(word, bit)`` does not hold
    (a repeat counts: it is gone by then), or -1."""
    for i in range(hashes.shape[0]):
        v = rx_find(table, keys, hashes[i])
        if v < 0 or not _held(masks, v, word, bit):
            return i
        for j in range(i):
            if hashes[j] == hashes[i]:
                return i
    return -1


@kernel
def _release(table, keys, flags, masks, meta, v):
    """Free node ``v`` if no worker holds it any more."""
    for w in range(masks.shape[1]):
        if masks[v, w] != 0:
            return
    _table_delete(table, keys, v)
    flags[v] = -1
    keys[v] = np.uint64(meta[X_FREE])
    meta[X_FREE] = v
    meta[X_LIVE] -= 1


@kernel
def rx_drop(table, keys, pkeys, flags, masks, meta, word, bit, hashes, parents, hasp):
    """Take the pages ``hashes`` from worker ``(word, bit)`` (unchecked:
    ``rx_check_remove`` first), writing each one's parent to ``parents`` /
    ``hasp`` (to undo it with ``rx_add``)."""
    for i in range(hashes.shape[0]):
        v = rx_find(table, keys, hashes[i])
        parents[i] = pkeys[v]
        hasp[i] = flags[v]
        masks[v, word] &= ~bit
        _release(table, keys, flags, masks, meta, v)


@kernel
def rx_clear(table, keys, pkeys, flags, masks, meta, word, bit, out, parents, hasp):
    """Take every page from worker ``(word, bit)``; what it held goes to
    ``out`` / ``parents`` / ``hasp`` (``X_LIVE`` long). Returns how many."""
    n = 0
    for v in range(meta[X_END]):
        if flags[v] >= 0 and _held(masks, v, word, bit):
            out[n] = keys[v]
            parents[n] = pkeys[v]
            hasp[n] = flags[v]
            n += 1
    for i in range(n):
        v = rx_find(table, keys, out[i])
        masks[v, word] &= ~bit
        _release(table, keys, flags, masks, meta, v)
    return n


@kernel
def rx_overlap(table, keys, masks, q, page, seed, live, res, hkeys):
    """``overlap_at`` of all of ``q``."""
    overlap_at(table, keys, masks, q, 0, q.shape[0], page, seed, live, res, hkeys)


@kernel
def overlap_at(table, keys, masks, q, qs, qn, page, seed, live, res, hkeys):
    """Per worker column, the leading whole-page tokens of ``q[qs:qs+qn]``
    it holds, into ``res`` (every column of ``live``, int64 words; ``res``
    has a word of scratch per word of ``live`` after the 64 columns of each).
    The pages' keys are their chained ``page_hash`` from ``seed``, or
    ``hkeys`` when it is not empty (one per page, hashed by the caller:
    ``sha256_cbor``)."""
    words = masks.shape[1]
    alive = res[64 * words:]
    left = 0
    for w in range(words):
        alive[w] = live[w]
        left |= live[w]
    h = seed
    npages = qn // page
    given = hkeys.shape[0] > 0
    i = 0
    while i < npages and left != 0:
        h = hkeys[i] if given else page_hash(h, q, qs + i * page, page)
        v = rx_find(table, keys, h)
        if v < 0:
            break
        left = 0
        for w in range(words):
            a = alive[w]
            if a != 0:
                m = a & masks[v, w]
                _set_bits(res, w, a & ~m, i * page)
                alive[w] = m
                left |= m
        i += 1
    for w in range(words):
        _set_bits(res, w, alive[w], i * page)


@kernel
def _set_bits(res, w, bits, value):
    if bits != 0:
        for j in range(64):
            if (bits >> j) & 1:
                res[w * 64 + j] = value


@kernel_nogil
def rx_overlap_batch(table, keys, masks, flat, offsets, page, seed, live, res, hkeys):
    """``overlap_at`` of every sequence of a CSR batch into row i of ``res``
    (``hkeys`` empty: the page hash)."""
    for i in range(offsets.shape[0] - 1):
        overlap_at(table, keys, masks, flat, offsets[i], offsets[i + 1] - offsets[i], page,
                   seed, live, res[i], hkeys)
