"""Read-only walks down the tree: the token compare, the descent, ``exists``
and ``match`` for one query and for a CSR batch (serial and ``prange``).

Read-only kernels take the few arrays they read as arguments: ``tokens`` (the buffer), ``start`` int64,
``length`` int32, ``parent`` int32, ``term`` uint8 bitmap, ``table`` int64
(its entries carry their key's tag, so a probe passes over other keys'
entries reading the table alone; ``parent`` confirms a candidate).
Queries are int64 (``q`` one sequence; ``flat`` + int64 ``offsets`` a batch);
results go to caller-allocated ``out`` (bool or int64, one per sequence).
The single-query entries ``exists_at``, ``match1_at`` (``RadixCache``'s:
pages of one token) and ``match_at`` (any page) take the directory ``D``
instead (see ``directory``: one argument in place of six).

Call graph (callers after their callees): common -> descend -> exists_one,
match_one -> exists_at, match1_at, match_at; settle, refill -> descend_lanes (GROUP queries interleaved,
prefetched) -> exists_batch(_parallel), match_batch(_parallel);
descend_group (a group's descents, for radix_insert_batch)
"""

import numpy as np
from numba import prange

from .config import kernel, kernel_inner, kernel_inner_alloc, kernel_parallel, kernel_scratch
from .directory import tree_at
from .layout import EMPTY, ENTRY_NODE_MASK, LENGTH, NO_NODE, PARENT, START, TABLE, TERM, TOKENS
from .prefetch import prefetch
from .table import (child_tagged, find_child, home_slot, key_hash, probe_on, tag_of, tag_scan,
                    term_get)


@kernel
def common(tokens, s, q, qpos, n):
    """Length of the common prefix of ``tokens[s:s+n]`` and ``q[qpos:qpos+n]``."""
    # Indices are cast to unsigned after the addition: a signed index makes
    # Numba emit wraparound code (the loads become gathers), and adding an
    # int64 to a uint64 would make a float. Blocks of 64 without an early exit
    # vectorize (faster than np.array_equal on cached data); so does one pass
    # over the last partial block, which settles the usual case (a short span
    # that matches in full) without a compare per token. Only the block
    # holding the mismatch goes token by token.
    k = 0
    while k + 64 <= n:
        diff = 0
        for j in range(64):
            diff |= np.int64(tokens[np.uintp(s + k + j)]) ^ np.int64(q[np.uintp(qpos + k + j)])
        if diff != 0:
            break
        k += 64
    if k + 64 > n:
        diff = 0
        for j in range(n - k):
            diff |= np.int64(tokens[np.uintp(s + k + j)]) ^ np.int64(q[np.uintp(qpos + k + j)])
        if diff == 0:
            return n
    while k < n and tokens[np.uintp(s + k)] == q[np.uintp(qpos + k)]:
        k += 1
    return k


@kernel_inner
def span_match(tokens, start, length, c, q, at, rest, page):
    """``(L, k)``: child ``c``'s span length and the tokens of it that
    ``q[at:at+rest]`` matches, in whole pages (its first page is known to
    match)."""
    L = np.int64(length[c])
    k = page + common(tokens, start[c] + page, q, at + page, min(L, rest) - page)
    if page > 1:
        k -= k % page
    return L, k


@kernel
def descend(tokens, start, length, parent, table, root, q, qs, qn, page):
    """Walk from ``root`` along ``q[qs:qs+qn]``.

    Returns ``(v, c, k, pos)``: ``v`` is the deepest node matched in full and
    ``pos`` the query tokens through it; when the match goes on part-way into
    a child, ``c`` is that child and ``k`` (a multiple of ``page``, >= page)
    the tokens matched inside it; otherwise ``c == -1`` and ``k == 0``.
    """
    v = root
    pos = 0
    while qn - pos >= page:
        c = find_child(table, tokens, start, parent, v, q, qs + pos, page)
        if c == NO_NODE:
            return v, NO_NODE, 0, pos
        L, k = span_match(tokens, start, length, c, q, qs + pos, qn - pos, page)
        if k == L:
            v = c
            pos += L
        else:
            return v, c, k, pos
    return v, NO_NODE, 0, pos


