"""Every Numba kernel of the tree, in one module.

Kernels that call each other live together so Numba's on-disk cache stays
coherent. They take unpacked arrays (never a Python object), never allocate
persistent arrays and never raise: the Python side reserves room first, and a
kernel that could still run out reports it through its return value.

The tree arrays travel as one tuple ``T`` (see ``radix_soa._storage``)::

    T = (tokens, values, start, length, parent, nchild, cxor, term, table,
         lock, stamp, hpos, heap, gen, own, meta)

- ``tokens``   flat token buffer; node ``v`` owns ``tokens[start[v]:start[v]+length[v]]``
- ``values``   int64 per token, parallel to ``tokens`` (empty when not kept)
- ``start``    int64 per node; for a free node, the next free id
- ``length``   int32 per node; ``-1`` marks a free node, ``0`` a root
- ``parent``   int32 per node; ``-1`` for a root (one root per namespace)
- ``nchild``   int32 number of children
- ``cxor``     int32 XOR of the children's ids (the only child when nchild == 1)
- ``term``     uint8 terminal bitmap (``RadixCache``: sequence ends here)
- ``table``    int32 open-addressing child table keyed by (parent, first page);
               ``-1`` is an empty slot; linear probing, backward-shift delete
- ``lock``, ``stamp``, ``hpos``, ``heap``, ``gen``, ``own``: prefix-cache
  bookkeeping (locks on the node's subtree, logical access time, position in
  the LRU heap of evictable leaves, the heap, handle generations, locks taken
  on the node itself); empty arrays when the tree does not track them
  (``track=False``).
- ``meta``     int64 counters, indexed by the ``M_*`` constants below.
"""

import numpy as np
from numba import njit, prange

# meta slots
M_TOK_USED = 0      # high-water mark of the token buffer
M_NODE_END = 1      # high-water mark of node ids
M_FREE_HEAD = 2     # first free node id, or -1
M_FREE_COUNT = 3    # number of free node ids below M_NODE_END
M_NODES = 4         # live non-root nodes (== filled table slots)
M_TOKENS = 5        # tokens held in live node spans
M_TERMINALS = 6     # terminal marks set
M_DEAD_TOKENS = 7   # tokens in the buffer no live span covers
M_HEAP_SIZE = 8     # entries in the LRU heap
M_LOCKED_TOKENS = 9  # tokens in nodes with lock > 0
M_CLOCK = 10        # logical clock of the prefix cache
M_ROOTS = 11        # namespace roots allocated
M_TOKENS_INSERTED = 12  # every token ever handed to insert (for footprint studies)
META_SIZE = 16

FREE = -1           # length of a free node
NO_NODE = -1

# Kernels that never allocate run without Numba's reference counting: with
# it, each array argument costs two atomic updates per call, which made an
# insert of a short leaf ten times slower. Only the few kernels that build
# new arrays (and the prange loops) keep it.
kernel = njit(cache=True, _nrt=False)


# ---------------------------------------------------------------- hashing

@kernel
def _mix64(x):
    # splitmix64 finalizer, pure uint64 arithmetic
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


@kernel
def _key_hash(p, arr, pos, page):
    """Hash of the child key (parent id ``p``, ``arr[pos:pos+page]``)."""
    h = _mix64(np.uint64(np.int64(p)) + np.uint64(0x9E3779B97F4A7C15))
    for i in range(page):
        h = _mix64(h ^ np.uint64(np.int64(arr[pos + i])))
    return h


@kernel
def _home(table, h):
    return np.int64(h & np.uint64(table.shape[0] - 1))


# ---------------------------------------------------------------- child table

@kernel
def _find_child(table, tokens, start, parent, p, q, pos, page):
    """Child of ``p`` whose first page equals ``q[pos:pos+page]``, or -1."""
    mask = table.shape[0] - 1
    i = _home(table, _key_hash(p, q, pos, page))
    while True:
        c = table[i]
        if c == NO_NODE:
            return NO_NODE
        if parent[c] == p:
            s = start[c]
            same = True
            for j in range(page):
                if tokens[s + j] != q[pos + j]:
                    same = False
                    break
            if same:
                return c
        i = (i + 1) & mask


@kernel
def _table_put(table, tokens, start, parent, c, page):
    mask = table.shape[0] - 1
    i = _home(table, _key_hash(parent[c], tokens, start[c], page))
    while table[i] != NO_NODE:
        i = (i + 1) & mask
    table[i] = c


@kernel
def _table_slot(table, tokens, start, parent, c, page):
    """Slot holding node ``c`` (which must be in the table)."""
    mask = table.shape[0] - 1
    i = _home(table, _key_hash(parent[c], tokens, start[c], page))
    while table[i] != c:
        i = (i + 1) & mask
    return i


@kernel
def _table_delete_slot(table, tokens, start, parent, i, page):
    """Empty slot ``i`` and shift later entries of its probe run back."""
    mask = table.shape[0] - 1
    j = i
    while True:
        j = (j + 1) & mask
        c = table[j]
        if c == NO_NODE:
            break
        home = _home(table, _key_hash(parent[c], tokens, start[c], page))
        # c may fill the hole at i unless its home lies cyclically in (i, j]
        if i <= j:
            movable = home <= i or home > j
        else:
            movable = home <= i and home > j
        if movable:
            table[i] = c
            i = j
    table[i] = NO_NODE


@kernel
def table_rebuild(table, tokens, start, length, parent, node_end, page):
    """Fill an empty ``table`` with every live non-root node below ``node_end``."""
    for c in range(node_end):
        if length[c] > 0 and parent[c] >= 0:
            _table_put(table, tokens, start, parent, c, page)


