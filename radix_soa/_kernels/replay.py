"""A whole trace replayed against a prefix cache in one call.

Each request (in the order a scheduling policy picks) is matched, counted,
then inserted, with LRU eviction under the capacity and, optionally, a host
tier that receives what the device tier evicts. One descent per request: the
match splits the node it ends in, so the insert hangs the rest of the
request right there (the path stays locked while room is made). The loop is
resumable: when a tree needs room it returns ``ROOM`` (the need is in that
tree's meta), Python grows it and calls again, and the per-request phase
kept in ``state`` says where to go on.

Call graph (callers after their callees): lex_less -> dfs_order; lpm_pick;
host_store (insert_capped); request_of -> replay_run (pc_match, room_needed,
pc_lock, heap_top, pc_evict, extend)
"""

from .config import kernel, kernel_inner, kernel_nogil
from .descent import common, match_one
from .heap import heap_top
from .layout import (DONE, HEAP, HKEY, HPOS, LENGTH, META, M_CLOCK, M_TOKENS, PARENT, STAMP, START,
                     TABLE, TOKENS, VALUES)
from .mutation import extend
from .prefix import insert_capped, path_unlocked, pc_evict, pc_lock, pc_match, room_needed
from .table import has_room, need_room

POLICY_FCFS = 0
POLICY_LPM = 1
POLICY_DFS = 2
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
S_NODE = 9      # device node the request's match ended at
S_HIT = 10      # its device hit (tokens)
STATE_SIZE = 12
# params slots
P_PAGE = 0
P_CAPACITY = 1  # -1: unbounded
P_HOST_CAPACITY = 2  # -1: unbounded
P_HOST = 3      # 1 if there is a host tier
P_POLICY = 4
P_WINDOW = 5
P_MAX_LEN = 6   # longest request (room checks)
PARAMS_SIZE = 8


@kernel_inner
def lex_less(flat, offsets, ns, a, b):
    """Request ``a`` before ``b`` in (namespace, tokens) lexicographic order."""
    if ns[a] != ns[b]:
        return ns[a] < ns[b]
    sa = offsets[a]
    na = offsets[a + 1] - sa
    sb = offsets[b]
    nb = offsets[b + 1] - sb
    k = common(flat, sa, flat, sb, min(na, nb))
    if k < min(na, nb):
        return flat[sa + k] < flat[sb + k]
    return na < nb


@kernel
def dfs_order(flat, offsets, ns, window, order):
    """Arrival order cut into windows of ``window`` requests, each window
    sorted by (namespace, tokens): requests that share a prefix run back to
    back, in the depth-first order of a trie over the window (stable).
    Every other window runs in reverse, so a window starts where the one
    before ended, with the prefix used last, not the one LRU evicts first.
    ``flat``/``offsets``/``ns``/``order``: int64, ``order`` caller-allocated."""
    n = offsets.shape[0] - 1
    for i in range(n):
        order[i] = i
    for lo in range(0, n, window):
        hi = min(n, lo + window)
        for i in range(lo + 1, hi):  # insertion sort: windows are small
            x = order[i]
            j = i - 1
            while j >= lo and lex_less(flat, offsets, ns, x, order[j]):
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


@kernel_inner
def lpm_pick(Td, roots, flat, offsets, win, state, window, page):
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
        L = match_one(Td[TOKENS], Td[START], Td[LENGTH], Td[PARENT], Td[TABLE], roots[i], flat,
                      qs, qn - qn % page, page)
        if L > best_len or (L == best_len and i < best):
            best = i
            best_len = L
            best_slot = s
    win[best_slot] = -1
    return best


@kernel_inner
def host_store(Th, root, flat, qs, n, page, hcap):
    """Insert ``flat[qs:qs+n]`` into the host tier like ``PrefixCache.insert``
    (LRU eviction under ``hcap``, skipped when it cannot fit). The caller has
    made room for ``n`` tokens and 2 nodes. Returns the new tokens the host
    took in."""
    status, cached, node, freed = insert_capped(Th, root, flat, qs, n, flat, qs, page, hcap,
                                                Th[VALUES])
    return 0 if status != DONE else n - cached


