"""Whole-tree walks: children lists, compaction and the stored sequences.

These kernels allocate their own scratch and result arrays (so they keep
Numba's reference counting); none of them changes the tree's arrays except
through the new arrays the caller hands in.

Call graph (callers after their callees): children_csr -> compact_spans;
sorted_children, dfs_terminals -> collect_sequences
"""

import numpy as np

from .config import kernel_alloc, kernel_inner_alloc
from .layout import LENGTH, META, M_NODE_END, PARENT, START, TOKENS, VALUES
from .mutation import copy_run
from .table import term_get


@kernel_inner_alloc
def children_csr(length, parent, node_end):
    """Children of every node as CSR: ``order[offsets[v]:offsets[v+1]]``
    (int64 offsets, int32 ids)."""
    offsets = np.zeros(node_end + 1, np.int64)
    for c in range(node_end):
        if length[c] > 0 and parent[c] >= 0:
            offsets[parent[c] + 1] += 1
    for v in range(node_end):
        offsets[v + 1] += offsets[v]
    fill = offsets[:-1].copy()
    order = np.empty(offsets[node_end], np.int32)
    for c in range(node_end):
        if length[c] > 0 and parent[c] >= 0:
            order[fill[parent[c]]] = c
            fill[parent[c]] += 1
    return offsets, order


@kernel_alloc
def compact_spans(T, new_start, new_tokens, new_values):
    """Copy every live span into ``new_tokens`` (and its values into
    ``new_values``, empty when none are kept) depth-first, each parent's span
    right before its first child's, writing the copies' starts to
    ``new_start`` (int64, at least ``node_end`` long; other entries are left
    as they are). Returns the tokens written. ``T`` is only read."""
    tokens, values, start = T[TOKENS], T[VALUES], T[START]
    length, parent = T[LENGTH], T[PARENT]
    node_end = T[META][M_NODE_END]
    offsets, order = children_csr(length, parent, node_end)
    stack = np.empty(node_end + 1, np.int64)
    keep_values = new_values.shape[0] > 0
    pos = 0
    for r in range(node_end):
        if parent[r] != -1 or length[r] != 0:
            continue  # not a root
        top = 0
        stack[0] = r
        while top >= 0:
            v = stack[top]
            top -= 1
            if parent[v] >= 0:
                L = length[v]
                copy_run(new_tokens, pos, tokens, start[v], L)
                if keep_values:
                    copy_run(new_values, pos, values, start[v], L)
                new_start[v] = pos
                pos += L
            for j in range(offsets[v + 1] - 1, offsets[v] - 1, -1):
                top += 1
                stack[top] = order[j]
    return pos


@kernel_inner_alloc
def sorted_children(tokens, start, length, parent, node_end):
    """Children CSR with each child list sorted by first token."""
    offsets, order = children_csr(length, parent, node_end)
    for v in range(node_end):
        a = offsets[v]
        b = offsets[v + 1]
        if b - a > 1:
            keys = np.empty(b - a, np.int64)
            for j in range(a, b):
                keys[j - a] = tokens[start[order[j]]]
            idx = np.argsort(keys, kind="mergesort")
            tmp = order[a:b].copy()
            for j in range(b - a):
                order[a + j] = tmp[idx[j]]
    return offsets, order


@kernel_inner_alloc
def dfs_terminals(tokens, start, length, term, root, offsets, order, flat, out_off, fill):
    """Depth-first walk under ``root``. Returns (sequences, total tokens) of
    the terminal paths; with ``fill`` it also writes them as CSR."""
    path = np.empty(0, tokens.dtype)
    if fill:
        path = np.empty(flat.shape[0], tokens.dtype)
    n_nodes = offsets.shape[0]
    stack_v = np.empty(n_nodes, np.int64)
    stack_i = np.empty(n_nodes, np.int64)
    stack_d = np.empty(n_nodes, np.int64)
    top = 0
    stack_v[0] = root
    stack_i[0] = offsets[root]
    stack_d[0] = 0
    n_out = 0
    f = 0
    while top >= 0:
        v = stack_v[top]
        i = stack_i[top]
        if i == offsets[v + 1]:
            top -= 1
            continue
        stack_i[top] = i + 1
        c = order[i]
        d = stack_d[top]
        L = length[c]
        if fill:
            s = start[c]
            for j in range(L):
                path[d + j] = tokens[s + j]
        d2 = d + L
        if term_get(term, c) == 1:
            if fill:
                for j in range(d2):
                    flat[f + j] = path[j]
                out_off[n_out + 1] = f + d2
            f += d2
            n_out += 1
        top += 1
        stack_v[top] = c
        stack_i[top] = offsets[c]
        stack_d[top] = d2
    return n_out, f


@kernel_alloc
def collect_sequences(tokens, start, length, parent, term, root, node_end):
    """Every terminal path under ``root`` as CSR ``(flat, offsets)``, in
    lexicographic order of first tokens along the way (depth-first)."""
    offsets, order = sorted_children(tokens, start, length, parent, node_end)
    empty = np.empty(0, tokens.dtype)
    no_off = np.empty(0, np.int64)
    n, total = dfs_terminals(tokens, start, length, term, root, offsets, order, empty, no_off,
                             False)
    flat = np.empty(total, tokens.dtype)
    out_off = np.zeros(n + 1, np.int64)
    dfs_terminals(tokens, start, length, term, root, offsets, order, flat, out_off, True)
    return flat, out_off
