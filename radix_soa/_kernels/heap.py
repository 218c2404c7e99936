"""The eviction heap: a binary min-heap of evictable leaves (unlocked,
childless, non-root) keyed by ``(stamp, id)``; ``hpos[v]`` is v's slot or -1.
``stamp`` is the eviction policy's key (see ``layout``): ``key_on_access``,
``key_on_insert`` and ``key_on_create`` compute it, ``rekey`` moves a node.

Arrays: ``heap`` and ``hpos`` int32 per node, ``stamp`` int64 per node,
``meta[M_HEAP_SIZE]`` the entries in use (all allocated by storage)."""

from .config import kernel
from .layout import (CLOCK_BITS, M_HEAP_SIZE, M_POLICY, M_PRIORITY, MAX_HITS, P_FIFO, P_FILO,
                     P_LFU, P_LRU, P_MRU, P_PRIORITY, P_SLRU, PRIORITY_OFFSET, SLRU_PROTECTED)


@kernel
def heap_less(stamp, a, b):
    return stamp[a] < stamp[b] or (stamp[a] == stamp[b] and a < b)


@kernel
def heap_sift_up(heap, hpos, stamp, i):
    v = heap[i]
    while i > 0:
        p = (i - 1) >> 1
        u = heap[p]
        if not heap_less(stamp, v, u):
            break
        heap[i] = u
        hpos[u] = i
        i = p
    heap[i] = v
    hpos[v] = i


@kernel
def heap_sift_down(heap, hpos, stamp, size, i):
    v = heap[i]
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and heap_less(stamp, heap[c + 1], heap[c]):
            c += 1
        u = heap[c]
        if not heap_less(stamp, u, v):
            break
        heap[i] = u
        hpos[u] = i
        i = c
    heap[i] = v
    hpos[v] = i


@kernel
def heap_push(heap, hpos, stamp, meta, v):
    i = meta[M_HEAP_SIZE]
    meta[M_HEAP_SIZE] = i + 1
    heap[i] = v
    hpos[v] = i
    heap_sift_up(heap, hpos, stamp, i)


@kernel
def heap_remove(heap, hpos, stamp, meta, v):
    i = hpos[v]
    hpos[v] = -1
    last = meta[M_HEAP_SIZE] - 1
    meta[M_HEAP_SIZE] = last
    if i == last:
        return
    u = heap[last]
    heap[i] = u
    hpos[u] = i
    heap_sift_up(heap, hpos, stamp, i)
    heap_sift_down(heap, hpos, stamp, last, hpos[u])


@kernel
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


@kernel
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


@kernel
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


@kernel
def rekey(heap, hpos, stamp, meta, v, key):
    """Give ``v`` the key ``key``, moving it in the heap either way."""
    stamp[v] = key
    i = hpos[v]
    if i >= 0:
        heap_sift_up(heap, hpos, stamp, i)
        heap_sift_down(heap, hpos, stamp, meta[M_HEAP_SIZE], hpos[v])


@kernel
def touch(heap, hpos, stamp, meta, v, clock):
    """``v`` is accessed at tick ``clock`` (a match or ``touch`` passes it)."""
    rekey(heap, hpos, stamp, meta, v, key_on_access(meta, stamp[v], clock))


@kernel
def touch_insert(heap, hpos, stamp, meta, v, clock):
    """An insert at tick ``clock`` reaches the existing node ``v``."""
    rekey(heap, hpos, stamp, meta, v, key_on_insert(meta, stamp[v], clock))
