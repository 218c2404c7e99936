"""Changing the tree: node ids, split, insert, terminal marks, unlink, merge
and remove.

Entry kernels take the whole tree ``T`` (see ``layout``). Insert-like
kernels read queries as int64 (``q`` / ``flat`` + ``offsets``) and values as
int64 (``vals``, ignored when the tree keeps none). A split keeps the
existing id for the lower part (its children, their table entries and
handles stay valid) and gives the upper part a new id.

Call graph (callers after their callees): alloc_node, free_node, new_root;
copy_run; split, new_leaf -> extend -> insert_one -> radix_insert;
descend_group, descend, extend -> radix_insert_batch; set_terminal; unlink,
merge_room, merge_into_child -> remove_one
"""

import numpy as np

from .config import kernel, kernel_alloc, kernel_helper, kernel_inner
from .descent import GROUP, descend, descend_group
from .directory import tree_at
from .heap import heap_push, heap_remove, key_on_create, key_on_insert, touch_insert
from .layout import (CXOR, DONE, FREE, GEN, HEAP, HKEY, HPOS, LENGTH, LOCK, META, M_DEAD_TOKENS,
                     M_FREE_COUNT, M_FREE_HEAD, M_NODES, M_NODE_END, M_ROOTS, M_TERMINALS,
                     M_TOKENS, M_TOKENS_INSERTED, M_TOK_USED, NCHILD, NO_NODE, OWN, PARENT,
                     STAMP, START, TABLE, TERM, TOKENS, VALUES)
from .table import (retarget, has_room, need_room, table_delete_slot, table_put, table_slot,
                    term_clear, term_get, term_set)


# ---------------------------------------------------------------- node ids

@kernel_inner
def alloc_node(start, meta):
    f = meta[M_FREE_HEAD]
    if f != NO_NODE:
        meta[M_FREE_HEAD] = start[f]
        meta[M_FREE_COUNT] -= 1
        return f
    v = meta[M_NODE_END]
    meta[M_NODE_END] = v + 1
    return v


@kernel_inner
def free_node(T, v, track):
    meta = T[META]
    T[LENGTH][v] = FREE
    T[PARENT][v] = -2
    T[NCHILD][v] = 0
    T[CXOR][v] = 0
    term_clear(T[TERM], v)
    T[START][v] = meta[M_FREE_HEAD]
    meta[M_FREE_HEAD] = v
    meta[M_FREE_COUNT] += 1
    if track:
        T[GEN][v] += 1
        T[LOCK][v] = 0
        T[OWN][v] = 0
        T[HPOS][v] = -1


@kernel_inner
def make_root(T, track, ns):
    """Allocate a root (no span, no parent) for namespace number ``ns``,
    which it keeps in its ``start`` (a root has no span): the namespace of
    every root can be read back from the arrays. Needs room for a node."""
    meta = T[META]
    r = alloc_node(T[START], meta)
    T[START][r] = ns
    T[LENGTH][r] = 0
    T[PARENT][r] = -1
    T[NCHILD][r] = 0
    T[CXOR][r] = 0
    term_clear(T[TERM], r)
    meta[M_ROOTS] += 1
    if track:
        T[LOCK][r] = 0
        T[OWN][r] = 0
        T[STAMP][r] = 0
        T[HPOS][r] = -1
    return r


@kernel
def new_root(T, track, ns):
    """``make_root`` as an entry kernel: ``(status, root)``."""
    if not has_room(T, 0, 1):
        return need_room(T, 0, 1), NO_NODE
    return DONE, make_root(T, track, ns)


# ---------------------------------------------------------------- insert

@kernel_helper
def copy_run(dst, d, src, s, n):
    """``dst[d:d+n] = src[s:s+n]`` (non-overlapping, any int dtypes)."""
    dv = dst[d:d + n]
    sv = src[s:s + n]
    for j in range(n):
        dv[j] = sv[j]


