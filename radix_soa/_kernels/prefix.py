"""RadixAttention semantics on the tree (``track=True``): match with split
and recency, insert under a capacity, locks and LRU eviction.

Every node has a subtree lock count, an own lock count, an access stamp from
the logical clock ``meta[M_CLOCK]`` and, while it is an unlocked leaf, a
place in the LRU heap. Entry kernels (``pc_*_one``, ``pc_match_batch``,
``pc_evict_one``) also keep the cache's statistics in meta, so a call
changes them together with the tree. Values are int64 per token (``vals``
in, ``out`` for matched or freed values: caller-allocated, at least as long
as the call may write; ignored when the tree keeps no values).

Call graph (callers after their callees): pc_match -> pc_match_one,
pc_match_batch; path_values; path_unlocked, room_needed, evict_keeping
(pc_lock, pc_evict) -> insert_capped -> pc_insert_one; pc_evict ->
pc_evict_one
"""

from .chain import log_removed, log_stored
from .config import kernel, kernel_helper, kernel_inner
from .descent import descend
from .directory import tree_at
from .heap import heap_push, heap_remove, heap_sift_down, heap_top, touch
from .layout import (DONE, FULL, GEN, HEAP, HKEY, HPOS, LENGTH, LOCK, LOCK_LIMIT, META, M_CLOCK,
                     M_DEAD_TOKENS, M_EVICTED_TOKENS, M_HEAP_SIZE, M_HIT_TOKENS, M_LOCKED_TOKENS,
                     M_LOOKUPS, M_NEW_TOKENS, M_NODE_END, M_PRIORITY, M_QUERY_TOKENS, M_ROOTS,
                     M_TOKENS, M_TOKENS_INSERTED, MISMATCH, NCHILD, NO_NODE, OWN, PARENT, ROOM,
                     STALE, STAMP, START, TABLE, TOKENS, VALUES)
from .mutation import copy_run, extend, free_node, make_root, split, unlink
from .table import has_room, need_room


@kernel_inner
def pc_match(T, root, q, qs, qn, page, clock):
    """Longest cached whole-page prefix of ``q[qs:qs+qn]``. Splits the node
    the match ends inside of, so the returned node ends exactly at the match;
    stamps the path with ``clock``. Needs room for 1 node. Returns
    ``(length, node)``; ``node == root`` when nothing matched."""
    v, c, k, pos = descend(T[TOKENS], T[START], T[LENGTH], T[PARENT], T[TABLE], root, q, qs, qn,
                           page)
    if c != NO_NODE:
        v = split(T, c, k, page, True)
        pos += k
    w = v
    while w != root:
        touch(T[HEAP], T[HPOS], T[STAMP], T[HKEY], T[META], w, clock)
        w = T[PARENT][w]
    return pos, v


@kernel_inner
def path_values(start, length, parent, values, node, total, out):
    """Values of the tokens on the path root..node (``total`` of them) into
    ``out`` in token order."""
    end = total
    v = node
    while parent[v] >= 0:
        L = length[v]
        copy_run(out, end - L, values, start[v], L)
        end -= L
        v = parent[v]


@kernel
def pc_match_one(D, like, root, ns, q, page, out):
    """``PrefixCache.match`` on the tree at directory ``D`` (see
    ``directory``): ticks the clock, matches ``q`` (cut to whole pages) and
    writes the matched tokens' values to ``out`` (``len(q)`` long). ``root <
    0``: namespace number ``ns`` has no root yet; it is made here. Returns
    ``(status, length, node, generation)``; ``ROOM`` (a node for the split
    or the root): nothing changed."""
    T = tree_at(D, like)
    if not has_room(T, 0, 1 if root >= 0 else 2):
        return need_room(T, 0, 2), 0, NO_NODE, T[GEN][0]
    if root < 0:
        root = make_root(T, True, ns)
    meta = T[META]
    meta[M_CLOCK] += 1
    qn = q.shape[0]
    length, v = pc_match(T, root, q, 0, qn - qn % page, page, meta[M_CLOCK])
    values = T[VALUES]
    if values.shape[0] > 0:
        path_values(T[START], T[LENGTH], T[PARENT], values, v, length, out)
    meta[M_LOOKUPS] += 1
    meta[M_QUERY_TOKENS] += qn
    meta[M_HIT_TOKENS] += length
    return DONE, length, v, T[GEN][v]


