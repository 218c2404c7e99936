"""Chained page hashes and the KV event log a prefix cache with
``events=True`` writes.

A page's hash depends on every token before it and on the namespace:
``h[i] = page_hash(h[i - 1], page i)`` with ``h[-1]`` the namespace's seed.
``page_hash`` runs a multiply and a rotation per token in four
independent lanes, and chains pages with the splitmix64 finalizer (about
0.5 ns a token at 16 tokens a page): fast enough to hash every insert and
every router query, and a 64-bit value (ints on the wire).
Not cryptographic: anyone who can choose the tokens can make two pages
collide, which would make a router over-count overlap.

The log (``ev[0]``, int64, caller-allocated with room for everything the
call can write; ``log[0]`` is the next free slot, 1 when empty) holds
records, hashes as their int64 bit patterns:

* ``STORED, ns, k, has_parent, parent, h_1..h_k, t_1..t_{k*page}``: a new
  run of ``k`` whole pages under namespace number ``ns`` (its tokens copied,
  so the record outlives the caller's array);
* ``REMOVED, ns, k, h_1..h_k``: a run of ``k`` pages evicted or dropped.

``ev`` is the tuple ``(log, scratch, seeds)``: ``scratch`` int32 for the
path of a node being removed (a walk up the parents, hashed top down; a path
longer than ``scratch`` falls back to walks from the node), ``seeds`` uint64
per namespace number. Kernels take ``ev=None`` when events are off and never
look at it then.

Call graph (callers after their callees): page_content -> page_hash ->
chain_hashes, log_stored, log_removed (the KV event log)
"""

import numpy as np

from .config import kernel, kernel_inner
from .layout import LENGTH, PARENT, START, TOKENS
from .table import mix64

REC_STORED = 1
REC_REMOVED = 2
# the lanes' multipliers and seeds (odd 64-bit constants of xxHash and splitmix64)
_M = (np.uint64(0x9FB21C651E98DF25), np.uint64(0xC2B2AE3D27D4EB4F),
      np.uint64(0x165667B19E3779F9), np.uint64(0xD6E8FEB86659FD93))
_C = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0x85EBCA77C2B2AE63),
      np.uint64(0x27D4EB2F165667C5), np.uint64(0x94D049BB133111EB))


@kernel_inner
def _rotl(x, r):
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@kernel_inner
def _step(x, t, m):
    return _rotl((x ^ np.uint64(np.int64(t))) * m, 31)


@kernel_inner
def page_content(tokens, s, page):
    """The hash of the tokens of one page alone: token j goes to lane
    ``j % 4`` (``x = rotl((x ^ t) * m, 31)``; four independent lanes, so the
    CPU runs them side by side; tokens past the last multiple of 4 go to
    lane 0), the lanes rotated apart and xored."""
    a, b, c, d = _C[0], _C[1], _C[2], _C[3]
    j = 0
    while j + 4 <= page:
        p = np.uintp(s + j)
        a = _step(a, tokens[p], _M[0])
        b = _step(b, tokens[p + np.uintp(1)], _M[1])
        c = _step(c, tokens[p + np.uintp(2)], _M[2])
        d = _step(d, tokens[p + np.uintp(3)], _M[3])
        j += 4
    while j < page:
        a = _step(a, tokens[np.uintp(s + j)], _M[0])
        j += 1
    return a ^ _rotl(b, 16) ^ _rotl(c, 32) ^ _rotl(d, 48)


@kernel
def page_hash(h, tokens, s, page):
    """The chained hash of the page ``tokens[s:s+page]`` after a page of
    hash ``h``: splitmix64's finalizer of ``h ^ page_content``. Only the
    finalizer waits for the page before (the content of the next pages is
    hashed meanwhile), so a chain costs about a finalizer per page."""
    return mix64(h ^ page_content(tokens, s, page))


@kernel_inner
def chain_hashes(q, qs, n, page, seed, out):
    """The hashes of the ``n // page`` whole pages of ``q[qs:qs+n]`` from
    ``seed`` into ``out`` (uint64)."""
    h = seed
    for i in range(n // page):
        h = page_hash(h, q, qs + i * page, page)
        out[i] = h


@kernel_inner
def _seed_of(T, seeds, v):
    """``(seed, namespace number)`` of the root above node ``v``."""
    parent = T[PARENT]
    while parent[v] >= 0:
        v = parent[v]
    ns = T[START][v]
    if 0 <= ns < seeds.shape[0]:
        return seeds[ns], ns
    return np.uint64(0), ns


@kernel_inner
def log_stored(T, ev, root, q, qs, cached, n, page):
    """Record that ``q[qs+cached:qs+n]`` (whole pages) was just inserted
    under ``root``; nothing when it is empty."""
    if n <= cached:
        return
    log, seeds = ev[0], ev[2]
    seed, ns = _seed_of(T, seeds, root)
    k = (n - cached) // page
    w = log[0]
    log[w] = REC_STORED
    log[w + 1] = ns
    log[w + 2] = k
    log[w + 3] = 1 if cached > 0 else 0
    h = seed
    for i in range(cached // page):
        h = page_hash(h, q, qs + i * page, page)
    log[w + 4] = np.int64(h)
    w += 5
    for i in range(k):
        h = page_hash(h, q, qs + cached + i * page, page)
        log[w + i] = np.int64(h)
    w += k
    for j in range(n - cached):
        log[w + j] = q[qs + cached + j]
    log[0] = w + n - cached


@kernel_inner
def _ancestor(parent, x, up):
    for _ in range(up):
        x = parent[x]
    return x


@kernel_inner
def log_removed(T, ev, x, rest, take, page):
    """Record that the last ``take`` tokens of node ``x`` (after its first
    ``rest``) are about to go; the path root..x must still be intact."""
    log, scratch, seeds = ev[0], ev[1], ev[2]
    tokens, start, length, parent = T[TOKENS], T[START], T[LENGTH], T[PARENT]
    depth = 0
    w = x
    while parent[w] >= 0:
        if depth < scratch.shape[0]:
            scratch[depth] = w
        depth += 1
        w = parent[w]
    ns = T[START][w]
    h = seeds[ns] if 0 <= ns < seeds.shape[0] else np.uint64(0)
    for i in range(depth - 1, 0, -1):  # the ancestors, top down
        v = scratch[i] if depth <= scratch.shape[0] else _ancestor(parent, x, i)
        s = start[v]
        for p in range(length[v] // page):
            h = page_hash(h, tokens, s + p * page, page)
    s = start[x]
    for p in range(rest // page):
        h = page_hash(h, tokens, s + p * page, page)
    k = take // page
    o = log[0]
    log[o] = REC_REMOVED
    log[o + 1] = ns
    log[o + 2] = k
    for p in range(k):
        h = page_hash(h, tokens, s + rest + p * page, page)
        log[o + 3 + p] = np.int64(h)
    log[0] = o + 3 + k