@kernel_inner
def split(T, c, k, page, track):
    """Cut node ``c`` after ``k`` tokens; returns the new upper part's id."""
    tokens, start, length, parent, table = T[TOKENS], T[START], T[LENGTH], T[PARENT], T[TABLE]
    cxor = T[CXOR]
    meta = T[META]
    slot = table_slot(table, tokens, start, parent, c, page)
    u = alloc_node(start, meta)
    pp = parent[c]
    s = start[c]
    start[u] = s
    length[u] = k
    parent[u] = pp
    T[NCHILD][u] = 1
    cxor[u] = c
    term_clear(T[TERM], u)
    cxor[pp] ^= c ^ u
    table[slot] = retarget(table[slot], u)  # same key: same parent, same first page
    start[c] = s + k
    length[c] -= k
    parent[c] = u
    table_put(table, tokens, start, parent, c, page)
    meta[M_NODES] += 1
    if track:
        T[LOCK][u] = T[LOCK][c]  # same subtree, same locks; none taken on u itself
        T[OWN][u] = 0
        T[STAMP][u] = T[STAMP][c]
        T[HPOS][u] = -1
    return u


@kernel_inner
def new_leaf(T, v, q, qs, n, vals, vs, page, track, clock):
    """Append ``q[qs:qs+n]`` (values ``vals[vs:vs+n]``) as a new child of ``v``."""
    start, nchild, meta = T[START], T[NCHILD], T[META]
    values = T[VALUES]
    x = alloc_node(start, meta)
    t = meta[M_TOK_USED]
    copy_run(T[TOKENS], t, q, qs, n)
    if values.shape[0] > 0:
        copy_run(values, t, vals, vs, n)
    meta[M_TOK_USED] = t + n
    start[x] = t
    T[LENGTH][x] = n
    T[PARENT][x] = v
    nchild[x] = 0
    T[CXOR][x] = 0
    term_clear(T[TERM], x)
    was_leaf = nchild[v] == 0
    nchild[v] += 1
    T[CXOR][v] ^= x
    table_put(T[TABLE], T[TOKENS], start, T[PARENT], x, page)
    meta[M_NODES] += 1
    meta[M_TOKENS] += n
    if track:
        heap, hpos, stamp = T[HEAP], T[HPOS], T[STAMP]
        T[LOCK][x] = 0
        T[OWN][x] = 0
        stamp[x] = key_on_create(meta, clock)
        hpos[x] = -1
        if was_leaf and hpos[v] >= 0:
            heap_remove(heap, hpos, T[HKEY], meta, v)
        heap_push(heap, hpos, stamp, T[HKEY], meta, x)
    return x


@kernel_inner
def extend(T, root, v, c, k, pos, q, qs, qn, vals, vs, page, track, clock):
    """Finish an insert of ``q[qs:qs+qn]`` whose descent gave ``(v, c, k, pos)``:
    refresh the matched path, split ``c`` after ``k`` tokens if the match
    ends inside it, and hang the rest on as a new leaf. Needs room for
    ``qn - pos - k`` tokens and 2 nodes. Returns the node the sequence ends at."""
    if track:
        # refresh the matched path, deepest last (it may be a heap leaf)
        w = v
        while w != root:
            touch_insert(T[HEAP], T[HPOS], T[STAMP], T[HKEY], T[META], w, clock)
            w = T[PARENT][w]
    if c != NO_NODE:
        v = split(T, c, k, page, track)  # the upper part starts with the lower's key
        if track:
            T[STAMP][v] = key_on_insert(T[META], T[STAMP][v], clock)
        pos += k
    if pos < qn:
        v = new_leaf(T, v, q, qs + pos, qn - pos, vals, vs + pos, page, track, clock)
    return v


