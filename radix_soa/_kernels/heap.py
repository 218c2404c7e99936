"""The eviction heap: a binary min-heap of evictable leaves (unlocked,
childless, non-root) keyed by ``(hkey, id)``; ``hpos[v]`` is v's slot or -1.
``stamp`` is the eviction policy's key (see ``layout``): ``key_on_access``,
``key_on_insert`` and ``key_on_create`` compute it, ``rekey`` sets it.

``hkey[v]`` is the key the heap placed ``v`` by. A key that rises (every
access under lru, lfu, slru and priority) only updates ``stamp``: the entry
keeps its place until it reaches the top, where ``heap_top`` moves it down
by its current key. Since ``hkey <= stamp`` for every entry, the top whose
``hkey`` is its ``stamp`` is the least ``(stamp, id)`` of all, so leaves are
evicted in exactly the order an eagerly kept heap gives, while an access
costs one store instead of a sift down the heap (each rise costs at most
one sift, later, and only for a leaf that reaches the top). A key that falls
(mru) moves its entry up at once.

Arrays: ``heap`` and ``hpos`` int32 per node, ``stamp`` and ``hkey`` int64
per node, ``meta[M_HEAP_SIZE]`` the entries in use (all allocated by
storage).

Call graph (callers after their callees): heap_less -> sift_up/sift_down ->
heap_push, heap_remove, heap_top (a stale top moved down first), rekey ->
touch, touch_insert
"""

import numpy as np

from .config import kernel, kernel_helper, kernel_inner
from .layout import (CLOCK_BITS, M_HEAP_SIZE, M_POLICY, M_PRIORITY, MAX_HITS, P_FIFO, P_FILO,
                     P_LFU, P_LRU, P_MRU, P_PRIORITY, P_SLRU, PRIORITY_OFFSET, SLRU_PROTECTED)


@kernel_helper
def heap_less(hkey, a, b):
    return hkey[a] < hkey[b] or (hkey[a] == hkey[b] and a < b)


@kernel_helper
def heap_sift_up(heap, hpos, hkey, i):
    v = heap[i]
    while i > 0:
        p = (i - 1) >> 1
        u = heap[p]
        if not heap_less(hkey, v, u):
            break
        heap[i] = u
        hpos[u] = i
        i = p
    heap[i] = v
    hpos[v] = i


@kernel_helper
def heap_sift_down(heap, hpos, hkey, size, i):
    v = heap[i]
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and heap_less(hkey, heap[c + 1], heap[c]):
            c += 1
        u = heap[c]
        if not heap_less(hkey, u, v):
            break
        heap[i] = u
        hpos[u] = i
        i = c
    heap[i] = v
    hpos[v] = i


@kernel_helper
def heap_push(heap, hpos, stamp, hkey, meta, v):
    i = meta[M_HEAP_SIZE]
    meta[M_HEAP_SIZE] = i + 1
    heap[i] = v
    hpos[v] = i
    hkey[v] = stamp[v]
    heap_sift_up(heap, hpos, hkey, i)


@kernel_helper
def heap_remove(heap, hpos, hkey, meta, v):
    i = np.int64(hpos[v])  # int64 positions: one specialization of each sift
    hpos[v] = -1
    last = meta[M_HEAP_SIZE] - 1
    meta[M_HEAP_SIZE] = last
    if i == last:
        return
    u = heap[last]
    heap[i] = u
    hpos[u] = i
    heap_sift_up(heap, hpos, hkey, i)
    heap_sift_down(heap, hpos, hkey, last, np.int64(hpos[u]))


@kernel_inner
def heap_top(heap, hpos, stamp, hkey, meta):
    """The leaf to evict first (the heap must not be empty): the top, once
    every entry that rose to the top with a stale ``hkey`` has been moved
    down by its current key."""
    while True:
        x = heap[0]
        if hkey[x] == stamp[x]:
            return x
        hkey[x] = stamp[x]
        heap_sift_down(heap, hpos, hkey, meta[M_HEAP_SIZE], np.int64(0))


@kernel_inner
def key_on_access(meta, old, clock):
    """The key of a node a match (or an insert) passes at tick ``clock``."""
    p = meta[M_POLICY]
    if p == P_LRU:
        return clock
    if p == P_MRU:
        return -clock
    if p == P_FIFO or p == P_FILO:
        return old
    return ((old >> CLOCK_BITS) << CLOCK_BITS) | clock  # lfu, priority, slru: keep the high part


@kernel_inner
def key_on_insert(meta, old, clock):
    """The key of an existing node an insert reaches: lfu counts a hit
    (slru too, up to its protected segment: its key is then ``(protected,
    last access)``), priority keeps the highest priority; the rest as an
    access."""
    p = meta[M_POLICY]
    if p == P_LFU or p == P_SLRU:
        hits = old >> CLOCK_BITS
        if hits < (MAX_HITS if p == P_LFU else SLRU_PROTECTED):
            hits += 1
        return (hits << CLOCK_BITS) | clock
    if p == P_PRIORITY:
        prio = max(old >> CLOCK_BITS, meta[M_PRIORITY] + PRIORITY_OFFSET)
        return (prio << CLOCK_BITS) | clock
    return key_on_access(meta, old, clock)


@kernel_inner
def key_on_create(meta, clock):
    """The key of a node an insert creates at tick ``clock``."""
    p = meta[M_POLICY]
    if p == P_MRU or p == P_FILO:
        return -clock
    if p == P_LFU or p == P_SLRU:
        return (1 << CLOCK_BITS) | clock
    if p == P_PRIORITY:
        return ((meta[M_PRIORITY] + PRIORITY_OFFSET) << CLOCK_BITS) | clock
    return clock


@kernel_inner
def rekey(heap, hpos, stamp, hkey, v, key):
    """Give ``v`` the key ``key``: a heap entry whose key falls moves up now;
    one whose key rises stays put (``heap_top`` moves it when it matters)."""
    stamp[v] = key
    i = np.int64(hpos[v])
    if i >= 0 and key < hkey[v]:
        hkey[v] = key
        heap_sift_up(heap, hpos, hkey, i)


@kernel
def touch(heap, hpos, stamp, hkey, meta, v, clock):
    """``v`` is accessed at tick ``clock`` (a match or ``touch`` passes it)."""
    rekey(heap, hpos, stamp, hkey, v, key_on_access(meta, stamp[v], clock))


@kernel_inner
def touch_insert(heap, hpos, stamp, hkey, meta, v, clock):
    """An insert at tick ``clock`` reaches the existing node ``v``."""
    rekey(heap, hpos, stamp, hkey, v, key_on_insert(meta, stamp[v], clock))
