"""A trace replayed over N workers behind a router, in one call.

Every worker's cache is its own tree (its own eviction heap and capacity);
the kernel takes them all as ``W``: a 2-D int64 array with one directory row
per worker (``directory``), or, where the directory is unavailable, a tuple
of the workers' ``T`` tuples (``tree_at`` takes either row). ``R`` holds the
cache-aware router's approximate trees the same way (``W`` again for the
other routers, unused).

Per request, in arrival order: check that every tree it may touch has room
(else ``ROOM``, nothing changed), advance the clock to its arrival, retire
the prefills and requests finished by then, evict the router trees when an
eviction interval has passed, pick a worker, and replay the request on that
worker exactly as ``replay_run`` does under FCFS without a host tier (match,
make room, insert), then queue its service time on the worker's earliest
free slot. After the room checks nothing can stop a request, so the state
between calls is just the request cursor.

Call graph (callers after their callees): prefix_hashes; the event heap
(ev_push, ev_pop) -> retire; least_loaded, shortest_queue ->
cache_aware_pick, kv_overlap_pick; approx_insert, approx_evict, serve ->
cluster_run (tree_at per worker row)
"""

import numpy as np

from .config import kernel, kernel_inner, kernel_nogil
from .descent import match_one
from .directory import tree_at
from .layout import DONE, LENGTH, META, M_CLOCK, M_TOKENS, PARENT, START, TABLE, TOKENS
from .mutation import extend
from .prefix import path_unlocked, pc_evict, pc_lock, pc_match, room_needed
from .table import has_room, mix64, need_room

ROUND_ROBIN = 0
RANDOM = 1
LEAST_LOADED = 2
PREFIX_HASH = 3
CACHE_AWARE = 4
KV_OVERLAP = 5
# how a request was routed (``mode``)
MODE_FIXED = 0     # by a rule that does not look at the caches or, for least_loaded, the load
MODE_BALANCE = 1   # cache_aware: imbalanced, shortest queue
MODE_HIT = 2       # cache_aware: match rate above the threshold, the matching worker
MODE_MISS = 3      # cache_aware: below the threshold, the least loaded worker
MODE_COST = 4      # kv_overlap: the lowest cost
# int params
P_WORKERS = 0
P_ROUTER = 1
P_PAGE = 2
P_CAPACITY = 3      # -1: unbounded
P_MAX_LEN = 4
P_SLOTS = 5
P_LOAD = 6          # least_loaded: 0 outstanding requests, 1 outstanding tokens
P_ABS = 7           # cache_aware balance_abs_threshold
P_TREE_MAX = 8      # cache_aware max_tree_size (-1: unbounded)
P_BLOCK = 9         # tokens per trace id
PARAMS_SIZE = 10
# float params
F_REL = 0           # cache_aware balance_rel_threshold
F_CACHE = 1         # cache_aware cache_threshold
F_WEIGHT = 2        # kv_overlap overlap_score_weight
F_PREFILL = 3       # prefill tokens per second
F_DECODE = 4        # decode tokens per second per request
F_INTERVAL = 5      # cache_aware eviction_interval (seconds; < 0: never)
FPARAMS_SIZE = 6
# int state
S_STEP = 0          # requests done
S_EVENTS = 1        # entries in the event heap
STATE_SIZE = 2
# float state
FS_TIME = 0         # the clock (the latest arrival so far)
FS_NEXT_EVICT = 1   # when the router trees are next evicted
FSTATE_SIZE = 2
# per-worker int columns of ``wstate``
W_INSERTED = 0      # new ids its cache took in
W_PEAK = 1          # most ids its cache held
W_OUTSTANDING = 2   # requests routed to it and not finished
W_OUT_TOKENS = 3    # their input + output tokens
W_ACTIVE = 4        # their KV blocks (input + output tokens in pages)
W_QUEUED = 5        # uncached prompt tokens of its requests still in prefill
W_PROCESSED = 6     # requests routed to it so far
W_PEAK_OUTSTANDING = 7
W_SIZE = 8


@kernel
def prefix_hashes(flat, offsets, ns, k, out):
    """``out[i]``: a 64-bit hash (as int64) of request ``i``'s namespace and
    its first ``k`` ids (all of them when shorter): splitmix64 chained over
    the ids, seeded with the namespace."""
    n = offsets.shape[0] - 1
    for i in range(n):
        h = mix64(np.uint64(np.int64(ns[i])) + np.uint64(0x9E3779B97F4A7C15))
        s = offsets[i]
        e = min(offsets[i + 1], s + k)
        for j in range(s, e):
            h = mix64(h ^ np.uint64(np.int64(flat[j])))
        out[i] = np.int64(h)