@kernel_inner
def insert_one(T, root, q, qs, qn, vals, vs, page, track, clock):
    """Insert ``q[qs:qs+qn]`` (``qn`` a multiple of ``page``); needs room for
    ``qn`` tokens and 2 nodes. Returns ``(node, cached)``: the node the
    sequence ends at and how many leading tokens were already stored."""
    v, c, k, pos = descend(T[TOKENS], T[START], T[LENGTH], T[PARENT], T[TABLE], root, q, qs, qn,
                           page)
    node = extend(T, root, v, c, k, pos, q, qs, qn, vals, vs, page, track, clock)
    return node, pos + k


@kernel_inner
def set_terminal(term, meta, v):
    """Mark ``v`` terminal; True if it was not already."""
    if term_get(term, v) == 1:
        return False
    term_set(term, v)
    meta[M_TERMINALS] += 1
    return True


@kernel
def radix_insert(D, like, root, q):
    """``RadixCache.insert`` on the tree at directory ``D`` (see
    ``directory``): ``(status, new)``; ``new`` is 1 if ``q`` was not stored
    before. ``ROOM``: nothing changed."""
    T = tree_at(D, like)
    qn = q.shape[0]
    if not has_room(T, qn, 2):
        return need_room(T, qn, 2), 0
    v, cached = insert_one(T, root, q, 0, qn, q, 0, 1, False, 0)
    T[META][M_TOKENS_INSERTED] += qn
    return DONE, 1 if set_terminal(T[TERM], T[META], v) else 0


@kernel_alloc
def radix_insert_batch(T, root, flat, offsets, cursor, new):
    """Insert sequences ``cursor[0]..`` of a CSR batch, marking each
    terminal; ``new[i]`` (bool, caller-allocated) records whether sequence i
    was not stored before. Returns ``DONE``, or ``ROOM`` with ``cursor[0]``
    at the first sequence not inserted.

    Sequences go GROUP at a time: their descents first, interleaved
    (``descend_group``: the group's cache misses overlap), then each insert
    in order. An insert changes what a later descent of its group would
    find only when it splits a node or hangs a leaf on the node that later
    descent ended at (a new leaf's first token differs from every sibling's,
    so no other path changes); such a descent is done again, so every
    sequence is inserted exactly as ``insert_one`` one by one would."""
    n = offsets.shape[0] - 1
    meta = T[META]
    tokens, start, length, parent, table = T[TOKENS], T[START], T[LENGTH], T[PARENT], T[TABLE]
    rv = np.empty(GROUP, np.int64)
    rc = np.empty(GROUP, np.int64)
    rk = np.empty(GROUP, np.int64)
    rpos = np.empty(GROUP, np.int64)
    walk = np.empty(GROUP, np.int64)
    slot = np.empty(GROUP, np.int64)
    entry = np.empty(GROUP, np.int64)
    tag = np.empty(GROUP, np.int64)
    hung = np.empty(GROUP, np.int64)  # nodes this group hung a leaf on
    i = cursor[0]
    while i < n:
        m = min(GROUP, n - i)
        descend_group(tokens, start, length, parent, table, root, flat, offsets, i, m, 1, rv, rc,
                      rk, rpos, walk, slot, entry, tag)
        nh = 0
        split_seen = False
        for g in range(m):
            qs = offsets[i]
            qn = offsets[i + 1] - qs
            if not has_room(T, qn, 2):
                cursor[0] = i
                return need_room(T, qn, 2)
            v, c, k, pos = rv[g], rc[g], rk[g], rpos[g]
            stale = split_seen
            for h in range(nh):
                if hung[h] == v:
                    stale = True
            if stale:
                v, c, k, pos = descend(tokens, start, length, parent, table, root, flat, qs, qn,
                                       1)
            if c != NO_NODE:
                split_seen = True
            elif pos < qn:
                hung[nh] = v
                nh += 1
            x = extend(T, root, v, c, k, pos, flat, qs, qn, flat, qs, 1, False, 0)
            new[i] = set_terminal(T[TERM], meta, x)
            meta[M_TOKENS_INSERTED] += qn
            i += 1
    cursor[0] = n
    return DONE


