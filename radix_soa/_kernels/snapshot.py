"""A prefix cache's cached pages as stored runs (``PrefixCache.snapshot_events``):
one run per node, parents before children, each page hashed as the event
log hashes it (``chain.page_hash`` from the namespace's seed), so the
snapshot's block hashes are those ``take_events`` gave for the same pages.

Call graph (callers after their callees): snapshot_runs (children_csr,
page_hash): a prefix cache's pages as stored runs, parents first
(PrefixCache.snapshot_events)
"""

import numpy as np

from .chain import page_hash
from .config import kernel_alloc
from .layout import LENGTH, META, M_NODE_END, PARENT, START, TOKENS
from .walks import children_csr


@kernel_alloc
def snapshot_runs(T, seeds, page):
    """``(nodes, ns, has_parent, parent, first, hashes)``: the live nodes
    in depth-first order from each root (root ids ascending; a node after
    its parent), per node its namespace number, whether a page precedes it
    (its parent is not a root), the hash of that page, the index of its
    first page in ``hashes`` (uint64, one per page, ``first[i]`` to
    ``first[i + 1]``; ``first`` has one more entry). ``seeds``: uint64 per
    namespace number (a number past it hashes from 0)."""
    tokens, start, length, parent = T[TOKENS], T[START], T[LENGTH], T[PARENT]
    node_end = T[META][M_NODE_END]
    offsets, order = children_csr(length, parent, node_end)
    n = order.shape[0]
    total = 0
    for j in range(n):
        total += length[order[j]] // page
    nodes = np.empty(n, np.int32)
    ns = np.empty(n, np.int64)
    has_parent = np.empty(n, np.int8)
    before = np.empty(n, np.uint64)
    first = np.empty(n + 1, np.int64)
    hashes = np.empty(total, np.uint64)
    stack = np.empty(n + 1, np.int64)
    hin = np.empty(node_end, np.uint64)   # the hash before each node's first page
    hasp = np.zeros(node_end, np.int8)
    k = 0
    pos = 0
    for r in range(node_end):
        if parent[r] != -1 or length[r] != 0:
            continue  # not a root
        number = start[r]
        seed = seeds[number] if 0 <= number < seeds.shape[0] else np.uint64(0)
        hin[r] = seed
        top = 0
        stack[0] = r  # the root is walked for its children, not recorded
        while top >= 0:
            v = stack[top]
            top -= 1
            h = hin[v]
            if v != r:
                nodes[k] = v
                ns[k] = number
                has_parent[k] = hasp[v]
                before[k] = h
                first[k] = pos
                s = start[v]
                for p in range(length[v] // page):
                    h = page_hash(h, tokens, s + p * page, page)
                    hashes[pos] = h
                    pos += 1
                k += 1
            for j in range(offsets[v + 1] - 1, offsets[v] - 1, -1):
                c = order[j]
                hin[c] = h
                hasp[c] = v != r
                top += 1
                stack[top] = c
    first[k] = pos
    return nodes[:k], ns[:k], has_parent[:k], before[:k], first[:k + 1], hashes[:pos]
