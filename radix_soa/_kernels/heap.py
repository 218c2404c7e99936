"""The LRU heap: a binary min-heap of evictable leaves (unlocked, childless,
non-root) keyed by ``(stamp, id)``; ``hpos[v]`` is v's slot or -1.

Arrays: ``heap`` and ``hpos`` int32 per node, ``stamp`` int64 per node,
``meta[M_HEAP_SIZE]`` the entries in use (all allocated by storage)."""

from .config import kernel
from .layout import M_HEAP_SIZE


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
def touch(heap, hpos, stamp, meta, v, clock):
    """Refresh ``v``'s access time (a later time: it can only sink)."""
    stamp[v] = clock
    if hpos[v] >= 0:
        heap_sift_down(heap, hpos, stamp, meta[M_HEAP_SIZE], hpos[v])
