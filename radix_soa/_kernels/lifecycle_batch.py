"""A scheduler step in one call: ``begin`` / ``checkpoint`` / ``finish`` of
many requests (``PrefixCache.begin_batch``, ``checkpoint_batch``,
``finish_batch``), each request exactly as its own ``lifecycle`` kernel
would do it, in order.

All or nothing. Before it changes anything, a batch kernel checks room for
the whole batch (``ROOM``: grow, call again), then every request on its
own (a closed request, tokens that leave its cached prefix: that status,
``info[0]`` the request), then whether any request could be refused
because of the others (``UNSURE``: the capacity could be reached, or a lock
count could reach its limit). A batch that passes all of these runs
(``live``) and nothing in it can fail. The caller runs an ``UNSURE`` batch
again with ``live=False`` and ``B``, a copy of the tree's arrays taken
just before: if a request is refused, the same call puts the tree, the
request states and the event log back as they were (``_undo``) before it
returns, so no Python line runs between a half-done batch and its undo.

Request states are rows of ``states`` (``rows`` empty) or, with the
directory, at the addresses in ``rows`` (requests begun apart, whose state
rows lie in different blocks), so every state is written in the same call
as the tree.

Call graph (callers after their callees): row_at (a request's state row);
the per-request checks -> req_begin_batch, req_cache_batch (a scheduler
step, all or nothing: _undo from a copy)
"""

import numpy as np
from numba.extending import overload

from .config import kernel, kernel_inner
from .descent import descend
from .directory import HAS_DIRECTORY, tree_at
from .layout import (CXOR, DONE, FULL, GEN, HEAP, HKEY, HPOS, LENGTH, LOCK, LOCK_LIMIT, META,
                     MISMATCH, M_INFLIGHT, M_LOCKED_TOKENS, M_TOKENS, NCHILD, NO_NODE, OWN,
                     PARENT, R_CACHED, R_FREED, R_LAST_CACHED, R_LAST_FREED, R_LAST_FROM,
                     R_LAST_N, R_LAST_PARTIAL, R_LOCKED, R_NODE, R_RESERVED, REQUEST_SIZE, STALE,
                     STAMP, START, TABLE, TERM, TOKENS, VALUES)
from .lifecycle import (_check_request, _top_lock, begin_at, checkpoint_at, finish_at,
                        free_layout)
from .mutation import copy_run, make_root
from .prefix import room_needed
from .table import has_room, need_room

UNSURE = 9  # a request of the batch might be refused: run it with its undo copy


def row_at(states, rows, i):
    """``(st,)``: request ``i``'s state, row ``i`` of ``states`` (``rows``
    empty) or the state row at address ``rows[i]``."""
    raise NotImplementedError("row_at is for kernels only")


@overload(row_at, inline="always")
def _row_at(states, rows, i):
    if not HAS_DIRECTORY:  # pragma: no cover - a Numba without populate_array
        # (rows then stay empty: prefix_cache.batch_lifecycle refuses a list of requests)
        return lambda states, rows, i: (states[i],)
    from .directory import view_at

    def at(states, rows, i):
        # a view made from an address, in a 1-tuple: a kernel without NRT
        # returns no array it was not given (``states[i]`` is refused)
        if rows.shape[0] == 0:
            return (view_at(states.ctypes.data + i * (8 * REQUEST_SIZE), REQUEST_SIZE, np.int64),)
        return (view_at(rows[i], REQUEST_SIZE, np.int64),)

    return at


@kernel_inner
def _top_lock_of(T, root, q, page):
    """The lock count at the top of the path ``q``'s first page takes."""
    if q.shape[0] < page:
        return 0
    v, c, k, pos = descend(T[TOKENS], T[START], T[LENGTH], T[PARENT], T[TABLE], root, q, 0, page, page)
    top = v if v != root else c
    return T[LOCK][top] if top != NO_NODE else 0


@kernel
def req_begin_batch(D, like, root, known, flat, offsets, page, out, count, capacity, reserves,
                    evict_out, states, rows, live, B, saved, info, ev=None):
    """``req_begin`` of every sequence of the CSR batch ``flat``/``offsets``
    (``reserves[i] < 0``: the default reservation), matched values at the
    sequence's own offsets in ``out``, evicted values one after another in
    ``evict_out`` (long enough for the whole batch). ``info[0]``: the request
    a status other than ``DONE`` is about."""
    T = tree_at(D, like)
    meta = T[META]
    k = offsets.shape[0] - 1
    if known and not has_room(T, 0, k):
        return need_room(T, 0, k)
    if live:
        sure = True
        if count and capacity >= 0:
            # a begin is refused iff locked + in-flight tokens would pass the
            # capacity; each begin adds at most its query (or page-cut query
            # plus its reservation) to their sum
            total = meta[M_LOCKED_TOKENS] + meta[M_INFLIGHT]
            for i in range(k):
                qn = offsets[i + 1] - offsets[i]
                total += qn if reserves[i] < 0 else qn - qn % page + reserves[i]
            sure = total <= capacity
        if sure and known:
            for i in range(k):  # every lock count on a path is at most its top's
                if _top_lock_of(T, root, flat[offsets[i]:offsets[i + 1]], page) + k >= LOCK_LIMIT:
                    sure = False
                    break
        if not sure:
            return UNSURE
    mark = _keep(states, rows, live, saved, ev)
    e = 0
    has_values = out.shape[0] > 0
    for i in range(k):
        a, b = offsets[i], offsets[i + 1]
        st = row_at(states, rows, i)[0]
        status = begin_at(T, root, known, flat[a:b], page, out[a:b] if has_values else out,
                          count, capacity, reserves[i], evict_out[e:], st, ev)
        if status != DONE:
            info[0] = i
            _undo(T, tree_at(B, like), states, rows, saved, ev, mark)
            return status
        e += st[R_FREED]
    info[0] = k
    return DONE


