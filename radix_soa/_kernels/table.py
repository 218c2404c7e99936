"""Hashing, the child hash table, the terminal bitmap and the room check.

The table holds one int64 entry per non-root node, placed by its key
``(parent, first page of the span)``: the key's 64-bit hash picks the home
slot (its low bits) and gives the entry's upper half (its high 32 bits, the
*tag*), the node id is the lower half (``entry_of``); -1 is an empty slot.
Power-of-two sized, linear probing, backward-shift deletion, load at most
``LOAD_NUM / LOAD_DEN``. A probe compares tags only: it passes over every
entry placed by another key (other parents' children, and its own parent's
other children) without reading the node arrays or the token buffer, and
stops at an empty slot. An entry whose tag matches is a candidate, exact
once its node's ``parent`` and first page are compared (``is_child``; a
false candidate is one probe step in 2^32): the descent reads that node's
span there anyway. Keys are mixed with splitmix64 in pure uint64
arithmetic (Numba's hash of an int is the int itself).

Call graph (callers after their callees): mix64, key_hash, tag_of ->
entry_of, retarget, child_tagged, is_child, tag_scan -> probe_on ->
find_child; node_hash -> table_put, table_slot, table_delete_slot,
table_rebuild; term bitmap; has_room, need_room
"""

import numpy as np

from .config import kernel, kernel_helper, kernel_inner
from .layout import (EMPTY, ENTRY_NODE_MASK, ENTRY_TAG_MASK, LOAD_DEN, LOAD_NUM, META,
                     M_NEED_NODES, M_NEED_TOKENS, M_NODE_END, M_NODES, M_FREE_COUNT, M_TOK_USED,
                     NO_NODE, ROOM, START, TABLE, TOKENS)
from .prefetch import prefetch

# table_rebuild prefetches the home slot of the node this many ids ahead
AHEAD = 16


@kernel
def mix64(x):
    """splitmix64 finalizer (uint64 in, uint64 out)."""
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


@kernel_helper
def key_hash(p, arr, pos, page):
    """Hash of the child key (parent id ``p``, ``arr[pos:pos+page]``)."""
    h = mix64(np.uint64(np.int64(p)) + np.uint64(0x9E3779B97F4A7C15))
    for i in range(page):
        h = mix64(h ^ np.uint64(np.int64(arr[pos + i])))
    return h


@kernel_helper
def home_slot(table, h):
    return np.int64(h & np.uint64(table.shape[0] - 1))


@kernel_helper
def tag_of(h):
    """The upper half of the entries a key hash ``h`` places: its high 32
    bits, as an int64 with the node id bits zero."""
    return np.int64(h & np.uint64(0xFFFFFFFF00000000))


@kernel_helper
def entry_of(h, c):
    """The table entry of node ``c`` (>= 0) placed by key hash ``h``."""
    return tag_of(h) | np.int64(c)


@kernel_helper
def retarget(e, c):
    """Entry ``e``'s key for node ``c`` (a split's upper part, or a merged
    child, takes over a key as it is)."""
    return (e & ENTRY_TAG_MASK) | np.int64(c)


@kernel_helper
def child_tagged(e, tag):
    """The node entry ``e`` holds if ``e`` carries ``tag``, else -1: a
    candidate child, to be checked by ``is_child``."""
    return e & ENTRY_NODE_MASK if e != EMPTY and (e & ENTRY_TAG_MASK) == tag else NO_NODE


@kernel_inner
def is_child(tokens, start, parent, c, p, q, pos, page):
    """True if node ``c`` hangs off ``p`` and its first page is
    ``q[pos:pos+page]``."""
    if parent[c] != p:
        return False
    s = start[c]
    for j in range(page):
        if tokens[s + j] != q[pos + j]:
            return False
    return True


@kernel_inner
def find_child(table, tokens, start, parent, p, q, pos, page):
    """Child of ``p`` whose first page equals ``q[pos:pos+page]``, or -1."""
    h = key_hash(p, q, pos, page)
    i = home_slot(table, h)
    return probe_on(table, tokens, start, parent, i, table[i], p, tag_of(h), q, pos, page)


@kernel_inner
def tag_scan(table, i, e, tag):
    """From slot ``i`` (entry ``e`` read already): the first slot of the
    probe run holding ``tag``, or the empty slot that ends the run. Reads
    the table only."""
    mask = table.shape[0] - 1
    while e != EMPTY and (e & ENTRY_TAG_MASK) != tag:
        i = (i + 1) & mask
        e = table[i]
    return i