@kernel
def pc_match_batch(T, ns, flat, offsets, page, cursor, out, vout, nodes):
    """``pc_match_one`` for sequences ``cursor[0]..`` of a CSR batch under
    root ``cursor[1]`` (made first for namespace number ``ns`` when it is
    -1), the clock ticking once per sequence; lengths to ``out`` (int64 per
    sequence), and unless empty, the matched values to ``vout`` (parallel to
    ``flat``: sequence i's at its own offset) and ``(node, generation)`` to
    ``nodes[2i], nodes[2i+1]``. Returns ``DONE``, or ``ROOM`` with
    ``cursor[0]`` at the first sequence not matched."""
    n = offsets.shape[0] - 1
    meta = T[META]
    if cursor[1] < 0:
        if not has_room(T, 0, 1):
            return need_room(T, 0, 1)
        cursor[1] = make_root(T, True, ns)
    root = cursor[1]
    for i in range(cursor[0], n):
        if not has_room(T, 0, 1):
            cursor[0] = i
            return need_room(T, 0, 1)
        qs = offsets[i]
        qn = offsets[i + 1] - qs
        meta[M_CLOCK] += 1
        out[i], v = pc_match(T, root, flat, qs, qn - qn % page, page, meta[M_CLOCK])
        if nodes.shape[0] > 0:
            nodes[2 * i] = v
            nodes[2 * i + 1] = T[GEN][v]
        if vout.shape[0] > 0:
            path_values(T[START], T[LENGTH], T[PARENT], T[VALUES], v, out[i], vout[qs:])
        meta[M_LOOKUPS] += 1
        meta[M_QUERY_TOKENS] += qn
        meta[M_HIT_TOKENS] += out[i]
    cursor[0] = n
    return DONE


@kernel_inner
def path_unlocked(T, root, node):
    """Tokens on the path root..node that no lock protects now."""
    lock, length, parent = T[LOCK], T[LENGTH], T[PARENT]
    unlocked = 0
    w = node
    while w != root and w >= 0:
        if lock[w] == 0:
            unlocked += length[w]
        w = parent[w]
    return unlocked


