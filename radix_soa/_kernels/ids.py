"""Which stored sequence a query is, or extends: sequence ids for joins.

A stored sequence's id is the id of the node it ends at (its terminal). That
id never changes while the sequence is stored: a split keeps the lower part's
id, a merge the child's, compaction and save/load keep every node id. Ids of
removed sequences may be reused by later inserts.

Call graph (callers after their callees): ids_one -> ids_batch (sequence
ids); sequence_of
"""

import numpy as np

from .config import kernel_alloc, kernel_inner, kernel_nogil
from .descent import common
from .layout import NO_NODE
from .table import find_child, term_get


@kernel_inner
def ids_one(tokens, start, length, parent, term, table, root, q, qs, qn):
    """``(exact, prefix)`` of ``q[qs:qs+qn]``: the id of the stored sequence
    equal to it, and of the longest stored sequence that is a prefix of it
    (-1 when there is none)."""
    v = root
    pos = 0
    prefix = -1
    while pos < qn:
        c = find_child(table, tokens, start, parent, v, q, qs + pos, 1)
        if c == NO_NODE:
            break
        L = length[c]
        if L > qn - pos or common(tokens, start[c] + 1, q, qs + pos + 1, L - 1) != L - 1:
            break
        v = c
        pos += L
        if term_get(term, v) == 1:
            prefix = v
    exact = prefix if prefix == v and pos == qn and qn > 0 else -1
    return exact, prefix


@kernel_nogil
def ids_batch(tokens, start, length, parent, term, table, root, flat, offsets, exact,
              prefix):
    """``ids_one`` of every sequence of a CSR batch into ``exact`` and
    ``prefix`` (int64, caller-allocated)."""
    for i in range(offsets.shape[0] - 1):
        exact[i], prefix[i] = ids_one(tokens, start, length, parent, term, table, root,
                                      flat, offsets[i], offsets[i + 1] - offsets[i])


@kernel_alloc
def sequence_of(tokens, start, length, parent, term, node_end, v):
    """``(True, tokens)`` of the stored sequence with id ``v`` (int64), or
    ``(False, empty)`` when ``v`` is not the id of a stored sequence. One
    call holding the GIL: no writer runs between the check and the walk."""
    if v < 0 or v >= node_end or length[v] <= 0 or parent[v] < 0 or term_get(term, v) == 0:
        return False, np.empty(0, np.int64)
    n = 0
    u = v
    while parent[u] >= 0:
        n += length[u]
        u = parent[u]
    out = np.empty(n, np.int64)
    end = n
    u = v
    while parent[u] >= 0:
        L = length[u]
        end -= L
        for j in range(L):
            out[end + j] = tokens[start[u] + j]
        u = parent[u]
    return True, out