# ---------------------------------------------------------------- bitmap

@kernel
def _term_get(term, v):
    return (term[v >> 3] >> (v & 7)) & 1


@kernel
def _term_set(term, v):
    term[v >> 3] |= np.uint8(1 << (v & 7))


@kernel
def _term_clear(term, v):
    term[v >> 3] &= np.uint8(~(1 << (v & 7)) & 0xFF)


# ---------------------------------------------------------------- LRU heap
# A binary min-heap of evictable leaves (unlocked, childless, non-root) keyed
# by (stamp, id); hpos[v] is v's slot in the heap or -1.

@kernel
def _heap_less(stamp, a, b):
    return stamp[a] < stamp[b] or (stamp[a] == stamp[b] and a < b)


@kernel
def _heap_sift_up(heap, hpos, stamp, i):
    v = heap[i]
    while i > 0:
        p = (i - 1) >> 1
        u = heap[p]
        if not _heap_less(stamp, v, u):
            break
        heap[i] = u
        hpos[u] = i
        i = p
    heap[i] = v
    hpos[v] = i


@kernel
def _heap_sift_down(heap, hpos, stamp, size, i):
    v = heap[i]
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and _heap_less(stamp, heap[c + 1], heap[c]):
            c += 1
        u = heap[c]
        if not _heap_less(stamp, u, v):
            break
        heap[i] = u
        hpos[u] = i
        i = c
    heap[i] = v
    hpos[v] = i


@kernel
def _heap_push(heap, hpos, stamp, meta, v):
    i = meta[M_HEAP_SIZE]
    meta[M_HEAP_SIZE] = i + 1
    heap[i] = v
    hpos[v] = i
    _heap_sift_up(heap, hpos, stamp, i)


@kernel
def _heap_remove(heap, hpos, stamp, meta, v):
    i = hpos[v]
    hpos[v] = -1
    last = meta[M_HEAP_SIZE] - 1
    meta[M_HEAP_SIZE] = last
    if i == last:
        return
    u = heap[last]
    heap[i] = u
    hpos[u] = i
    _heap_sift_up(heap, hpos, stamp, i)
    _heap_sift_down(heap, hpos, stamp, last, hpos[u])


@kernel
def _touch(heap, hpos, stamp, meta, v, clock):
    """Refresh ``v``'s access time (a later time: it can only sink)."""
    stamp[v] = clock
    if hpos[v] >= 0:
        _heap_sift_down(heap, hpos, stamp, meta[M_HEAP_SIZE], hpos[v])


@kernel
def _is_evictable_leaf(parent, nchild, lock, v):
    return parent[v] >= 0 and nchild[v] == 0 and lock[v] == 0


# ---------------------------------------------------------------- node ids

@kernel
def _alloc_node(start, meta):
    f = meta[M_FREE_HEAD]
    if f != NO_NODE:
        meta[M_FREE_HEAD] = start[f]
        meta[M_FREE_COUNT] -= 1
        return f
    v = meta[M_NODE_END]
    meta[M_NODE_END] = v + 1
    return v


@kernel
def _free_node(T, v, track):
    (tokens, values, start, length, parent, nchild, cxor, term, table,
     lock, stamp, hpos, heap, gen, own, meta) = T
    length[v] = FREE
    parent[v] = -2
    nchild[v] = 0
    cxor[v] = 0
    _term_clear(term, v)
    start[v] = meta[M_FREE_HEAD]
    meta[M_FREE_HEAD] = v
    meta[M_FREE_COUNT] += 1
    if track:
        gen[v] += 1
        lock[v] = 0
        own[v] = 0
        hpos[v] = -1


@kernel
def new_root(T, track):
    """Allocate a namespace root (a node with no span and no parent)."""
    (tokens, values, start, length, parent, nchild, cxor, term, table,
     lock, stamp, hpos, heap, gen, own, meta) = T
    r = _alloc_node(start, meta)
    start[r] = 0
    length[r] = 0
    parent[r] = -1
    nchild[r] = 0
    cxor[r] = 0
    _term_clear(term, r)
    meta[M_ROOTS] += 1
    if track:
        lock[r] = 0
        own[r] = 0
        stamp[r] = 0
        hpos[r] = -1
    return r


# ---------------------------------------------------------------- descent

@kernel
def _common(tokens, s, q, qpos, n):
    """Length of the common prefix of ``tokens[s:s+n]`` and ``q[qpos:qpos+n]``."""
    # Indices are cast to unsigned after the addition: a signed index makes
    # Numba emit wraparound code (the loads become gathers), and adding an
    # int64 to a uint64 would make a float. Blocks of 64 without an early exit
    # vectorize (faster than np.array_equal on cached data); the remainder and
    # the block holding the mismatch go token by token.
    k = 0
    while k + 64 <= n:
        diff = 0
        for j in range(64):
            diff |= np.int64(tokens[np.uintp(s + k + j)]) ^ np.int64(q[np.uintp(qpos + k + j)])
        if diff != 0:
            break
        k += 64
    while k < n and tokens[np.uintp(s + k)] == q[np.uintp(qpos + k)]:
        k += 1
    return k