@kernel_inner
def exists_one(tokens, start, length, parent, term, table, root, q, qs, qn):
    """True if ``q[qs:qs+qn]`` ends exactly at a terminal node."""
    if qn == 0:
        return False
    v, c, k, pos = descend(tokens, start, length, parent, table, root, q, qs, qn, 1)
    return c == NO_NODE and pos == qn and term_get(term, v) == 1


@kernel_inner
def match_one(tokens, start, length, parent, table, root, q, qs, qn, page):
    """Tokens of ``q[qs:qs+qn]`` present as a path (whole pages)."""
    v, c, k, pos = descend(tokens, start, length, parent, table, root, q, qs, qn, page)
    return pos + k


@kernel
def exists_at(D, like, root, q):
    """``exists_one`` of all of ``q`` on the tree at directory ``D``."""
    T = tree_at(D, like)
    return exists_one(T[TOKENS], T[START], T[LENGTH], T[PARENT], T[TERM], T[TABLE], root, q, 0,
                      q.shape[0])


@kernel
def match1_at(D, like, root, q):
    """``match_at`` with pages of one token (``RadixCache``): the page a
    literal 1, as in ``exists_at`` and the insert, so a first use compiles
    one descent for the three, and a call passes one argument less."""
    T = tree_at(D, like)
    return match_one(T[TOKENS], T[START], T[LENGTH], T[PARENT], T[TABLE], root, q, 0,
                     q.shape[0], 1)


@kernel
def match_at(D, like, root, q, page):
    """``match_one`` of all of ``q`` on the tree at directory ``D``."""
    T = tree_at(D, like)
    return match_one(T[TOKENS], T[START], T[LENGTH], T[PARENT], T[TABLE], root, q, 0,
                     q.shape[0], page)


# Read-only batch loops walk GROUP queries at a time (``descend_lanes``): each
# round computes every walking query's next table slot and prefetches it,
# then scans each slot's probe run for the key's tag (the table alone) and
# prefetches the candidate's span and parent, then its first tokens, and
# only then compares, so the cache misses of a group's queries overlap
# instead of following one another (on a tree past the last-level cache a
# lone descent is a chain of dependent misses). The
# answers are those of exists_one/match_one query by query. The serial
# flavour releases the GIL (batch reads from several Python threads run at
# once); the ``parallel=True`` (prange) one, over chunks of CHUNK queries,
# keeps it (Numba's default workqueue threading layer must not be entered
# from two threads at once).

GROUP = 16
CHUNK = 4096


@kernel_inner
def fetch_slot(table, v, q, at, page):
    """Round 1 of a lane's step: ``(slot, tag)`` of ``v``'s child keyed by
    ``q[at:at+page]``, the home slot prefetched."""
    h = key_hash(v, q, at, page)
    i = home_slot(table, h)
    prefetch(table, i)
    return i, tag_of(h)


@kernel_inner
def fetch_entry(table, start, length, parent, slot, tag):
    """Round 2: ``(slot, entry)`` of the first entry from ``slot`` on
    carrying ``tag`` (or of the empty slot ending the run: the table alone
    answers a miss), and that candidate's span and parent prefetched."""
    i = tag_scan(table, slot, table[slot], tag)
    e = table[i]
    if e != EMPTY:
        c = e & ENTRY_NODE_MASK
        prefetch(start, c)
        prefetch(length, c)
        prefetch(parent, c)
    return i, e


@kernel_inner
def fetch_span(tokens, start, length, c, rest):
    """Round 3: the tokens of ``c``'s span compared first (up to 64, a
    cache line per 8)."""
    s = start[c]
    e = s + min(np.int64(length[c]), rest, 64)
    j = s
    while j < e:
        prefetch(tokens, j)
        j += 8