@kernel_helper
def room_needed(T, new, unlocked, page, cap):
    """The capacity rule of adding ``new`` tokens while the path holding
    ``unlocked`` unlocked tokens is kept: 0 when it fits, the tokens to evict
    first (whole pages), or -1 when even evicting everything else cannot
    make room."""
    meta = T[META]
    over = meta[M_TOKENS] + new - cap
    if over <= 0:
        return 0
    if new > cap or meta[M_TOKENS] - meta[M_LOCKED_TOKENS] - unlocked < over:
        return -1
    return -(-over // page) * page


@kernel_inner
def evict_keeping(T, root, protect, need, page, out, ev=None):
    """Evict ``need`` tokens while the path root..``protect`` is held locked
    (freed values to ``out``); returns the tokens freed."""
    guard = protect >= 0 and protect != root
    if guard:
        pc_lock(T, protect, 1)
    freed = pc_evict(T, need, page, out, ev)
    if guard:
        pc_lock(T, protect, -1)
    return freed


@kernel_inner
def insert_capped(T, root, q, qs, n, vals, vs, page, cap, out, min_cached=0, through=-1,
                  ev=None):
    """Insert ``q[qs:qs+n]`` (``n`` whole pages; values ``vals[vs:]``) under
    capacity ``cap`` (-1: unbounded) in one descent: the match, the room it
    needs (evicting least recently used tokens, never from the path it
    extends; freed values to ``out``, ``n`` long) and the insert. Returns
    ``(status, cached, node, freed)``; ``FULL`` (locked tokens leave no
    room) is decided before the room check, so a refused insert never
    grows the arrays; ``ROOM`` (the new tokens and 2 nodes): nothing
    changed; so is ``MISMATCH``: fewer than ``min_cached`` leading tokens
    are cached, or the path does not pass through node ``through`` (>= 0:
    a request's locked node; its tokens left its own cached prefix, even
    for another cached path as long). ``ev``: the event log (``chain``), or
    None."""
    v, c, k, pos = descend(T[TOKENS], T[START], T[LENGTH], T[PARENT], T[TABLE], root, q, qs, n,
                           page)
    cached = pos + k
    if cached < min_cached:
        return MISMATCH, cached, NO_NODE, 0
    protect = c if c != NO_NODE else v
    if through >= 0 and not on_path(T[PARENT], root, protect, through):
        return MISMATCH, cached, NO_NODE, 0
    freed = 0
    need = 0
    if cap >= 0:
        need = room_needed(T, n - cached, path_unlocked(T, root, protect), page, cap)
        # the values freed go to ``out``: never more than it holds
        if need < 0 or (T[VALUES].shape[0] > 0 and need > out.shape[0]):
            return FULL, cached, NO_NODE, 0
    if not has_room(T, n - cached, 2):
        return need_room(T, n - cached, 2), cached, NO_NODE, 0
    if need > 0:
        freed = evict_keeping(T, root, protect, need, page, out, ev)
    meta = T[META]
    meta[M_CLOCK] += 1
    node = extend(T, root, v, c, k, pos, q, qs, n, vals, vs, page, True, meta[M_CLOCK])
    if ev is not None:
        log_stored(T, ev, root, q, qs, cached, n, page)
    return DONE, cached, node, freed


@kernel
def pc_insert_one(D, like, root, ns, q, n, vals, page, cap, out, priority, ev=None):
    """``PrefixCache.insert`` of ``q[:n]`` with ``insert_capped`` on the tree
    at directory ``D``; ``root < 0``: namespace number ``ns`` has no root
    yet, and it is made here unless the insert cannot fit.

    Returns ``(status, cached, node, generation, freed)``. ``ROOM`` or
    ``FULL``: nothing changed. ``priority``: the request's, for the
    ``priority`` policy (held in meta for the call only)."""
    return insert_one_at_priority(tree_at(D, like), root, ns, q, n, vals, page, cap, out,
                                  priority, 0, NO_NODE, ev)


@kernel_inner
def insert_one_at_priority(T, root, ns, q, n, vals, page, cap, out, priority, min_cached=0,
                           through=-1, ev=None):
    """``_insert_one`` with ``priority`` held in meta for the call only (the
    ``priority`` policy reads it)."""
    T[META][M_PRIORITY] = priority
    result = _insert_one(T, root, ns, q, n, vals, page, cap, out, min_cached, through, ev)
    T[META][M_PRIORITY] = 0
    return result


@kernel_inner
def _insert_one(T, root, ns, q, n, vals, page, cap, out, min_cached=0, through=-1, ev=None):
    if root < 0:
        if cap >= 0 and room_needed(T, n, 0, page, cap) < 0:
            return FULL, 0, NO_NODE, T[GEN][0], 0
        if not has_room(T, n, 3):
            return need_room(T, n, 3), 0, NO_NODE, T[GEN][0], 0
        root = make_root(T, True, ns)
    status, cached, node, freed = insert_capped(T, root, q, 0, n, vals, 0, page, cap, out,
                                                min_cached, through, ev)
    if status != DONE:
        return status, cached, NO_NODE, T[GEN][0], 0
    count_insert(T[META], q.shape[0], n - cached, freed)
    return DONE, cached, node, T[GEN][node], freed


@kernel_inner
def count_insert(meta, handed, new, freed):
    """The statistics of one insert: ``handed`` tokens given, ``new`` of
    them added, ``freed`` evicted to make room."""
    meta[M_TOKENS_INSERTED] += handed
    meta[M_NEW_TOKENS] += new
    meta[M_EVICTED_TOKENS] += freed


@kernel_inner
def pc_lock(T, node, delta):
    """Take (``delta=1``) or release (``delta=-1``) a lock on ``node``: its own
    count and the subtree count of it and every ancestor change, keeping the
    locked-token count and the LRU heap in step. Unchecked: kernels use it
    for their own guard locks (which fit because ``lock_handle`` stops user
    locks at ``LOCK_LIMIT``)."""
    lock, length, parent, nchild = T[LOCK], T[LENGTH], T[PARENT], T[NCHILD]
    heap, hpos, stamp, meta = T[HEAP], T[HPOS], T[STAMP], T[META]
    T[OWN][node] += delta
    w = node
    while parent[w] >= 0:
        before = lock[w]
        lock[w] = before + delta
        if before == 0 and delta > 0:
            meta[M_LOCKED_TOKENS] += length[w]
            if hpos[w] >= 0:
                heap_remove(heap, hpos, T[HKEY], meta, w)
        elif before + delta == 0:
            meta[M_LOCKED_TOKENS] -= length[w]
            if nchild[w] == 0:
                heap_push(heap, hpos, stamp, T[HKEY], meta, w)
        w = parent[w]


@kernel
def pc_insert_batch(D, like, root, flat, offsets, vflat, page, cap, cursor, cached, out,
                    priority, ev=None):
    """``PrefixCache.insert_batch``: ``insert_capped`` of sequences
    ``cursor[0]..`` of a CSR batch (values ``vflat`` parallel to ``flat``, or
    empty), evicted values appended to ``out`` from ``cursor[1]`` (``out`` as
    long as the batch: an insert never frees more than it adds).
    ``cached[i]``: leading tokens already cached, or -1 for a sequence that
    cannot fit under ``cap`` (skipped). Returns ``ROOM`` with the cursor at
    the sequence to resume, else ``DONE``."""
    T = tree_at(D, like)
    T[META][M_PRIORITY] = priority
    status = _insert_batch(T, root, flat, offsets, vflat, page, cap, cursor, cached, out, ev)
    T[META][M_PRIORITY] = 0
    return status


@kernel_inner
def _insert_batch(T, root, flat, offsets, vflat, page, cap, cursor, cached, out, ev=None):
    meta = T[META]
    while cursor[0] < offsets.shape[0] - 1:
        i = cursor[0]
        qs = offsets[i]
        qn = offsets[i + 1] - qs
        n = qn - qn % page
        status, c, node, freed = insert_capped(T, root, flat, qs, n, vflat, qs, page, cap,
                                               out[cursor[1]:], 0, NO_NODE, ev)
        if status == ROOM:
            return ROOM
        if status == FULL:
            cached[i] = -1
        else:
            cached[i] = c
            cursor[1] += freed
            count_insert(meta, qn, n - c, freed)
        cursor[0] = i + 1
    return DONE


@kernel_inner
def handle_live(T, v, gen):
    """True if ``(v, gen)`` names a live node of ``T``."""
    return 0 <= v < T[META][M_NODE_END] and T[LENGTH][v] >= 0 and T[GEN][v] == gen


@kernel
def pc_peek(D, like, root, q, page, out):
    """Read-only ``match``: no split, no stamp, no statistics. Returns
    ``(length, node, generation)``: ``node`` is the node the match ends in
    (a match ending inside a node gives that node: locking it protects at
    least the match); the matched tokens' values go to ``out``."""
    T = tree_at(D, like)
    start, length, parent, values = T[START], T[LENGTH], T[PARENT], T[VALUES]
    v, c, k, pos = descend(T[TOKENS], start, length, T[PARENT], T[TABLE], root, q, 0, q.shape[0],
                           page)
    if values.shape[0] > 0:
        path_values(start, length, parent, values, v, pos, out)
        if c != NO_NODE:
            copy_run(out, pos, values, start[c], k)
    if c != NO_NODE:
        v = c
        pos += k
    return pos, v, T[GEN][v]


@kernel
def pc_touch(D, like, v, gen):
    """Refresh the recency of the path root..``(v, gen)``: ``STALE`` or
    ``DONE``."""
    T = tree_at(D, like)
    if not handle_live(T, v, gen):
        return STALE
    meta, parent = T[META], T[PARENT]
    meta[M_CLOCK] += 1
    w = v
    while parent[w] >= 0:
        touch(T[HEAP], T[HPOS], T[STAMP], T[HKEY], meta, w, meta[M_CLOCK])
        w = parent[w]
    return DONE


@kernel
def drop_subtree(D, like, root, order, page, out, keep_root, ev=None):
    """Remove every node of ``order`` (the non-root nodes under ``root``,
    deepest first, none locked) and then ``root`` itself unless
    ``keep_root``; their values go to ``out`` (``sum of their lengths``
    long). Returns the tokens removed."""
    T = tree_at(D, like)
    values, start, length = T[VALUES], T[START], T[LENGTH]
    keep_values = values.shape[0] > 0
    done = 0
    for i in range(order.shape[0]):
        x = order[i]
        if keep_values:
            copy_run(out, done, values, start[x], length[x])
        done += length[x]
        if ev is not None:
            log_removed(T, ev, x, 0, length[x], page)
        unlink(T, x, page, True)
    if not keep_root:
        free_node(T, root, True)
        T[META][M_ROOTS] -= 1
    return done


@kernel_inner
def lock_fits(T, v):
    """True if one more user lock on non-root node ``v`` keeps every count
    within ``LOCK_LIMIT`` (a subtree count is largest at the path's top)."""
    return T[LOCK][path_top(T[PARENT], v)] < LOCK_LIMIT and T[OWN][v] < LOCK_LIMIT


@kernel_inner
def on_path(parent, root, v, node):
    """True if ``node`` lies on the path ``root``..``v`` (``v`` included)."""
    w = v
    while w != node and w != root and w >= 0:
        w = parent[w]
    return w == node


@kernel_inner
def path_top(parent, v):
    """The node of the path root..``v`` just below the root (``v`` non-root)."""
    w = v
    while parent[parent[w]] >= 0:
        w = parent[w]
    return w


@kernel
def lock_handle(D, like, v, gen, delta):
    """``PrefixCache.lock`` (``delta=1``) / ``unlock`` (``delta=-1``) of the
    handle ``(v, gen)`` on the tree at directory ``D``. Returns ``(status,
    tokens)``: ``STALE`` when the handle's node is gone; ``FULL`` (nothing
    changed) when a lock would take a count to ``LOCK_LIMIT`` or an unlock
    finds no lock of the node's own; else ``DONE`` and the tokens newly
    locked (lock) or newly unlocked (unlock). A root is a no-op."""
    T = tree_at(D, like)
    meta, parent = T[META], T[PARENT]
    if not handle_live(T, v, gen):
        return STALE, 0
    if parent[v] < 0:
        return DONE, 0
    if delta > 0:
        if not lock_fits(T, v):
            return FULL, 0
    elif T[OWN][v] <= 0:
        return FULL, 0
    before = meta[M_LOCKED_TOKENS]
    pc_lock(T, v, delta)
    return DONE, abs(meta[M_LOCKED_TOKENS] - before)


@kernel_inner
def pc_evict(T, n, page, out, ev=None):
    """Free ``n`` tokens (a multiple of ``page``) from the tails of the least
    recently used unlocked leaves; a parent left childless and unlocked
    becomes a leaf candidate at once. Writes the freed tokens' values to
    ``out`` (when values are kept) and returns the number freed."""
    values, start, length, parent = T[VALUES], T[START], T[LENGTH], T[PARENT]
    nchild, lock, heap, hpos, stamp, meta = T[NCHILD], T[LOCK], T[HEAP], T[HPOS], T[STAMP], T[META]
    hkey = T[HKEY]
    freed = 0
    keep_values = values.shape[0] > 0
    while freed < n and meta[M_HEAP_SIZE] > 0:
        x = heap_top(heap, hpos, stamp, hkey, meta)
        L = length[x]
        take = min(L, n - freed)
        rest = L - take
        if keep_values:
            copy_run(out, freed, values, start[x] + rest, take)
        if ev is not None:
            log_removed(T, ev, x, rest, take, page)
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
                hkey[p] = stamp[p]
                heap_sift_down(heap, hpos, hkey, meta[M_HEAP_SIZE], 0)
            unlink(T, x, page, True)
    return freed


@kernel
def pc_evict_one(D, like, n, page, out, ev=None):
    """``PrefixCache.evict`` on the tree at directory ``D``: free ``n``
    tokens rounded up to whole pages (at most the unlocked ones); ``out`` at
    least that long. Returns the freed count."""
    T = tree_at(D, like)
    meta = T[META]
    n = -(-n // page) * page
    n = min(n, meta[M_TOKENS] - meta[M_LOCKED_TOKENS])
    freed = pc_evict(T, n, page, out, ev)
    meta[M_EVICTED_TOKENS] += freed
    return freed