@kernel
def _descend(tokens, start, length, parent, table, root, q, qs, qn, page):
    """Walk from ``root`` along ``q[qs:qs+qn]``.

    Returns ``(v, c, k, pos)``: ``v`` is the deepest node matched in full and
    ``pos`` the query tokens through it; when the match goes on part-way into
    a child, ``c`` is that child and ``k`` (a multiple of ``page``, >= page)
    the tokens matched inside it; otherwise ``c == -1`` and ``k == 0``.
    """
    v = root
    pos = 0
    while qn - pos >= page:
        c = _find_child(table, tokens, start, parent, v, q, qs + pos, page)
        if c == NO_NODE:
            return v, NO_NODE, 0, pos
        L = length[c]
        n = min(L, qn - pos)
        k = page + _common(tokens, start[c] + page, q, qs + pos + page, n - page)
        if page > 1:
            k -= k % page
        if k == L:
            v = c
            pos += L
        else:
            return v, c, k, pos
    return v, NO_NODE, 0, pos


@kernel
def exists_one(tokens, start, length, parent, term, table, root, q, qs, qn):
    if qn == 0:
        return False
    v, c, k, pos = _descend(tokens, start, length, parent, table, root, q, qs, qn, 1)
    return c == NO_NODE and pos == qn and _term_get(term, v) == 1


@kernel
def match_one(tokens, start, length, parent, table, root, q, qs, qn, page):
    v, c, k, pos = _descend(tokens, start, length, parent, table, root, q, qs, qn, page)
    return pos + k


# ---------------------------------------------------------------- mutation

@kernel
def _copy(dst, d, src, s, n):
    """``dst[d:d+n] = src[s:s+n]`` (non-overlapping, any int dtypes)."""
    dv = dst[d:d + n]
    sv = src[s:s + n]
    for j in range(n):
        dv[j] = sv[j]


@kernel
def _split(T, c, k, page, track):
    """Cut node ``c`` after ``k`` tokens. ``c`` keeps the lower part (and its
    children, table entries of its children and handles); the upper part gets
    a new id, which is returned."""
    (tokens, values, start, length, parent, nchild, cxor, term, table,
     lock, stamp, hpos, heap, gen, own, meta) = T
    slot = _table_slot(table, tokens, start, parent, c, page)
    u = _alloc_node(start, meta)
    pp = parent[c]
    s = start[c]
    start[u] = s
    length[u] = k
    parent[u] = pp
    nchild[u] = 1
    cxor[u] = c
    _term_clear(term, u)
    cxor[pp] ^= c ^ u
    table[slot] = u  # same key: same parent, same first page
    start[c] = s + k
    length[c] -= k
    parent[c] = u
    _table_put(table, tokens, start, parent, c, page)
    meta[M_NODES] += 1
    if track:
        lock[u] = lock[c]  # same subtree, same locks; none taken on u itself
        own[u] = 0
        stamp[u] = stamp[c]
        hpos[u] = -1
    return u


@kernel
def _new_leaf(T, v, q, qs, n, vals, vs, page, track, clock):
    """Append ``q[qs:qs+n]`` to the buffer as a new child of ``v``."""
    (tokens, values, start, length, parent, nchild, cxor, term, table,
     lock, stamp, hpos, heap, gen, own, meta) = T
    x = _alloc_node(start, meta)
    t = meta[M_TOK_USED]
    _copy(tokens, t, q, qs, n)
    if values.shape[0] > 0:
        _copy(values, t, vals, vs, n)
    meta[M_TOK_USED] = t + n
    start[x] = t
    length[x] = n
    parent[x] = v
    nchild[x] = 0
    cxor[x] = 0
    _term_clear(term, x)
    was_leaf = nchild[v] == 0
    nchild[v] += 1
    cxor[v] ^= x
    _table_put(table, tokens, start, parent, x, page)
    meta[M_NODES] += 1
    meta[M_TOKENS] += n
    if track:
        lock[x] = 0
        own[x] = 0
        stamp[x] = clock
        hpos[x] = -1
        if was_leaf and hpos[v] >= 0:
            _heap_remove(heap, hpos, stamp, meta, v)
        _heap_push(heap, hpos, stamp, meta, x)
    return x


@kernel
def insert_one(T, root, q, qs, qn, vals, vs, page, track, clock):
    """Insert ``q[qs:qs+qn]`` (``qn`` a multiple of ``page``).

    Needs room for ``qn`` tokens, 2 nodes and 2 table entries.
    Returns ``(node, cached)``: the node the sequence ends at and how many
    leading tokens were already stored.
    """
    (tokens, values, start, length, parent, nchild, cxor, term, table,
     lock, stamp, hpos, heap, gen, own, meta) = T
    v, c, k, pos = _descend(tokens, start, length, parent, table, root, q, qs, qn, page)
    cached = pos + k
    if track:
        # refresh the matched path, deepest last (it may be a heap leaf)
        w = v
        while w != root:
            _touch(heap, hpos, stamp, meta, w, clock)
            w = parent[w]
    if c != NO_NODE:
        v = _split(T, c, k, page, track)
        if track:
            stamp[v] = clock
        pos += k
    if pos < qn:
        v = _new_leaf(T, v, q, qs + pos, qn - pos, vals, vs + pos, page, track, clock)
    return v, cached


@kernel
def has_room(T, n_tokens, n_nodes):
    """True if ``n_tokens`` buffer tokens, ``n_nodes`` node ids and their
    table entries fit without growing (the table stays under 0.7 load)."""
    tokens = T[0]
    start = T[2]
    table = T[8]
    meta = T[15]
    if meta[M_TOK_USED] + n_tokens > tokens.shape[0]:
        return False
    if start.shape[0] - meta[M_NODE_END] + meta[M_FREE_COUNT] < n_nodes:
        return False
    return (meta[M_NODES] + n_nodes) * 10 <= table.shape[0] * 7