@kernel_inner
def settle(exists, term, out_b, out_i, i, qn, v, c, k, pos):
    """Write query ``i``'s answer from its descent ``(v, c, k, pos)``."""
    if exists:
        out_b[i] = qn > 0 and c == NO_NODE and pos == qn and term_get(term, v) == 1
    else:
        out_i[i] = pos + k


@kernel_inner
def refill(lane, qs, qn, v, pos, g, offsets, flat, nxt, hi, root, page, exists, term, out_b,
           out_i):
    """Give lane ``g`` the next query from ``nxt`` (queries shorter than a
    page are answered at once); returns the new ``nxt``. No query left:
    ``lane[g] = -1``."""
    while nxt < hi:
        i = nxt
        nxt += 1
        a = offsets[i]
        n = offsets[i + 1] - a
        if n < page:
            settle(exists, term, out_b, out_i, i, n, root, NO_NODE, 0, 0)
            continue
        prefetch(flat, a)
        lane[g] = i
        qs[g] = a
        qn[g] = n
        v[g] = root
        pos[g] = 0
        return nxt
    lane[g] = -1
    return nxt


@kernel_inner_alloc
def descend_lanes(tokens, start, length, parent, term, table, root, flat, offsets, lo, hi, page,
                  exists, out_b, out_i):
    """Answer queries ``lo..hi`` of a CSR batch: ``exists`` (into ``out_b``)
    or ``match`` with ``page`` (into ``out_i``), GROUP queries interleaved."""
    lane = np.empty(GROUP, np.int64)
    qs = np.empty(GROUP, np.int64)
    qn = np.empty(GROUP, np.int64)
    v = np.empty(GROUP, np.int64)
    pos = np.empty(GROUP, np.int64)
    slot = np.empty(GROUP, np.int64)
    entry = np.empty(GROUP, np.int64)
    tag = np.empty(GROUP, np.int64)
    nxt = lo
    live = 0
    for g in range(GROUP):
        nxt = refill(lane, qs, qn, v, pos, g, offsets, flat, nxt, hi, root, page, exists, term,
                     out_b, out_i)
        if lane[g] >= 0:
            live += 1
    while live > 0:
        for g in range(GROUP):
            if lane[g] >= 0:
                slot[g], tag[g] = fetch_slot(table, v[g], flat, qs[g] + pos[g], page)
        for g in range(GROUP):
            if lane[g] >= 0:
                slot[g], entry[g] = fetch_entry(table, start, length, parent, slot[g], tag[g])
        for g in range(GROUP):
            c = child_tagged(entry[g], tag[g])
            if lane[g] >= 0 and c != NO_NODE:
                rest = qn[g] - pos[g]
                fetch_span(tokens, start, length, c, rest)
                if exists and length[c] == rest:
                    prefetch(term, c >> 3)
        for g in range(GROUP):
            if lane[g] < 0:
                continue
            p = v[g]
            at = qs[g] + pos[g]
            c = probe_on(table, tokens, start, parent, slot[g], entry[g], p, tag[g], flat, at,
                         page)
            done = True
            if c == NO_NODE:
                settle(exists, term, out_b, out_i, lane[g], qn[g], p, NO_NODE, 0, pos[g])
            else:
                L, k = span_match(tokens, start, length, c, flat, at, qn[g] - pos[g], page)
                if k == L:
                    v[g] = c
                    pos[g] += L
                    if qn[g] - pos[g] >= page:
                        done = False
                    else:
                        settle(exists, term, out_b, out_i, lane[g], qn[g], c, NO_NODE, 0, pos[g])
                else:
                    settle(exists, term, out_b, out_i, lane[g], qn[g], p, c, k, pos[g])
            if done:
                nxt = refill(lane, qs, qn, v, pos, g, offsets, flat, nxt, hi, root, page, exists,
                             term, out_b, out_i)
                if lane[g] < 0:
                    live -= 1