@kernel_inner
def probe_on(table, tokens, start, parent, i, e, p, tag, q, pos, page):
    """``find_child``'s probe from slot ``i``, whose entry ``e`` was read
    already (the batch walkers read it a round ahead, to prefetch)."""
    mask = table.shape[0] - 1
    while e != EMPTY:
        if (e & ENTRY_TAG_MASK) == tag:
            c = e & ENTRY_NODE_MASK
            if is_child(tokens, start, parent, c, p, q, pos, page):
                return c
        i = (i + 1) & mask
        e = table[i]
    return NO_NODE


@kernel_helper
def node_hash(tokens, start, parent, c, page):
    """The key hash node ``c`` is placed by."""
    return key_hash(parent[c], tokens, start[c], page)


@kernel_inner
def table_put(table, tokens, start, parent, c, page):
    mask = table.shape[0] - 1
    h = node_hash(tokens, start, parent, c, page)
    i = home_slot(table, h)
    while table[i] != EMPTY:
        i = (i + 1) & mask
    table[i] = entry_of(h, c)


@kernel_helper
def table_slot(table, tokens, start, parent, c, page):
    """Slot holding node ``c`` (which must be in the table)."""
    mask = table.shape[0] - 1
    h = node_hash(tokens, start, parent, c, page)
    i = home_slot(table, h)
    e = entry_of(h, c)
    while table[i] != e:
        i = (i + 1) & mask
    return i


@kernel_inner
def table_delete_slot(table, tokens, start, parent, i, page):
    """Empty slot ``i`` and shift later entries of its probe run back (each
    entry's home from its node: the node arrays must still hold the key it
    was placed by)."""
    mask = table.shape[0] - 1
    j = i
    while True:
        j = (j + 1) & mask
        e = table[j]
        if e == EMPTY:
            break
        home = home_slot(table, node_hash(tokens, start, parent, e & ENTRY_NODE_MASK, page))
        # e may fill the hole at i unless its home lies cyclically in (i, j]
        if i <= j:
            movable = home <= i or home > j
        else:
            movable = home <= i and home > j
        if movable:
            table[i] = e
            i = j
    table[i] = EMPTY


@kernel
def table_rebuild(table, tokens, start, length, parent, node_end, page):
    """Fill ``table`` (all -1) with every live non-root node below ``node_end``.

    ``table``: int64, power-of-two length, allocated by the caller. The
    home slot of the node ``AHEAD`` ids on is prefetched before each put (a
    table past the cache is otherwise one miss per node, one after another);
    the fill order, and so the table, is the plain loop's."""
    for c in range(node_end):
        a = c + AHEAD
        if a < node_end and length[a] > 0 and parent[a] >= 0:
            prefetch(table, home_slot(table, key_hash(parent[a], tokens, start[a], page)))
        if length[c] > 0 and parent[c] >= 0:
            table_put(table, tokens, start, parent, c, page)


@kernel
def table_fits(entries, size):
    """True if ``entries`` fit a table of ``size`` slots under the load limit."""
    return entries * LOAD_DEN <= size * LOAD_NUM


# ---------------------------------------------------------------- bitmap

@kernel
def term_get(term, v):
    return (term[v >> 3] >> (v & 7)) & 1


@kernel_helper
def term_set(term, v):
    term[v >> 3] |= np.uint8(1 << (v & 7))


@kernel_helper
def term_clear(term, v):
    term[v >> 3] &= np.uint8(~(1 << (v & 7)) & 0xFF)


# ---------------------------------------------------------------- room

@kernel_helper
def has_room(T, n_tokens, n_nodes):
    """True if ``n_tokens`` buffer tokens, ``n_nodes`` node ids and their
    table entries fit without growing."""
    meta = T[META]
    if meta[M_TOK_USED] + n_tokens > T[TOKENS].shape[0]:
        return False
    if T[START].shape[0] - meta[M_NODE_END] + meta[M_FREE_COUNT] < n_nodes:
        return False
    return table_fits(meta[M_NODES] + n_nodes, T[TABLE].shape[0])


@kernel_helper
def need_room(T, n_tokens, n_nodes):
    """Record what a call needs and return ``ROOM``."""
    meta = T[META]
    meta[M_NEED_TOKENS] = n_tokens
    meta[M_NEED_NODES] = n_nodes
    return ROOM