@kernel_inner
def _keep(states, rows, live, saved, ev):
    """Before a run on an ``UNSURE`` batch (not ``live``): the request
    states to ``saved``; returns the event log's write position."""
    if not live:
        for i in range(saved.shape[0]):
            st = row_at(states, rows, i)[0]
            for j in range(REQUEST_SIZE):
                saved[i, j] = st[j]
    if ev is not None:
        return ev[0][0]
    return 0


@kernel_inner
def _put(a, b):
    for i in range(a.shape[0]):
        a[i] = b[i]


@kernel
def _undo(T, B, states, rows, saved, ev, mark):
    """Put back what an ``UNSURE`` batch changed before a request of it was
    refused: every array but the tokens and values (append-only: the
    restored high-water mark hides what was appended) from the copy ``B``
    taken before the run, the request states from ``saved``, and the event
    log's write position. A ``live`` batch never gets here."""
    _put(T[START], B[START])
    _put(T[LENGTH], B[LENGTH])
    _put(T[PARENT], B[PARENT])
    _put(T[NCHILD], B[NCHILD])
    _put(T[CXOR], B[CXOR])
    _put(T[TERM], B[TERM])
    _put(T[TABLE], B[TABLE])
    _put(T[LOCK], B[LOCK])
    _put(T[STAMP], B[STAMP])
    _put(T[HPOS], B[HPOS])
    _put(T[HEAP], B[HEAP])
    _put(T[HKEY], B[HKEY])
    _put(T[GEN], B[GEN])
    _put(T[OWN], B[OWN])
    _put(T[META], B[META])
    for i in range(saved.shape[0]):
        st = row_at(states, rows, i)[0]
        for j in range(REQUEST_SIZE):
            st[j] = saved[i, j]
    if ev is not None:
        ev[0][0] = mark


@kernel_inner
def _prefix_holds(T, q, st):
    """``(holds, top)``: True if ``q`` starts with the tokens of the
    request's locked path (what its insert checks: it passes through the
    request's node), and the lock count at that path's top (-1: no lock)."""
    if not st[R_LOCKED]:
        return True, -1
    tokens, start, length, parent = T[TOKENS], T[START], T[LENGTH], T[PARENT]
    w = st[R_NODE]
    end = st[R_CACHED]
    top = w
    while parent[w] >= 0:
        L = length[w]
        a = start[w]
        end -= L
        if end < 0:
            return False, -1
        for j in range(L):
            if tokens[a + j] != q[end + j]:
                return False, -1
        top = w
        w = parent[w]
    return end == 0, T[LOCK][top]