@kernel
def radix_insert(T, root, q):
    """``RadixCache.insert``: 1 if newly stored, 0 if already stored, -1 if
    the arrays need room first (nothing changed then)."""
    qn = q.shape[0]
    if not has_room(T, qn, 2):
        return -1
    v, cached = insert_one(T, root, q, 0, qn, q, 0, 1, False, 0)
    return 1 if set_terminal(T[7], T[15], v) else 0


@kernel
def set_terminal(term, meta, v):
    """Mark ``v`` terminal; True if it was not already."""
    if _term_get(term, v) == 1:
        return False
    _term_set(term, v)
    meta[M_TERMINALS] += 1
    return True


@kernel
def _unlink(T, x, page, track):
    """Delete node ``x`` (childless) from its parent and free it."""
    (tokens, values, start, length, parent, nchild, cxor, term, table,
     lock, stamp, hpos, heap, gen, own, meta) = T
    slot = _table_slot(table, tokens, start, parent, x, page)
    _table_delete_slot(table, tokens, start, parent, slot, page)
    p = parent[x]
    nchild[p] -= 1
    cxor[p] ^= x
    meta[M_NODES] -= 1
    meta[M_TOKENS] -= length[x]
    meta[M_DEAD_TOKENS] += length[x]
    if track and hpos[x] >= 0:
        _heap_remove(heap, hpos, stamp, meta, x)
    _free_node(T, x, track)


@kernel
def _merge_room(start, length, p, c):
    """Buffer room merging ``p`` into its only child ``c`` needs."""
    if start[p] + length[p] == start[c]:
        return 0
    return length[p] + length[c]


@kernel
def _merge_into_child(T, p, c, page, track):
    """Merge node ``p`` into its only child ``c``; ``c`` keeps its id."""
    (tokens, values, start, length, parent, nchild, cxor, term, table,
     lock, stamp, hpos, heap, gen, own, meta) = T
    slot_c = _table_slot(table, tokens, start, parent, c, page)
    _table_delete_slot(table, tokens, start, parent, slot_c, page)
    slot_p = _table_slot(table, tokens, start, parent, p, page)
    pp = parent[p]
    lp = length[p]
    lc = length[c]
    if start[p] + lp == start[c]:
        start[c] = start[p]
    else:
        t = meta[M_TOK_USED]
        sp = start[p]
        sc = start[c]
        _copy(tokens, t, tokens, sp, lp)
        _copy(tokens, t + lp, tokens, sc, lc)
        if values.shape[0] > 0:
            _copy(values, t, values, sp, lp)
            _copy(values, t + lp, values, sc, lc)
        meta[M_TOK_USED] = t + lp + lc
        meta[M_DEAD_TOKENS] += lp + lc
        start[c] = t
    length[c] = lp + lc
    parent[c] = pp
    table[slot_p] = c  # c now has p's key
    cxor[pp] ^= p ^ c
    meta[M_NODES] -= 1
    _free_node(T, p, track)


@kernel
def remove_one(T, root, q, qs, qn):
    """Remove the stored sequence ``q[qs:qs+qn]`` and restore canonical form.

    Returns 1 if removed, 0 if not stored, or ``-(room + 1)`` when the buffer
    lacks ``room`` free tokens for a merge (nothing changed then).
    """
    (tokens, values, start, length, parent, nchild, cxor, term, table,
     lock, stamp, hpos, heap, gen, own, meta) = T
    if qn == 0:
        return 0
    x, c, k, pos = _descend(tokens, start, length, parent, table, root, q, qs, qn, 1)
    if c != NO_NODE or pos != qn or _term_get(term, x) == 0:
        return 0
    room = 0
    p = parent[x]
    sib = NO_NODE
    if nchild[x] == 1:
        room = _merge_room(start, length, x, cxor[x])
    elif nchild[x] == 0 and p != root and _term_get(term, p) == 0 and nchild[p] == 2:
        sib = cxor[p] ^ x
        room = _merge_room(start, length, p, sib)
    if meta[M_TOK_USED] + room > tokens.shape[0]:
        return -(room + 1)
    _term_clear(term, x)
    meta[M_TERMINALS] -= 1
    if nchild[x] == 1:
        _merge_into_child(T, x, cxor[x], 1, False)
    elif nchild[x] == 0:
        _unlink(T, x, 1, False)
        if sib != NO_NODE:
            _merge_into_child(T, p, sib, 1, False)
    return 1


# ---------------------------------------------------------------- iteration

@njit(cache=True)
def children_csr(length, parent, node_end):
    """Children of every node as CSR: ``order[offsets[v]:offsets[v+1]]``."""
    offsets = np.zeros(node_end + 1, np.int64)
    for c in range(node_end):
        if length[c] > 0 and parent[c] >= 0:
            offsets[parent[c] + 1] += 1
    for v in range(node_end):
        offsets[v + 1] += offsets[v]
    fill = offsets[:-1].copy()
    order = np.empty(offsets[node_end], np.int32)
    for c in range(node_end):
        if length[c] > 0 and parent[c] >= 0:
            order[fill[parent[c]]] = c
            fill[parent[c]] += 1
    return offsets, order


