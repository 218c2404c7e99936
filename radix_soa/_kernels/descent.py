"""Read-only walks down the tree: the token compare, the descent, ``exists``
and ``match`` for one query and for a CSR batch (serial and ``prange``).

Read-only kernels take the few arrays they read as arguments: ``tokens`` (the buffer), ``start`` int64,
``length`` int32, ``parent`` int32, ``term`` uint8 bitmap, ``table`` int32.
Queries are int64 (``q`` one sequence; ``flat`` + int64 ``offsets`` a batch);
results go to caller-allocated ``out`` (bool or int64, one per sequence).
The single-query entries ``exists_at``/``match_at`` take the directory ``D``
instead (see ``directory``: one argument in place of six).
"""

import numpy as np
from numba import prange

from .config import kernel, kernel_nogil, kernel_parallel
from .directory import tree_at
from .layout import LENGTH, NO_NODE, PARENT, START, TABLE, TERM, TOKENS
from .table import find_child, term_get


@kernel
def common(tokens, s, q, qpos, n):
    """Length of the common prefix of ``tokens[s:s+n]`` and ``q[qpos:qpos+n]``."""
    # Indices are cast to unsigned after the addition: a signed index makes
    # Numba emit wraparound code (the loads become gathers), and adding an
    # int64 to a uint64 would make a float. Blocks of 64 without an early exit
    # vectorize (faster than np.array_equal on cached data); the remainder and
    # the block holding the mismatch go token by token.
    k = 0
    while k + 64 <= n:
        diff = 0
        for j in range(64):
            diff |= np.int64(tokens[np.uintp(s + k + j)]) ^ np.int64(q[np.uintp(qpos + k + j)])
        if diff != 0:
            break
        k += 64
    while k < n and tokens[np.uintp(s + k)] == q[np.uintp(qpos + k)]:
        k += 1
    return k


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
        L = length[c]
        n = min(L, qn - pos)
        k = page + common(tokens, start[c] + page, q, qs + pos + page, n - page)
        if page > 1:
            k -= k % page
        if k == L:
            v = c
            pos += L
        else:
            return v, c, k, pos
    return v, NO_NODE, 0, pos


@kernel
def exists_one(tokens, start, length, parent, term, table, root, q, qs, qn):
    """True if ``q[qs:qs+qn]`` ends exactly at a terminal node."""
    if qn == 0:
        return False
    v, c, k, pos = descend(tokens, start, length, parent, table, root, q, qs, qn, 1)
    return c == NO_NODE and pos == qn and term_get(term, v) == 1


@kernel
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
def match_at(D, like, root, q, page):
    """``match_one`` of all of ``q`` on the tree at directory ``D``."""
    T = tree_at(D, like)
    return match_one(T[TOKENS], T[START], T[LENGTH], T[PARENT], T[TABLE], root, q, 0,
                     q.shape[0], page)


# Read-only batch loops come in a serial flavour that releases the GIL (batch
# reads from several Python threads run at once) and a ``parallel=True``
# (prange) one that keeps it (Numba's default workqueue threading layer must
# not be entered from two threads at once); twin loops, since Numba compiles
# threading per function.

@kernel_nogil
def exists_batch(tokens, start, length, parent, term, table, root, flat, offsets, out):
    """``out[i] = exists_one(sequence i)`` for a CSR batch (``flat`` int64,
    ``offsets`` int64 of n + 1; ``out`` bool of n, caller-allocated)."""
    for i in range(offsets.shape[0] - 1):
        out[i] = exists_one(tokens, start, length, parent, term, table, root,
                            flat, offsets[i], offsets[i + 1] - offsets[i])


@kernel_parallel
def exists_batch_parallel(tokens, start, length, parent, term, table, root, flat, offsets, out):
    """``exists_batch`` on Numba's threads."""
    for i in prange(offsets.shape[0] - 1):
        out[i] = exists_one(tokens, start, length, parent, term, table, root,
                            flat, offsets[i], offsets[i + 1] - offsets[i])


@kernel_nogil
def match_batch(tokens, start, length, parent, table, root, flat, offsets, page, out):
    """``out[i] = match_one(sequence i)`` for a CSR batch (``out`` int64 of n,
    caller-allocated)."""
    for i in range(offsets.shape[0] - 1):
        out[i] = match_one(tokens, start, length, parent, table, root,
                           flat, offsets[i], offsets[i + 1] - offsets[i], page)


@kernel_parallel
def match_batch_parallel(tokens, start, length, parent, table, root, flat, offsets, page, out):
    """``match_batch`` on Numba's threads."""
    for i in prange(offsets.shape[0] - 1):
        out[i] = match_one(tokens, start, length, parent, table, root,
                           flat, offsets[i], offsets[i + 1] - offsets[i], page)