# ---------------------------------------------------------------- remove

@kernel
def unlink(T, x, page, track):
    """Delete node ``x`` (childless) from its parent and free it."""
    tokens, start, parent, table, meta = T[TOKENS], T[START], T[PARENT], T[TABLE], T[META]
    slot = table_slot(table, tokens, start, parent, x, page)
    table_delete_slot(table, tokens, start, parent, slot, page)
    p = parent[x]
    T[NCHILD][p] -= 1
    T[CXOR][p] ^= x
    L = T[LENGTH][x]
    meta[M_NODES] -= 1
    meta[M_TOKENS] -= L
    meta[M_DEAD_TOKENS] += L
    if track and T[HPOS][x] >= 0:
        heap_remove(T[HEAP], T[HPOS], T[HKEY], meta, x)
    free_node(T, x, track)


@kernel_inner
def merge_room(start, length, p, c):
    """Buffer room merging ``p`` into its only child ``c`` needs."""
    if start[p] + length[p] == start[c]:
        return 0
    return length[p] + length[c]


@kernel_inner
def merge_into_child(T, p, c, page, track):
    """Merge node ``p`` into its only child ``c``; ``c`` keeps its id."""
    tokens, start, length, parent, table = T[TOKENS], T[START], T[LENGTH], T[PARENT], T[TABLE]
    values, meta = T[VALUES], T[META]
    slot_c = table_slot(table, tokens, start, parent, c, page)
    table_delete_slot(table, tokens, start, parent, slot_c, page)
    slot_p = table_slot(table, tokens, start, parent, p, page)
    pp = parent[p]
    lp = length[p]
    lc = length[c]
    if start[p] + lp == start[c]:
        start[c] = start[p]
    else:
        t = meta[M_TOK_USED]
        sp = start[p]
        sc = start[c]
        copy_run(tokens, t, tokens, sp, lp)
        copy_run(tokens, t + lp, tokens, sc, lc)
        if values.shape[0] > 0:
            copy_run(values, t, values, sp, lp)
            copy_run(values, t + lp, values, sc, lc)
        meta[M_TOK_USED] = t + lp + lc
        meta[M_DEAD_TOKENS] += lp + lc
        start[c] = t
    length[c] = lp + lc
    parent[c] = pp
    table[slot_p] = retarget(table[slot_p], c)  # c now has p's key
    T[CXOR][pp] ^= p ^ c
    meta[M_NODES] -= 1
    free_node(T, p, track)


@kernel
def remove_one(T, root, q):
    """Remove the stored sequence ``q`` and restore canonical form:
    ``(status, removed)``. ``ROOM`` (buffer tokens for a merge): nothing
    changed."""
    qn = q.shape[0]
    if qn == 0:
        return DONE, 0
    nchild, cxor, term, meta = T[NCHILD], T[CXOR], T[TERM], T[META]
    start, length = T[START], T[LENGTH]
    x, c, k, pos = descend(T[TOKENS], start, length, T[PARENT], T[TABLE], root, q, 0, qn, 1)
    if c != NO_NODE or pos != qn or term_get(term, x) == 0:
        return DONE, 0
    room = 0
    p = T[PARENT][x]
    sib = NO_NODE
    if nchild[x] == 1:
        room = merge_room(start, length, x, cxor[x])
    elif nchild[x] == 0 and p != root and term_get(term, p) == 0 and nchild[p] == 2:
        sib = cxor[p] ^ x
        room = merge_room(start, length, p, sib)
    if not has_room(T, room, 0):
        return need_room(T, room, 0), 0
    term_clear(term, x)
    meta[M_TERMINALS] -= 1
    if nchild[x] == 1:
        merge_into_child(T, x, cxor[x], 1, False)
    elif nchild[x] == 0:
        unlink(T, x, 1, False)
        if sib != NO_NODE:
            merge_into_child(T, p, sib, 1, False)
    return DONE, 1