@kernel_inner
def ev_less(ev_t, ev_v, a, b):
    return ev_t[a] < ev_t[b] or (ev_t[a] == ev_t[b] and ev_v[a] < ev_v[b])


@kernel_inner
def ev_swap(ev_t, ev_v, a, b):
    t = ev_t[a]
    ev_t[a] = ev_t[b]
    ev_t[b] = t
    v = ev_v[a]
    ev_v[a] = ev_v[b]
    ev_v[b] = v


@kernel_inner
def ev_push(ev_t, ev_v, state, t, v):
    """Push event ``(t, v)`` on the binary min-heap in ``ev_t``/``ev_v``."""
    i = state[S_EVENTS]
    state[S_EVENTS] = i + 1
    ev_t[i] = t
    ev_v[i] = v
    while i > 0:
        p = (i - 1) >> 1
        if not ev_less(ev_t, ev_v, i, p):
            break
        ev_swap(ev_t, ev_v, i, p)
        i = p


@kernel_inner
def ev_pop(ev_t, ev_v, state):
    """Remove the earliest event and return its payload."""
    v = ev_v[0]
    size = state[S_EVENTS] - 1
    state[S_EVENTS] = size
    ev_t[0] = ev_t[size]
    ev_v[0] = ev_v[size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and ev_less(ev_t, ev_v, c + 1, c):
            c += 1
        if not ev_less(ev_t, ev_v, c, i):
            break
        ev_swap(ev_t, ev_v, i, c)
        i = c
    return v


@kernel_inner
def kv_blocks(inputs, outputs, i, tokens_per_block):
    """KV blocks request ``i`` holds while it runs: its prompt and output
    tokens in whole pages."""
    return (inputs[i] + outputs[i] + tokens_per_block - 1) // tokens_per_block


@kernel_inner
def uncached_tokens(inputs, hits, i, block):
    return inputs[i] - min(hits[i] * block, inputs[i])


@kernel_inner
def retire(ev_t, ev_v, state, t, wstate, assign, hits, inputs, outputs, block, tokens_per_block):
    """Apply every event due by ``t``: a prefill's end leaves the worker's
    prefill queue, a request's end leaves its outstanding load."""
    while state[S_EVENTS] > 0 and ev_t[0] <= t:
        v = ev_pop(ev_t, ev_v, state)
        r = v >> 1
        w = assign[r]
        if v & 1 == 0:
            wstate[w, W_QUEUED] -= uncached_tokens(inputs, hits, r, block)
        else:
            wstate[w, W_OUTSTANDING] -= 1
            wstate[w, W_OUT_TOKENS] -= inputs[r] + outputs[r]
            wstate[w, W_ACTIVE] -= kv_blocks(inputs, outputs, r, tokens_per_block)


@kernel_inner
def least_loaded(wstate, nw, col):
    """The worker with the smallest ``wstate[:, col]`` (lowest id on ties)."""
    best = 0
    for w in range(1, nw):
        if wstate[w, col] < wstate[best, col]:
            best = w
    return best


@kernel
def shortest_queue(wstate, nw):
    """SGLang's min-load worker: the smallest (outstanding, processed, id)."""
    best = 0
    for w in range(1, nw):
        a = wstate[w, W_OUTSTANDING]
        b = wstate[best, W_OUTSTANDING]
        if a < b or (a == b and wstate[w, W_PROCESSED] < wstate[best, W_PROCESSED]):
            best = w
    return best


@kernel_inner
def cache_aware_pick(R, like, roots, i, flat, qs, qn, wstate, nw, abs_thr, rel_thr, cache_thr):
    """``(worker, mode)`` as the SGLang router picks: shortest queue when the
    outstanding counts are imbalanced (max - min > abs and max > rel x min),
    else the worker whose approximate tree matches the request longest
    (lowest id on ties) if the match covers more than ``cache_thr`` of it,
    else shortest queue."""
    lo = wstate[0, W_OUTSTANDING]
    hi = lo
    for w in range(1, nw):
        lo = min(lo, wstate[w, W_OUTSTANDING])
        hi = max(hi, wstate[w, W_OUTSTANDING])
    if hi - lo > abs_thr and hi > lo * rel_thr:
        return shortest_queue(wstate, nw), MODE_BALANCE
    best = 0
    best_len = -1
    for w in range(nw):
        T = tree_at(R[w], like)
        L = match_one(T[TOKENS], T[START], T[LENGTH], T[PARENT], T[TABLE], roots[i], flat, qs,
                      qn, 1)
        if L > best_len:
            best = w
            best_len = L
    rate = best_len / qn if qn > 0 else 0.0
    if rate > cache_thr:
        return best, MODE_HIT
    return shortest_queue(wstate, nw), MODE_MISS


@kernel_inner
def kv_overlap_pick(W, like, roots, i, flat, qs, qn, page, inputs, outputs, wstate, nw, block,
                    weight, start):
    """Dynamo's pick: per worker, ``overlap`` = the ids its cache holds of
    the request (whole pages), ``cost`` = ``weight`` x prefill blocks (its
    queued prefill tokens + the request's uncached tokens, in blocks) +
    decode blocks (its active blocks + the request's). Lowest cost wins;
    ties go to the first in the order ``start, start + 1, ...`` (mod N)."""
    tpb = block * page
    mine = kv_blocks(inputs, outputs, i, tpb)
    best = -1
    best_cost = 0.0
    for k in range(nw):
        w = (start + k) % nw
        T = tree_at(W[w], like)
        ov = match_one(T[TOKENS], T[START], T[LENGTH], T[PARENT], T[TABLE], roots[i], flat, qs,
                       qn, page)
        prefill = wstate[w, W_QUEUED] + inputs[i] - min(ov * block, inputs[i])
        cost = weight * (prefill / tpb) + (wstate[w, W_ACTIVE] + mine)
        if best < 0 or cost < best_cost:
            best = w
            best_cost = cost
    return best


@kernel_inner
def approx_insert(R, like, w, root, flat, qs, qn):
    """Record request ``flat[qs:qs+qn]`` in worker ``w``'s approximate tree
    (a match that refreshes its path, then an insert: two clock ticks, as
    ``PrefixCache.match`` then ``insert``)."""
    T = tree_at(R[w], like)
    meta = T[META]
    meta[M_CLOCK] += 1
    d, v = pc_match(T, root, flat, qs, qn, 1, meta[M_CLOCK])
    meta[M_CLOCK] += 1
    extend(T, root, v, -1, 0, d, flat, qs, qn, flat[:0], qs, 1, True, meta[M_CLOCK])


@kernel_inner
def approx_evict(R, like, nw, limit, out):
    """Trim every approximate tree to ``limit`` ids, least recently used
    leaf tails first (SGLang's ``evict_tenant_by_size``)."""
    for w in range(nw):
        T = tree_at(R[w], like)
        size = T[META][M_TOKENS]
        if size > limit:
            pc_evict(T, size - limit, 1, out)


@kernel
def serve(W, like, w, root, flat, qs, qn, page, cap, wstate, out):
    """Replay the request on worker ``w``'s cache as ``replay_run`` does
    (FCFS, no host tier). Returns ``(hit, rejected)``."""
    T = tree_at(W[w], like)
    meta = T[META]
    meta[M_CLOCK] += 1
    d, v = pc_match(T, root, flat, qs, qn, page, meta[M_CLOCK])
    if cap >= 0:
        need = room_needed(T, qn - d, path_unlocked(T, root, v), page, cap)
        if need < 0:
            return d, True
        if need > 0:
            if v != root:
                pc_lock(T, v, 1)
            pc_evict(T, need, page, out)
            if v != root:
                pc_lock(T, v, -1)
    meta[M_CLOCK] += 1
    extend(T, root, v, -1, 0, d, flat, qs, qn, flat[:0], qs, page, True, meta[M_CLOCK])
    wstate[w, W_INSERTED] += qn - d
    wstate[w, W_PEAK] = max(wstate[w, W_PEAK], meta[M_TOKENS])
    return d, False


@kernel_inner
def earliest_slot(slot_free, w, slots):
    best = 0
    for s in range(1, slots):
        if slot_free[w, s] < slot_free[w, best]:
            best = s
    return best


@kernel_nogil
def cluster_run(W, R, like, roots, flat, offsets, times, inputs, outputs, pre, params, fparams,
                state, fstate, wstate, wbusy, slot_free, ev_t, ev_v, assign, hits, rejected,
                mode, first_token, finish, out):
    """Replay requests from ``state[S_STEP]`` on; see the module docstring.

    Arrays (allocated by ``studies.cluster``): ``roots`` the root of each
    request's namespace (the same id in every tree); ``times`` float64
    arrival seconds; ``inputs``/``outputs`` tokens per request; ``pre`` a
    precomputed worker (random, prefix_hash) or tie-break start (kv_overlap)
    per request; ``params``/``fparams``/``state``/``fstate`` the slots
    above; ``wstate`` int64 (workers, ``W_SIZE``); ``wbusy`` float64 busy
    seconds per worker; ``slot_free`` float64 (workers, slots); ``ev_t``/
    ``ev_v`` the event heap (2 per request); per request ``assign``,
    ``hits``, ``rejected`` (bool), ``mode``, ``first_token``/``finish``
    (float64); ``out`` empty scratch. Returns ``DONE`` or ``ROOM``.
    """
    nw = params[P_WORKERS]
    router = params[P_ROUTER]
    page = params[P_PAGE]
    cap = params[P_CAPACITY]
    max_len = params[P_MAX_LEN]
    slots = params[P_SLOTS]
    block = params[P_BLOCK]
    tree_max = params[P_TREE_MAX]
    interval = fparams[F_INTERVAL]
    tpb = block * page
    n = offsets.shape[0] - 1
    while state[S_STEP] < n:
        i = state[S_STEP]
        for w in range(nw):
            T = tree_at(W[w], like)
            if not has_room(T, max_len, 3):
                return need_room(T, max_len, 3)
        if router == CACHE_AWARE:
            for w in range(nw):
                T = tree_at(R[w], like)
                if not has_room(T, max_len, 3):
                    return need_room(T, max_len, 3)
        t = max(fstate[FS_TIME], times[i])
        fstate[FS_TIME] = t
        retire(ev_t, ev_v, state, t, wstate, assign, hits, inputs, outputs, block, tpb)
        qs = offsets[i]
        qfull = offsets[i + 1] - qs
        qn = qfull - qfull % page
        m = MODE_FIXED
        if router == ROUND_ROBIN:
            w = i % nw
        elif router == LEAST_LOADED:
            w = least_loaded(wstate, nw, W_OUT_TOKENS if params[P_LOAD] == 1 else W_OUTSTANDING)
        elif router == CACHE_AWARE:
            if interval >= 0.0 and t >= fstate[FS_NEXT_EVICT]:
                if tree_max >= 0:
                    approx_evict(R, like, nw, tree_max, out)
                if interval == 0.0:
                    fstate[FS_NEXT_EVICT] = t
                else:
                    while fstate[FS_NEXT_EVICT] <= t:
                        fstate[FS_NEXT_EVICT] += interval
            w, m = cache_aware_pick(R, like, roots, i, flat, qs, qfull, wstate, nw,
                                    params[P_ABS], fparams[F_REL], fparams[F_CACHE])
            approx_insert(R, like, w, roots[i], flat, qs, qfull)
        elif router == KV_OVERLAP:
            w = kv_overlap_pick(W, like, roots, i, flat, qs, qn, page, inputs, outputs, wstate,
                                nw, block, fparams[F_WEIGHT], pre[i])
            m = MODE_COST
        else:
            w = pre[i]
        assign[i] = w
        mode[i] = m
        d, rej = serve(W, like, w, roots[i], flat, qs, qn, page, cap, wstate, out)
        hits[i] = d
        rejected[i] = rej
        # the service-time model: the earliest free slot, prefill then decode
        s = earliest_slot(slot_free, w, slots)
        begin = max(t, slot_free[w, s])
        unc = uncached_tokens(inputs, hits, i, block)
        ready = begin + unc / fparams[F_PREFILL]
        done = ready + outputs[i] / fparams[F_DECODE]
        slot_free[w, s] = done
        wbusy[w] += done - begin
        first_token[i] = ready
        finish[i] = done
        ev_push(ev_t, ev_v, state, ready, 2 * i)
        ev_push(ev_t, ev_v, state, done, 2 * i + 1)
        wstate[w, W_QUEUED] += unc
        wstate[w, W_OUTSTANDING] += 1
        wstate[w, W_OUT_TOKENS] += inputs[i] + outputs[i]
        wstate[w, W_ACTIVE] += kv_blocks(inputs, outputs, i, tpb)
        wstate[w, W_PROCESSED] += 1
        wstate[w, W_PEAK_OUTSTANDING] = max(wstate[w, W_PEAK_OUTSTANDING],
                                            wstate[w, W_OUTSTANDING])
        state[S_STEP] += 1
    return DONE