@njit(cache=True)
def compact_spans(T, new_tokens, new_values):
    """Copy every live span into ``new_tokens`` (and its values into
    ``new_values``) depth-first, each parent's span right before its first
    child's, and point ``start`` at the copies. Returns the tokens written."""
    (tokens, values, start, length, parent, nchild, cxor, term, table,
     lock, stamp, hpos, heap, gen, own, meta) = T
    node_end = meta[M_NODE_END]
    offsets, order = children_csr(length, parent, node_end)
    stack = np.empty(node_end + 1, np.int64)
    keep_values = new_values.shape[0] > 0
    pos = 0
    for r in range(node_end):
        if parent[r] != -1 or length[r] != 0:
            continue  # not a root
        top = 0
        stack[0] = r
        while top >= 0:
            v = stack[top]
            top -= 1
            if parent[v] >= 0:
                L = length[v]
                _copy(new_tokens, pos, tokens, start[v], L)
                if keep_values:
                    _copy(new_values, pos, values, start[v], L)
                start[v] = pos
                pos += L
            for j in range(offsets[v + 1] - 1, offsets[v] - 1, -1):
                top += 1
                stack[top] = order[j]
    return pos


@njit(cache=True)
def _sorted_children(tokens, start, length, parent, node_end):
    """Children CSR with each child list sorted by first token."""
    offsets, order = children_csr(length, parent, node_end)
    for v in range(node_end):
        a = offsets[v]
        b = offsets[v + 1]
        if b - a > 1:
            keys = np.empty(b - a, np.int64)
            for j in range(a, b):
                keys[j - a] = tokens[start[order[j]]]
            idx = np.argsort(keys, kind="mergesort")
            tmp = order[a:b].copy()
            for j in range(b - a):
                order[a + j] = tmp[idx[j]]
    return offsets, order


@njit(cache=True)
def _dfs_terminals(tokens, start, length, term, root, offsets, order, flat, out_off, fill):
    """Depth-first walk under ``root``. Returns (sequences, total tokens) of
    the terminal paths; with ``fill`` it also writes them as CSR."""
    path = np.empty(0, tokens.dtype)
    if fill:
        path = np.empty(flat.shape[0], tokens.dtype)
    n_nodes = offsets.shape[0]
    stack_v = np.empty(n_nodes, np.int64)
    stack_i = np.empty(n_nodes, np.int64)
    stack_d = np.empty(n_nodes, np.int64)
    top = 0
    stack_v[0] = root
    stack_i[0] = offsets[root]
    stack_d[0] = 0
    n_out = 0
    f = 0
    while top >= 0:
        v = stack_v[top]
        i = stack_i[top]
        if i == offsets[v + 1]:
            top -= 1
            continue
        stack_i[top] = i + 1
        c = order[i]
        d = stack_d[top]
        L = length[c]
        if fill:
            s = start[c]
            for j in range(L):
                path[d + j] = tokens[s + j]
        d2 = d + L
        if _term_get(term, c) == 1:
            if fill:
                for j in range(d2):
                    flat[f + j] = path[j]
                out_off[n_out + 1] = f + d2
            f += d2
            n_out += 1
        top += 1
        stack_v[top] = c
        stack_i[top] = offsets[c]
        stack_d[top] = d2
    return n_out, f


@njit(cache=True)
def collect_sequences(tokens, start, length, parent, term, root, node_end):
    """Every terminal path under ``root`` as CSR ``(flat, offsets)``, in
    lexicographic order of first tokens along the way (depth-first)."""
    offsets, order = _sorted_children(tokens, start, length, parent, node_end)
    empty = np.empty(0, tokens.dtype)
    no_off = np.empty(0, np.int64)
    n, total = _dfs_terminals(tokens, start, length, term, root, offsets, order, empty, no_off, False)
    flat = np.empty(total, tokens.dtype)
    out_off = np.zeros(n + 1, np.int64)
    _dfs_terminals(tokens, start, length, term, root, offsets, order, flat, out_off, True)
    return flat, out_off


# ---------------------------------------------------------------- batches
# Read-only batch loops come in a serial and a ``parallel=True`` (prange)
# flavour; both run the same per-query code.

@kernel
def exists_batch(tokens, start, length, parent, term, table, root, flat, offsets, out):
    for i in range(offsets.shape[0] - 1):
        out[i] = exists_one(tokens, start, length, parent, term, table, root,
                            flat, offsets[i], offsets[i + 1] - offsets[i])


@njit(cache=True, parallel=True)
def exists_batch_parallel(tokens, start, length, parent, term, table, root, flat, offsets, out):
    for i in prange(offsets.shape[0] - 1):
        out[i] = exists_one(tokens, start, length, parent, term, table, root,
                            flat, offsets[i], offsets[i + 1] - offsets[i])


@kernel
def match_batch(tokens, start, length, parent, table, root, flat, offsets, page, out):
    for i in range(offsets.shape[0] - 1):
        out[i] = match_one(tokens, start, length, parent, table, root,
                           flat, offsets[i], offsets[i + 1] - offsets[i], page)


@njit(cache=True, parallel=True)
def match_batch_parallel(tokens, start, length, parent, table, root, flat, offsets, page, out):
    for i in prange(offsets.shape[0] - 1):
        out[i] = match_one(tokens, start, length, parent, table, root,
                           flat, offsets[i], offsets[i + 1] - offsets[i], page)


@kernel
def radix_insert_batch(T, root, flat, offsets, i0, new):
    """Insert sequences ``i0..`` of a CSR batch, marking each terminal;
    ``new[i]`` records whether sequence i was not stored before. Returns the
    index it stopped at: ``len`` when done, else the first sequence that
    needs more room (nothing of it was inserted)."""
    n = offsets.shape[0] - 1
    for i in range(i0, n):
        qs = offsets[i]
        qn = offsets[i + 1] - qs
        if not has_room(T, qn, 2):
            return i
        v, cached = insert_one(T, root, flat, qs, qn, flat, qs, 1, False, 0)
        new[i] = set_terminal(T[7], T[15], v)
    return n


