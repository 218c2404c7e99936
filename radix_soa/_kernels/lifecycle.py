"""The request lifecycle of ``PrefixCache`` (``begin`` / ``checkpoint`` /
``finish`` / ``abort``), one kernel per transition.

Each kernel changes the tree, the in-flight count ``meta[M_INFLIGHT]`` and
the request's own state array ``st`` (slots ``R_*`` of ``layout``) in the
same call, writing ``st[R_PHASE]`` last: whatever interrupts the Python
around it, a request is either before or after a transition, never between,
and what the transition returned can be recomputed from ``st`` and the
``out`` it filled. Statuses
as everywhere (``layout``); after ``ROOM``, ``FULL``, ``LIMIT`` or
``STALE`` nothing changed.

Call graph (callers after their callees): begin_at, checkpoint_at, finish_at
(the request transitions on T) -> req_begin, req_checkpoint, req_finish,
req_abort
"""

from .config import kernel, kernel_inner
from .descent import descend
from .directory import tree_at
from .heap import touch
from .layout import (ABORTED, DONE, FINISHED, FULL, GEN, HEAP, HKEY, HPOS, LENGTH, LIMIT, LOCK,
                     LOCK_LIMIT, MISMATCH,
                     M_CLOCK, M_EVICTED_TOKENS, M_HIT_TOKENS, M_INFLIGHT, M_LOCKED_TOKENS,
                     M_LOOKUPS, M_QUERY_TOKENS, M_TOKENS, META, NO_NODE, OPEN, OWN,
                     PARENT, R_BEGUN, R_CACHED, R_FREED, R_GEN, R_LAST_CACHED, R_LAST_FREED,
                     R_LAST_FROM, R_LAST_GEN, R_LAST_N, R_LAST_NODE, R_LAST_PARTIAL, R_LOCKED,
                     R_NODE, R_PHASE, R_RESERVED, R_STEPS, STALE, STAMP, START, TABLE, TOKENS,
                     VALUES)
from .mutation import split
from .prefix import (handle_live, insert_one_at_priority, lock_fits, path_top, path_unlocked,
                     path_values, pc_evict, pc_lock)
from .table import has_room, need_room


@kernel
def req_begin(D, like, root, known, q, page, out, count, capacity, reserve, evict_out, st,
              ev=None):
    """``begin``: match ``q`` under ``root`` (``known=False``: the namespace
    has no root; a miss, and nothing is made), lock the matched path, and
    with ``count`` (``count_inflight``) reserve ``reserve`` tokens (< 0: the
    unmatched ones), under ``capacity >= 0`` evicting into ``evict_out``
    what the reservation needs. The matched values go to ``out``. Returns ``DONE``,
    ``ROOM`` (a node for the split), ``FULL`` (locked and reserved tokens
    leave no room) or ``LIMIT`` (the path's lock count is at its limit);
    all but ``DONE`` before changing anything."""
    return begin_at(tree_at(D, like), root, known, q, page, out, count, capacity, reserve,
                    evict_out, st, ev)