@kernel_inner
def descend_group(tokens, start, length, parent, table, root, flat, offsets, lo, m, page, rv,
                  rc, rk, rpos, walk, slot, entry, tag):
    """``descend`` of queries ``lo .. lo+m-1`` of a CSR batch (``m <= GROUP``),
    interleaved as in ``descend_lanes``: query ``lo+g``'s ``(v, c, k, pos)``
    goes to ``rv[g], rc[g], rk[g], rpos[g]``. ``walk``, ``slot``, ``entry``, ``tag``:
    scratch of ``GROUP`` (int64). For a batch insert, which reads its
    group's descents first and then changes the tree item by item."""
    live = 0
    for g in range(m):
        a = offsets[lo + g]
        prefetch(flat, a)
        rv[g] = root
        rc[g] = NO_NODE
        rk[g] = 0
        rpos[g] = 0
        walk[g] = 1 if offsets[lo + g + 1] - a >= page else 0
        live += walk[g]
    while live > 0:
        for g in range(m):
            if walk[g]:
                slot[g], tag[g] = fetch_slot(table, rv[g], flat, offsets[lo + g] + rpos[g], page)
        for g in range(m):
            if walk[g]:
                slot[g], entry[g] = fetch_entry(table, start, length, parent, slot[g], tag[g])
        for g in range(m):
            c = child_tagged(entry[g], tag[g])
            if walk[g] and c != NO_NODE:
                fetch_span(tokens, start, length, c,
                           offsets[lo + g + 1] - offsets[lo + g] - rpos[g])
        for g in range(m):
            if not walk[g]:
                continue
            p = rv[g]
            qs = offsets[lo + g]
            qn = offsets[lo + g + 1] - qs
            at = qs + rpos[g]
            c = probe_on(table, tokens, start, parent, slot[g], entry[g], p, tag[g], flat, at,
                         page)
            if c == NO_NODE:
                walk[g] = 0
            else:
                L, k = span_match(tokens, start, length, c, flat, at, qn - rpos[g], page)
                if k == L:
                    rv[g] = c
                    rpos[g] += L
                    if qn - rpos[g] < page:
                        walk[g] = 0
                else:
                    rc[g] = c
                    rk[g] = k
                    walk[g] = 0
            if walk[g] == 0:
                live -= 1


@kernel_scratch
def exists_batch(tokens, start, length, parent, term, table, root, flat, offsets, out):
    """``out[i] = exists_one(sequence i)`` for a CSR batch (``flat`` int64,
    ``offsets`` int64 of n + 1; ``out`` bool of n, caller-allocated)."""
    descend_lanes(tokens, start, length, parent, term, table, root, flat, offsets, 0,
                  offsets.shape[0] - 1, 1, True, out, np.empty(0, np.int64))


@kernel_parallel
def exists_batch_parallel(tokens, start, length, parent, term, table, root, flat, offsets, out):
    """``exists_batch`` on Numba's threads."""
    n = offsets.shape[0] - 1
    for t in prange((n + CHUNK - 1) // CHUNK):
        descend_lanes(tokens, start, length, parent, term, table, root, flat, offsets,
                      t * CHUNK, min(n, (t + 1) * CHUNK), 1, True, out, np.empty(0, np.int64))


@kernel_scratch
def match_batch(tokens, start, length, parent, table, root, flat, offsets, page, out):
    """``out[i] = match_one(sequence i)`` for a CSR batch (``out`` int64 of n,
    caller-allocated)."""
    descend_lanes(tokens, start, length, parent, np.empty(0, np.uint8), table, root, flat,
                  offsets, 0, offsets.shape[0] - 1, page, False, np.empty(0, np.bool_), out)


@kernel_parallel
def match_batch_parallel(tokens, start, length, parent, table, root, flat, offsets, page, out):
    """``match_batch`` on Numba's threads."""
    n = offsets.shape[0] - 1
    for t in prange((n + CHUNK - 1) // CHUNK):
        descend_lanes(tokens, start, length, parent, np.empty(0, np.uint8), table, root, flat,
                      offsets, t * CHUNK, min(n, (t + 1) * CHUNK), page, False,
                      np.empty(0, np.bool_), out)