@kernel_inner
def request_of(offsets, pos):
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


@kernel_nogil
def replay_run(Td, Th, roots_d, roots_h, flat, offsets, positions, order, win, params, state,
               hits, host_hits, rejected, evict_out):
    """Replay requests from ``state[S_STEP]`` on; see the module docstring.

    Arrays (all int64 unless noted, allocated by ``studies.replay``):
    ``roots_d``/``roots_h`` the root of each request's namespace per tier;
    ``flat``/``offsets`` the requests; ``positions[j] == j`` (device values:
    a token's value says which request first wrote it and where, so an
    evicted run names its whole path for the host tier; empty without a
    host); ``order`` the schedule (filled here for LPM); ``win`` the LPM
    window; ``params``/``state`` the slots above; ``hits``/``host_hits``
    per request; ``rejected`` bool per request; ``evict_out`` scratch for
    evicted values (``max_len`` long with a host tier). Returns ``DONE`` or
    ``ROOM`` (the need is in ``Td``'s or ``Th``'s meta).
    """
    page = params[P_PAGE]
    cap = params[P_CAPACITY]
    hcap = params[P_HOST_CAPACITY]
    has_host = params[P_HOST] == 1
    policy = params[P_POLICY]
    window = params[P_WINDOW]
    max_len = params[P_MAX_LEN]
    dmeta = Td[META]
    hmeta = Th[META]
    nreq = offsets.shape[0] - 1
    while state[S_STEP] < nreq:
        if state[S_PHASE] == 0:
            if not has_room(Td, max_len, 3):
                return need_room(Td, max_len, 3)
            if has_host and not has_room(Th, 0, 1):
                return need_room(Th, 0, 1)
            if policy == POLICY_LPM:
                i = lpm_pick(Td, roots_d, flat, offsets, win, state, window, page)
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
            state[S_NODE] = v
            state[S_HIT] = d
            state[S_PROTECT] = -1
            state[S_NEED] = 0
            state[S_PHASE] = 2
            if cap >= 0:
                need = room_needed(Td, qn - d, path_unlocked(Td, roots_d[i], v), page, cap)
                if need < 0:
                    rejected[i] = True
                    state[S_PHASE] = 0
                    state[S_STEP] += 1
                    continue
                if need > 0:
                    if v != roots_d[i]:
                        pc_lock(Td, v, 1)
                        state[S_PROTECT] = v
                    state[S_NEED] = need
                    state[S_PHASE] = 1
        i = state[S_REQ]
        if state[S_PHASE] == 1:
            values = Td[VALUES]
            start = Td[START]
            length = Td[LENGTH]
            while state[S_NEED] > 0:
                x = heap_top(Td[HEAP], Td[HPOS], Td[STAMP], Td[HKEY], Td[META])
                take = min(length[x], state[S_NEED])
                if has_host:
                    last = values[start[x] + length[x] - 1]
                    r = request_of(offsets, last)
                    plen = last + 1 - offsets[r]
                    if not has_room(Th, plen, 2):
                        return need_room(Th, plen, 2)
                    state[S_HOST_INSERTED] += host_store(Th, roots_h[r], flat, offsets[r], plen,
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
            d = state[S_HIT]
            dmeta[M_CLOCK] += 1
            extend(Td, roots_d[i], state[S_NODE], -1, 0, d, flat, qs, qn, positions, qs, page,
                   True, dmeta[M_CLOCK])
            state[S_INSERTED] += qn - d
            state[S_PEAK] = max(state[S_PEAK], dmeta[M_TOKENS])
            state[S_PHASE] = 0
            state[S_STEP] += 1
    return DONE