# ---------------------------------------------------------------- prefix cache
# RadixAttention semantics on the same arrays (track=True): every node has a
# lock count, an access stamp from a logical clock and, while it is an
# unlocked leaf, a place in the LRU heap.

@kernel
def pc_match(T, root, q, qs, qn, page, clock):
    """Longest cached whole-page prefix of ``q[qs:qs+qn]``. Splits the node
    the match ends inside of, so the returned node ends exactly at the match;
    stamps the path with ``clock``. Needs room for 1 node. Returns
    ``(length, node)``; ``node == root`` when nothing matched."""
    (tokens, values, start, length, parent, nchild, cxor, term, table,
     lock, stamp, hpos, heap, gen, own, meta) = T
    v, c, k, pos = _descend(tokens, start, length, parent, table, root, q, qs, qn, page)
    if c != NO_NODE:
        v = _split(T, c, k, page, True)
        pos += k
    w = v
    while w != root:
        _touch(heap, hpos, stamp, meta, w, clock)
        w = parent[w]
    return pos, v


@kernel
def pc_match_batch(T, root, flat, offsets, page, clock0, i0, out):
    """``pc_match`` for sequences ``i0..`` of a CSR batch (each cut to whole
    pages), the clock ticking once per sequence (sequence i uses
    ``clock0 + i + 1``). Returns where it stopped for lack of room (``len``
    when done)."""
    n = offsets.shape[0] - 1
    for i in range(i0, n):
        if not has_room(T, 0, 1):
            return i
        qs = offsets[i]
        qn = offsets[i + 1] - qs
        out[i], v = pc_match(T, root, flat, qs, qn - qn % page, page, clock0 + i + 1)
    return n


@kernel
def pc_match_one(T, root, q, page, out):
    """``PrefixCache.match``: ticks the clock, matches ``q`` (cut to whole
    pages) with ``pc_match`` and writes the matched tokens' values to
    ``out`` (``len(out) >= len(q)``; ignored without values). Returns
    ``(length, node, generation)``, or ``(-1, -1, 0)`` when the arrays need
    room for a node first (nothing changed then)."""
    meta = T[15]
    if not has_room(T, 0, 1):
        return -1, -1, np.uint32(0)
    meta[M_CLOCK] += 1
    qn = q.shape[0]
    length, v = pc_match(T, root, q, 0, qn - qn % page, page, meta[M_CLOCK])
    values = T[1]
    if values.shape[0] > 0:
        pc_path_values(T[2], T[3], T[4], values, v, length, out)
    return length, v, T[13][v]


@kernel
def pc_insert_one(T, root, q, n, vals, page):
    """``PrefixCache.insert`` after any eviction: ticks the clock and inserts
    ``q[:n]`` with its values. Returns ``(cached, node, generation)``, or
    ``(-1, -1, 0)`` when the arrays need room first (nothing changed)."""
    meta = T[15]
    if not has_room(T, n, 2):
        return -1, -1, np.uint32(0)
    meta[M_CLOCK] += 1
    v, cached = insert_one(T, root, q, 0, n, vals, 0, page, True, meta[M_CLOCK])
    return cached, v, T[13][v]


@kernel
def pc_path_values(start, length, parent, values, node, total, out):
    """Values of the tokens on the path root..node (``total`` of them) into
    ``out`` in token order."""
    end = total
    v = node
    while parent[v] >= 0:
        L = length[v]
        _copy(out, end - L, values, start[v], L)
        end -= L
        v = parent[v]


@kernel
def pc_plan_insert(T, root, q, qs, qn, page):
    """Before an insert: ``(cached, protect, unlocked)`` where ``cached`` is
    the whole-page match, ``protect`` the deepest node the insert will keep
    (the node the match ends inside of, or the last fully matched one) and
    ``unlocked`` the tokens on root..protect that are not locked now."""
    (tokens, values, start, length, parent, nchild, cxor, term, table,
     lock, stamp, hpos, heap, gen, own, meta) = T
    v, c, k, pos = _descend(tokens, start, length, parent, table, root, q, qs, qn, page)
    protect = c if c != NO_NODE else v
    unlocked = 0
    w = protect
    while w != root:
        if lock[w] == 0:
            unlocked += length[w]
        w = parent[w]
    return pos + k, protect, unlocked