@kernel_inner
def begin_at(T, root, known, q, page, out, count, capacity, reserve, evict_out, st, ev=None):
    """``req_begin`` on the tree ``T`` (``req_begin_batch`` calls it per request)."""
    meta = T[META]
    qn = q.shape[0]
    if st[R_PHASE] != 0:
        return STALE
    length = 0
    v, c, k = root, NO_NODE, 0
    newly_locked = 0
    if known:
        if not has_room(T, 0, 1):
            return need_room(T, 0, 1)
        v, c, k, pos = descend(T[TOKENS], T[START], T[LENGTH], T[PARENT], T[TABLE], root, q, 0,
                               qn - qn % page, page)
        length = pos + k
        end = c if c != NO_NODE else v
        if T[PARENT][end] >= 0 and not lock_fits(T, end):
            return LIMIT
        newly_locked = path_unlocked(T, root, v) + (k if c != NO_NODE and T[LOCK][c] == 0
                                                    else 0)
    need = 0
    want = 0
    if count:
        need = reserve if reserve >= 0 else qn - length
    if count and capacity >= 0:
        over = meta[M_TOKENS] + meta[M_INFLIGHT] + need - capacity
        if over > 0:
            evictable = meta[M_TOKENS] - meta[M_LOCKED_TOKENS] - newly_locked
            want = min(-(-over // page) * page, evictable)
            if over > evictable or (T[VALUES].shape[0] > 0 and want > evict_out.shape[0]):
                return FULL
    # from here on nothing can fail
    if known:
        meta[M_CLOCK] += 1
        if c != NO_NODE:
            v = split(T, c, k, page, True)
        w = v
        while w != root:
            touch(T[HEAP], T[HPOS], T[STAMP], T[HKEY], meta, w, meta[M_CLOCK])
            w = T[PARENT][w]
    locked = T[PARENT][v] >= 0
    if locked:
        pc_lock(T, v, 1)
    freed = 0
    if want > 0:
        freed = pc_evict(T, want, page, evict_out, ev)
        meta[M_EVICTED_TOKENS] += freed
    meta[M_INFLIGHT] += need
    if T[VALUES].shape[0] > 0 and out.shape[0] > 0:  # empty: a batch that reads them later
        path_values(T[START], T[LENGTH], T[PARENT], T[VALUES], v, length, out)
    meta[M_LOOKUPS] += 1
    meta[M_QUERY_TOKENS] += qn
    meta[M_HIT_TOKENS] += length
    st[R_NODE] = v
    st[R_GEN] = T[GEN][v]
    st[R_LOCKED] = 1 if locked else 0
    st[R_CACHED] = length
    st[R_BEGUN] = length
    st[R_RESERVED] = need
    st[R_FREED] = freed
    st[R_STEPS] = 1
    st[R_PHASE] = OPEN
    return DONE


@kernel_inner
def _lock_held(T, st):
    """True unless the request's lock is gone: an ``unlock`` of its node
    from outside took it (and the node may since have been evicted)."""
    return not st[R_LOCKED] or (handle_live(T, st[R_NODE], st[R_GEN])
                                and T[OWN][st[R_NODE]] > 0)


@kernel_inner
def _check_request(T, st):
    """``DONE`` if ``st`` is an open request whose lock (if any) is held."""
    if st[R_PHASE] != OPEN or not _lock_held(T, st):
        return STALE
    return DONE


@kernel_inner
def _top_lock(T, root, q, n, page, st):
    """The lock count at the top of the path a checkpoint's insert ends on
    (the top of the request's locked path, or of the first page's child)."""
    parent = T[PARENT]
    if st[R_LOCKED]:
        return T[LOCK][path_top(parent, st[R_NODE])]
    if root < 0 or n == 0:
        return 0
    v, c, k, pos = descend(T[TOKENS], T[START], T[LENGTH], T[PARENT], T[TABLE], root, q, 0, page,
                           page)
    top = v if v != root else c
    return T[LOCK][top] if top != NO_NODE else 0


@kernel_inner
def free_layout(st, n, nvals, finishing):
    """``(partial, end)`` of the slots a checkpoint or finish of ``n``
    whole-page tokens with ``nvals`` values hands back in its ``out``:
    ``out[:end]`` ends with the duplicates (at most ``n`` minus the request's
    cached prefix) followed, for a finish, by the ``partial`` last page's
    values; what making room evicts goes from ``end`` on. ``(0, 0)``
    without values."""
    if nvals == 0:
        return 0, 0
    partial = nvals - n if finishing else 0
    return partial, max(n - st[R_CACHED], 0) + partial


@kernel_inner
def _cache_tokens(T, root, ns, q, n, vals, page, cap, out, priority, st, finishing, ev=None):
    """The insert of a checkpoint or finish, for an open request whose lock
    is held (else ``STALE``), its outcome recorded in ``st[R_LAST_*]``.
    ``MISMATCH``: ``q`` does not start with the request's cached prefix
    (its path does not pass through the request's locked node);
    ``LIMIT``: the lock it would move to cannot be taken. The slots to hand
    back go to ``out`` (``free_layout``): the caller keeps no copy of
    ``vals``, so the result can be rebuilt from ``st`` and ``out`` alone."""
    status = _check_request(T, st)
    if status != DONE:
        return status
    if n < st[R_CACHED]:
        return MISMATCH
    if _top_lock(T, root, q, n, page, st) >= LOCK_LIMIT:
        return LIMIT
    has_values = T[VALUES].shape[0] > 0
    partial, end = free_layout(st, n, vals.shape[0], finishing)
    evict_out = out[end:]
    # the insert must pass through the request's locked node: another
    # cached path as long is not its prefix
    through = st[R_NODE] if st[R_LOCKED] else NO_NODE
    status, cached, node, gen, freed = insert_one_at_priority(T, root, ns, q, n, vals, page, cap,
                                                              evict_out, priority, st[R_CACHED],
                                                              through, ev)
    if status == DONE:
        frm = st[R_CACHED]
        if has_values:
            dup = cached - frm
            at = end - partial - dup
            for i in range(dup):
                out[at + i] = vals[frm + i]
            for i in range(partial):
                out[end - partial + i] = vals[n + i]
        st[R_LAST_FROM] = frm
        st[R_LAST_CACHED] = cached
        st[R_LAST_N] = n
        st[R_LAST_FREED] = freed
        st[R_LAST_PARTIAL] = partial
        st[R_LAST_NODE] = node
        st[R_LAST_GEN] = gen
    return status


@kernel
def req_checkpoint(D, like, root, ns, q, n, vals, page, cap, out, priority, st, ev=None):
    """``checkpoint``: insert ``q[:n]`` (values ``vals``, evicted values to
    ``out``) under ``cap``, move the request's lock to the node it ends at
    and turn the reservation of the newly cached tokens into cached ones.
    ``ROOM``/``FULL``/``STALE``/``MISMATCH``/``LIMIT``: nothing changed."""
    return checkpoint_at(tree_at(D, like), root, ns, q, n, vals, page, cap, out, priority, st, ev)


@kernel_inner
def checkpoint_at(T, root, ns, q, n, vals, page, cap, out, priority, st, ev=None):
    """``req_checkpoint`` on the tree ``T``."""
    status = _cache_tokens(T, root, ns, q, n, vals, page, cap, out, priority, st, False, ev)
    if status != DONE:
        return status
    node = st[R_LAST_NODE]
    locked = T[PARENT][node] >= 0
    st[R_STEPS] += 1
    if locked:  # fits: _cache_tokens checked the path's top count
        pc_lock(T, node, 1)
    if st[R_LOCKED]:
        pc_lock(T, st[R_NODE], -1)
    grown = max(0, n - st[R_CACHED])
    moved = min(st[R_RESERVED], grown)
    T[META][M_INFLIGHT] -= moved
    st[R_RESERVED] -= moved
    st[R_NODE] = node
    st[R_GEN] = st[R_LAST_GEN]
    st[R_LOCKED] = 1 if locked else 0
    st[R_CACHED] = max(st[R_CACHED], n)
    return DONE


@kernel
def req_finish(D, like, root, ns, q, n, vals, page, cap, out, priority, st, ev=None):
    """``finish``: insert ``q[:n]`` as ``req_checkpoint`` does, then release
    the request's lock and reservation and close it."""
    return finish_at(tree_at(D, like), root, ns, q, n, vals, page, cap, out, priority, st, ev)


@kernel_inner
def finish_at(T, root, ns, q, n, vals, page, cap, out, priority, st, ev=None):
    """``req_finish`` on the tree ``T``."""
    status = _cache_tokens(T, root, ns, q, n, vals, page, cap, out, priority, st, True, ev)
    if status != DONE:
        return status
    _release(T, st)
    st[R_STEPS] += 1
    st[R_PHASE] = FINISHED
    return DONE


@kernel
def req_abort(D, like, st):
    """``abort``: release the request's lock (unless an outside ``unlock``
    took it already) and reservation, and close it."""
    T = tree_at(D, like)
    if st[R_PHASE] != OPEN:
        return STALE
    if not _lock_held(T, st):
        st[R_LOCKED] = 0
    _release(T, st)
    st[R_STEPS] += 1
    st[R_PHASE] = ABORTED
    return DONE


@kernel
def _release(T, st):
    if st[R_LOCKED]:
        pc_lock(T, st[R_NODE], -1)
        st[R_LOCKED] = 0
    T[META][M_INFLIGHT] -= st[R_RESERVED]
    st[R_RESERVED] = 0
