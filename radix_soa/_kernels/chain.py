"""Chained page hashes and the KV event log a prefix cache with
``events=True`` writes.

A page's hash depends on every token before it and on the namespace:
``h[i] = page_hash(h[i - 1], page i)`` with ``h[-1]`` the namespace's seed.
``page_hash`` runs one multiply and one xor-shift per token and the
splitmix64 finalizer per page (about 1 ns a token): fast enough to hash
every insert and every router query, and a 64-bit value (ints on the wire).
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
"""

import numpy as np

from .config import kernel
from .layout import LENGTH, PARENT, START, TOKENS
from .table import mix64

REC_STORED = 1
REC_REMOVED = 2
_MUL = np.uint64(0x9FB21C651E98DF25)


@kernel
def page_hash(h, tokens, s, page):
    """The hash of the page ``tokens[s:s+page]`` after a page of hash ``h``."""
    x = h ^ np.uint64(0x9E3779B97F4A7C15)
    for j in range(page):
        x = (x ^ np.uint64(np.int64(tokens[s + j]))) * _MUL
        x ^= x >> np.uint64(32)
    return mix64(x)


@kernel
def chain_hashes(q, qs, n, page, seed, out):
    """The hashes of the ``n // page`` whole pages of ``q[qs:qs+n]`` from
    ``seed`` into ``out`` (uint64)."""
    h = seed
    for i in range(n // page):
        h = page_hash(h, q, qs + i * page, page)
        out[i] = h


@kernel
def _seed_of(T, seeds, v):
    """``(seed, namespace number)`` of the root above node ``v``."""
    parent = T[PARENT]
    while parent[v] >= 0:
        v = parent[v]
    ns = T[START][v]
    if 0 <= ns < seeds.shape[0]:
        return seeds[ns], ns
    return np.uint64(0), ns


@kernel
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


@kernel
def _ancestor(parent, x, up):
    for _ in range(up):
        x = parent[x]
    return x


@kernel
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
