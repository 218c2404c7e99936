"""Hashing, the child hash table, the terminal bitmap and the room check.

The table holds one int64 entry per non-root node, keyed by ``(parent,
first page of the span)``: ``parent << 32 | id`` (``entry_of``), -1 for an
empty slot; power-of-two sized, linear probing, backward-shift deletion,
load at most ``LOAD_NUM / LOAD_DEN``. The parent in the entry lets a probe
pass over other parents' children, and check its own, without reading the
node arrays: on a tree past the cache that is one dependent miss less per
node visited, and none per entry probed past. Keys are mixed with
splitmix64 in pure uint64 arithmetic (Numba's hash of an int is the int
itself).
"""

import numpy as np

from .config import kernel
from .layout import (EMPTY, ENTRY_NODE_MASK, LOAD_DEN, LOAD_NUM, META, M_NEED_NODES,
                     M_NEED_TOKENS, M_NODE_END, M_NODES, M_FREE_COUNT, M_TOK_USED, NO_NODE, ROOM,
                     START, TABLE, TOKENS)
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


@kernel
def key_hash(p, arr, pos, page):
    """Hash of the child key (parent id ``p``, ``arr[pos:pos+page]``)."""
    h = mix64(np.uint64(np.int64(p)) + np.uint64(0x9E3779B97F4A7C15))
    for i in range(page):
        h = mix64(h ^ np.uint64(np.int64(arr[pos + i])))
    return h


@kernel
def home_slot(table, h):
    return np.int64(h & np.uint64(table.shape[0] - 1))


@kernel
def entry_of(p, c):
    """The table entry of node ``c`` under parent ``p`` (both >= 0)."""
    return (np.int64(p) << 32) | np.int64(c)


@kernel
def child_named(e, p):
    """The node table entry ``e`` holds if it is a child of ``p``, else -1
    (``e`` an empty slot or another parent's child; -1 for any ``e`` when
    ``p`` is -1, a root's parent)."""
    return e & ENTRY_NODE_MASK if e >= 0 and e >> 32 == p else NO_NODE


@kernel
def find_child(table, tokens, start, p, q, pos, page):
    """Child of ``p`` whose first page equals ``q[pos:pos+page]``, or -1."""
    i = home_slot(table, key_hash(p, q, pos, page))
    return probe_on(table, tokens, start, i, table[i], p, q, pos, page)


@kernel
def probe_on(table, tokens, start, i, e, p, q, pos, page):
    """``find_child``'s probe from slot ``i``, whose entry ``e`` was read
    already (the batch walkers read it a round ahead, to prefetch)."""
    mask = table.shape[0] - 1
    while e != EMPTY:
        c = child_named(e, p)
        if c != NO_NODE:  # a child of p: compare its first page
            s = start[c]
            same = True
            for j in range(page):
                if tokens[s + j] != q[pos + j]:
                    same = False
                    break
            if same:
                return c
        i = (i + 1) & mask
        e = table[i]
    return NO_NODE


@kernel
def table_put(table, tokens, start, parent, c, page):
    mask = table.shape[0] - 1
    p = parent[c]
    i = home_slot(table, key_hash(p, tokens, start[c], page))
    while table[i] != EMPTY:
        i = (i + 1) & mask
    table[i] = entry_of(p, c)


@kernel
def table_slot(table, tokens, start, parent, c, page):
    """Slot holding node ``c`` (which must be in the table)."""
    mask = table.shape[0] - 1
    p = parent[c]
    i = home_slot(table, key_hash(p, tokens, start[c], page))
    e = entry_of(p, c)
    while table[i] != e:
        i = (i + 1) & mask
    return i


@kernel
def table_delete_slot(table, tokens, start, i, page):
    """Empty slot ``i`` and shift later entries of its probe run back."""
    mask = table.shape[0] - 1
    j = i
    while True:
        j = (j + 1) & mask
        e = table[j]
        if e == EMPTY:
            break
        home = home_slot(table, key_hash(e >> 32, tokens, start[e & ENTRY_NODE_MASK], page))
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


@kernel
def term_set(term, v):
    term[v >> 3] |= np.uint8(1 << (v & 7))


@kernel
def term_clear(term, v):
    term[v >> 3] &= np.uint8(~(1 << (v & 7)) & 0xFF)


# ---------------------------------------------------------------- room

@kernel
def has_room(T, n_tokens, n_nodes):
    """True if ``n_tokens`` buffer tokens, ``n_nodes`` node ids and their
    table entries fit without growing."""
    meta = T[META]
    if meta[M_TOK_USED] + n_tokens > T[TOKENS].shape[0]:
        return False
    if T[START].shape[0] - meta[M_NODE_END] + meta[M_FREE_COUNT] < n_nodes:
        return False
    return table_fits(meta[M_NODES] + n_nodes, T[TABLE].shape[0])


@kernel
def need_room(T, n_tokens, n_nodes):
    """Record what a call needs and return ``ROOM``."""
    meta = T[META]
    meta[M_NEED_TOKENS] = n_tokens
    meta[M_NEED_NODES] = n_nodes
    return ROOM