@kernel
def pc_room(T, root, q, qs, n, page, cap):
    """The capacity rule of an insert of ``q[qs:qs+n]`` under ``root``
    (``root < 0``: a namespace with nothing cached yet): ``(need, protect)``
    where ``need`` is 0 when it fits, the tokens to evict first (whole pages)
    while ``protect`` (the deepest node of the path the insert extends; -1 or
    the root for none) is held locked, or -1 when even evicting everything
    else cannot make room."""
    meta = T[15]
    if root < 0:
        cached, protect, unlocked = 0, -1, 0
    else:
        cached, protect, unlocked = pc_plan_insert(T, root, q, qs, n, page)
    new = n - cached
    over = meta[M_TOKENS] + new - cap
    if over <= 0:
        return 0, protect
    if new > cap or meta[M_TOKENS] - meta[M_LOCKED_TOKENS] - unlocked < over:
        return -1, protect
    return -(-over // page) * page, protect


@kernel
def pc_make_room(T, root, q, qs, n, page, cap, out):
    """Apply ``pc_room``: evict what the insert needs with its path locked
    meanwhile (freed values to ``out``). Returns the tokens freed, or -1
    (nothing changed) when the insert cannot fit."""
    need, protect = pc_room(T, root, q, qs, n, page, cap)
    if need <= 0:
        return need
    guard = protect >= 0 and protect != root
    if guard:
        pc_lock(T, protect, 1)
    freed = pc_evict(T, need, page, out)
    if guard:
        pc_lock(T, protect, -1)
    return freed


@kernel
def pc_lock(T, node, delta):
    """Take (``delta=1``) or release (``delta=-1``) a lock on ``node``: its own
    count and the subtree count of it and every ancestor change, keeping the
    locked-token count and the LRU heap in step."""
    (tokens, values, start, length, parent, nchild, cxor, term, table,
     lock, stamp, hpos, heap, gen, own, meta) = T
    own[node] += delta
    w = node
    while parent[w] >= 0:
        before = lock[w]
        lock[w] = before + delta
        if before == 0 and delta > 0:
            meta[M_LOCKED_TOKENS] += length[w]
            if hpos[w] >= 0:
                _heap_remove(heap, hpos, stamp, meta, w)
        elif before + delta == 0:
            meta[M_LOCKED_TOKENS] -= length[w]
            if nchild[w] == 0:
                _heap_push(heap, hpos, stamp, meta, w)
        w = parent[w]


@kernel
def pc_evict(T, n, page, out):
    """Free ``n`` tokens (a multiple of ``page``) from the tails of the least
    recently used unlocked leaves; a parent left childless and unlocked
    becomes a leaf candidate at once. Writes the freed tokens' values to
    ``out`` (when values are kept) and returns the number freed."""
    (tokens, values, start, length, parent, nchild, cxor, term, table,
     lock, stamp, hpos, heap, gen, own, meta) = T
    freed = 0
    keep_values = values.shape[0] > 0
    while freed < n and meta[M_HEAP_SIZE] > 0:
        x = heap[0]
        L = length[x]
        take = min(L, n - freed)
        rest = L - take
        if keep_values:
            _copy(out, freed, values, start[x] + rest, take)
        freed += take
        if rest > 0:
            length[x] = rest
            meta[M_TOKENS] -= take
            meta[M_DEAD_TOKENS] += take
        else:
            p = parent[x]
            if parent[p] >= 0 and nchild[p] == 1 and lock[p] == 0:
                # the parent becomes a leaf: it takes x's place at the top of
                # the heap (one sift instead of a removal and a push)
                heap[0] = p
                hpos[p] = 0
                hpos[x] = -1
                _heap_sift_down(heap, hpos, stamp, meta[M_HEAP_SIZE], 0)
            _unlink(T, x, page, True)
    return freed


# ---------------------------------------------------------------- replay
# A whole trace replayed against a prefix cache in one call: each request
# (in the order a scheduling policy picks) is matched, counted, then inserted,
# with LRU eviction under the capacity and, optionally, a host tier that
# receives what the device tier evicts. The loop is resumable: when an array
# needs room it returns a status, Python grows it and calls again, and the
# per-request phase kept in ``state`` says where to go on.

POLICY_FCFS = 0
POLICY_LPM = 1
POLICY_DFS = 2
RUN_DONE = 0
RUN_DEVICE_ROOM = 1
RUN_HOST_ROOM = 2
# state slots
S_STEP = 0      # requests finished
S_PHASE = 1     # 0: pick + match, 1: evict, 2: insert
S_PROTECT = 2   # device node locked while evicting for this request, or -1
S_REQ = 3       # request being processed
S_NEED = 4      # tokens still to evict for it
S_NEXT = 5      # next request (arrival order) to enter the LPM window
S_INSERTED = 6  # new tokens the device tier took in
S_PEAK = 7      # most tokens the device tier held
S_HOST_INSERTED = 8  # new tokens the host tier took in
STATE_SIZE = 12
# params slots
P_PAGE = 0
P_CAPACITY = 1  # -1: unbounded
P_HOST_CAPACITY = 2  # -1: unbounded
P_HOST = 3      # 1 if there is a host tier
P_POLICY = 4
P_WINDOW = 5
P_MAX_LEN = 6   # longest request (room checks)


@kernel
def _lex_less(flat, offsets, ns, a, b):
    """Request ``a`` before ``b`` in (namespace, tokens) lexicographic order."""
    if ns[a] != ns[b]:
        return ns[a] < ns[b]
    sa = offsets[a]
    na = offsets[a + 1] - sa
    sb = offsets[b]
    nb = offsets[b + 1] - sb
    k = _common(flat, sa, flat, sb, min(na, nb))
    if k < min(na, nb):
        return flat[sa + k] < flat[sb + k]
    return na < nb


@kernel
def dfs_order(flat, offsets, ns, window, order):
    """Arrival order cut into windows of ``window`` requests, each window
    sorted by (namespace, tokens): requests that share a prefix run back to
    back, in the depth-first order of a trie over the window (stable).
    Every other window runs in reverse, so a window starts where the one
    before ended, with the prefix used last, not the one LRU evicts first."""
    n = offsets.shape[0] - 1
    for i in range(n):
        order[i] = i
    for lo in range(0, n, window):
        hi = min(n, lo + window)
        for i in range(lo + 1, hi):  # insertion sort: windows are small
            x = order[i]
            j = i - 1
            while j >= lo and _lex_less(flat, offsets, ns, x, order[j]):
                order[j + 1] = order[j]
                j -= 1
            order[j + 1] = x
        if (lo // window) % 2 == 1:
            a = lo
            b = hi - 1
            while a < b:
                t = order[a]
                order[a] = order[b]
                order[b] = t
                a += 1
                b -= 1


@kernel
def _lpm_pick(Td, roots, flat, offsets, win, state, window, page):
    """Fill the window with the oldest waiting requests, then take out the
    one whose prefix the device cache holds longest (oldest on ties)."""
    n = offsets.shape[0] - 1
    for s in range(window):
        if win[s] < 0 and state[S_NEXT] < n:
            win[s] = state[S_NEXT]
            state[S_NEXT] += 1
    best = -1
    best_len = -1
    best_slot = -1
    for s in range(window):
        i = win[s]
        if i < 0:
            continue
        qs = offsets[i]
        qn = offsets[i + 1] - qs
        L = match_one(Td[0], Td[2], Td[3], Td[4], Td[8], roots[i], flat, qs, qn - qn % page, page)
        if L > best_len or (L == best_len and i < best):
            best = i
            best_len = L
            best_slot = s
    win[best_slot] = -1
    return best


@kernel
def _host_store(Th, root, flat, qs, n, page, hcap):
    """Insert ``flat[qs:qs+n]`` into the host tier like ``PrefixCache.insert``
    (LRU eviction under ``hcap``, skipped when it cannot fit). Needs room for
    ``n`` tokens and 2 nodes. Returns the new tokens the host took in."""
    meta = Th[15]
    if hcap >= 0 and pc_make_room(Th, root, flat, qs, n, page, hcap, Th[1]) < 0:
        return 0
    meta[M_CLOCK] += 1
    v, cached = insert_one(Th, root, flat, qs, n, flat, qs, page, True, meta[M_CLOCK])
    return n - cached


@kernel
def _request_of(offsets, pos):
    """Index of the request whose tokens hold flat position ``pos``."""
    lo = 0
    hi = offsets.shape[0] - 2
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if offsets[mid] <= pos:
            lo = mid
        else:
            hi = mid - 1
    return lo


@njit(cache=True, _nrt=False, nogil=True)  # nogil: sweeps run replays on several threads
def replay_run(Td, Th, roots_d, roots_h, flat, offsets, positions, order, win, params, state,
               hits, host_hits, rejected, evict_out):
    """Replay requests from ``state[S_STEP]`` on; see the section comment.

    Device values are flat positions (``positions[j] == j``): a token's value
    says which request first wrote it and where, so an evicted run of tokens
    names its whole path for the host tier.
    """
    page = params[P_PAGE]
    cap = params[P_CAPACITY]
    hcap = params[P_HOST_CAPACITY]
    has_host = params[P_HOST] == 1
    policy = params[P_POLICY]
    window = params[P_WINDOW]
    max_len = params[P_MAX_LEN]
    dmeta = Td[15]
    hmeta = Th[15]
    nreq = offsets.shape[0] - 1
    while state[S_STEP] < nreq:
        if state[S_PHASE] == 0:
            if not has_room(Td, max_len, 3):
                return RUN_DEVICE_ROOM
            if has_host and not has_room(Th, 0, 1):
                return RUN_HOST_ROOM
            if policy == POLICY_LPM:
                i = _lpm_pick(Td, roots_d, flat, offsets, win, state, window, page)
                order[state[S_STEP]] = i
            else:
                i = order[state[S_STEP]]
            qs = offsets[i]
            qn = offsets[i + 1] - qs
            qn -= qn % page
            dmeta[M_CLOCK] += 1
            d, v = pc_match(Td, roots_d[i], flat, qs, qn, page, dmeta[M_CLOCK])
            hits[i] = d
            if has_host:
                hmeta[M_CLOCK] += 1
                h, hv = pc_match(Th, roots_h[i], flat, qs, qn, page, hmeta[M_CLOCK])
                host_hits[i] = max(0, h - d)
            state[S_REQ] = i
            state[S_PROTECT] = -1
            state[S_NEED] = 0
            state[S_PHASE] = 2
            if cap >= 0:
                need, protect = pc_room(Td, roots_d[i], flat, qs, qn, page, cap)
                if need < 0:
                    rejected[i] = True
                    state[S_PHASE] = 0
                    state[S_STEP] += 1
                    continue
                if need > 0:
                    if protect != roots_d[i]:
                        pc_lock(Td, protect, 1)
                        state[S_PROTECT] = protect
                    state[S_NEED] = need
                    state[S_PHASE] = 1
        i = state[S_REQ]
        if state[S_PHASE] == 1:
            values = Td[1]
            start = Td[2]
            length = Td[3]
            heap = Td[12]
            while state[S_NEED] > 0:
                x = heap[0]
                take = min(length[x], state[S_NEED])
                if has_host:
                    last = values[start[x] + length[x] - 1]
                    r = _request_of(offsets, last)
                    plen = last + 1 - offsets[r]
                    if not has_room(Th, plen, 2):
                        return RUN_HOST_ROOM
                    state[S_HOST_INSERTED] += _host_store(Th, roots_h[r], flat, offsets[r], plen,
                                                          page, hcap)
                pc_evict(Td, take, page, evict_out)
                state[S_NEED] -= take
            if state[S_PROTECT] >= 0:
                pc_lock(Td, state[S_PROTECT], -1)
                state[S_PROTECT] = -1
            state[S_PHASE] = 2
        if state[S_PHASE] == 2:
            qs = offsets[i]
            qn = offsets[i + 1] - qs
            qn -= qn % page
            dmeta[M_CLOCK] += 1
            v, cached = insert_one(Td, roots_d[i], flat, qs, qn, positions, qs, page, True,
                                   dmeta[M_CLOCK])
            state[S_INSERTED] += qn - cached
            state[S_PEAK] = max(state[S_PEAK], dmeta[M_TOKENS])
            state[S_PHASE] = 0
            state[S_STEP] += 1
    return RUN_DONE