@kernel
def req_cache_batch(D, like, roots, nss, flat, offsets, ns_, vflat, voffsets, page, cap, count,
                    out, seg, res, evout, evres, priorities, states, rows, finishing, live, B,
                    saved, info, ev=None):
    """``req_checkpoint`` (``finishing`` False) or ``req_finish`` of request
    ``i`` with ``flat[offsets[i]:offsets[i+1]]``, its first ``ns_[i]`` tokens
    cached (values ``vflat`` at ``voffsets``, or empty) under the capacity
    ``cap`` less, with ``count`` (``count_inflight``), what the other
    requests hold in flight. ``roots[i] < 0``: namespace number ``nss[i]``
    has no root yet; the first insert into it makes it (and ``roots`` is
    updated for the others).

    Each request's slots go to its segment ``out[seg[i]:seg[i+1]]`` (laid
    out by ``free_layout``, ``seg`` filled here), then are packed: what a
    ``checkpoint`` returns (or a ``finish``'s ``free``) as
    ``out[res[i]:res[i+1]]``, a finish's evicted values as
    ``evout[evres[i]:evres[i+1]]``. ``out`` holds at least the values and,
    under a capacity, the tokens of the batch."""
    T = tree_at(D, like)
    meta = T[META]
    k = offsets.shape[0] - 1
    need = 0
    for i in range(k):
        need += ns_[i]
    if not has_room(T, need, 3 * k):
        return need_room(T, need, 3 * k)
    has_values = vflat.shape[0] > 0
    seg[0] = 0
    for i in range(k):
        st = row_at(states, rows, i)[0]
        nvals = voffsets[i + 1] - voffsets[i] if has_values else 0
        partial, end = free_layout(st, ns_[i], nvals, finishing)
        seg[i + 1] = seg[i] + (end + ns_[i] if has_values and cap >= 0 else end)
    if live:
        worst = 0  # the highest lock count at the top of a path the batch moves a lock to
        for i in range(k):  # each request on its own, as its insert would find it
            st = row_at(states, rows, i)[0]
            info[0] = i
            if _check_request(T, st) != DONE:
                return STALE
            q = flat[offsets[i]:offsets[i + 1]]
            holds, top = _prefix_holds(T, q, st)
            if ns_[i] < st[R_CACHED] or not holds:
                return MISMATCH
            if top < 0 and roots[i] >= 0:  # no lock yet: the path its first page takes
                top = _top_lock(T, roots[i], q, ns_[i], page, st)
            worst = max(worst, top)
        # no request evicts (so none is refused) when every insert fits
        # without evicting: in-flight tokens only shrink along the batch
        sure = cap < 0 or meta[M_TOKENS] + need <= cap - (meta[M_INFLIGHT] if count else 0)
        if not sure or worst + k >= LOCK_LIMIT:
            return UNSURE
    mark = _keep(states, rows, live, saved, ev)
    for i in range(k):
        st = row_at(states, rows, i)[0]
        q = flat[offsets[i]:offsets[i + 1]]
        n = ns_[i]
        vals = vflat[voffsets[i]:voffsets[i + 1]] if has_values else vflat
        c = cap
        if count and cap >= 0:
            c = max(0, cap - meta[M_INFLIGHT] + st[R_RESERVED])  # its own reservation becomes cached
        o = out[seg[i]:seg[i + 1]] if has_values else out
        root = roots[i]
        info[0] = i
        if root < 0:  # as _insert_one: refused before the root is made
            if c >= 0 and room_needed(T, n, 0, page, c) < 0:
                _undo(T, tree_at(B, like), states, rows, saved, ev, mark)
                return FULL
            root = make_root(T, True, nss[i])
            for j in range(i, k):
                if roots[j] < 0 and nss[j] == nss[i]:
                    roots[j] = root
        if finishing:
            status = finish_at(T, root, nss[i], q, n, vals, page, c, o, priorities[i], st, ev)
        else:
            status = checkpoint_at(T, root, nss[i], q, n, vals, page, c, o, priorities[i], st, ev)
        if status != DONE:
            _undo(T, tree_at(B, like), states, rows, saved, ev, mark)
            return status
    _pack(out, seg, res, evout, evres, states, rows, finishing, has_values)
    info[0] = k
    return DONE


@kernel_inner
def _pack(out, seg, res, evout, evres, states, rows, finishing, has_values):
    """Move each request's slots to the front of ``out`` (a checkpoint's:
    duplicates, then evicted; a finish's ``free``: duplicates, then the
    partial page) and a finish's evicted slots into ``evout``, in order
    (writes only move left, so in place is safe)."""
    k = seg.shape[0] - 1
    res[0] = 0
    evres[0] = 0
    for i in range(k):
        st = row_at(states, rows, i)[0]
        if not has_values:
            res[i + 1] = 0
            evres[i + 1] = 0
            continue
        partial = st[R_LAST_PARTIAL]
        end = st[R_LAST_N] - st[R_LAST_FROM] + partial
        start = end - partial - (st[R_LAST_CACHED] - st[R_LAST_FROM])
        freed = st[R_LAST_FREED]
        stop = end if finishing else end + freed
        w = res[i]
        for j in range(start, stop):
            out[w] = out[seg[i] + j]
            w += 1
        res[i + 1] = w
        e = evres[i]
        if finishing:
            for j in range(freed):
                evout[e + j] = out[seg[i] + end + j]
        evres[i + 1] = e + (freed if finishing else 0)



@kernel
def gather_rows(states, rows):
    """Copy the state rows at the addresses ``rows`` into ``states``."""
    for i in range(rows.shape[0]):
        st = row_at(states, rows, i)[0]
        for j in range(REQUEST_SIZE):
            states[i, j] = st[j]


@kernel
def begun_values(D, like, states, rows, out, off):
    """The values each request of a batch found cached at begin, request
    ``i``'s to ``out[off[i]:off[i+1]]``, read from its locked path (they
    cannot change while it is held). Returns ``DONE``, or ``-1 - i`` for the
    first request ``i`` that is closed or whose lock is gone (nothing read)."""
    T = tree_at(D, like)
    for i in range(off.shape[0] - 1):
        st = row_at(states, rows, i)[0]
        if _check_request(T, st) != DONE:
            return -1 - i
    for i in range(off.shape[0] - 1):
        st = row_at(states, rows, i)[0]
        # the path root..R_NODE holds R_CACHED tokens; the first ``total`` are wanted
        total = off[i + 1] - off[i]
        end = st[R_CACHED]
        v = st[R_NODE]
        while T[PARENT][v] >= 0 and end > 0:
            L = T[LENGTH][v]
            lo = end - L
            if lo < total:
                take = min(end, total) - lo
                copy_run(out, off[i] + lo, T[VALUES], T[START][v], take)
            end = lo
            v = T[PARENT][v]
    return DONE
