"""Structural invariants of a ``TreeStorage``, checked in NumPy, not by kernels.

The checks are written independently of the kernels (vectorised NumPy), so a
kernel bug cannot hide itself. ``full=False`` checks only the counters that
cost O(1); ``full=True`` re-derives everything from the arrays.
"""

import numpy as np

from .._kernels.layout import (EMPTY, ENTRY_NODE_MASK, ENTRY_TAG_MASK, FREE, LOCK_LIMIT, MAX_LOAD,
                               TREE_FIELDS)
from .results import InvariantError
from .storage import roots_and_depths

_U = np.uint64


def _require(cond, message):
    if not cond:
        raise InvariantError(message)


def np_mix64(x):
    """NumPy twin of the kernels' splitmix64 finalizer (uint64 arrays)."""
    x = x.copy()
    with np.errstate(over="ignore"):
        x ^= x >> _U(30)
        x *= _U(0xBF58476D1CE4E5B9)
        x ^= x >> _U(27)
        x *= _U(0x94D049BB133111EB)
        x ^= x >> _U(31)
    return x


def np_key_hash(parents, pages):
    """Hash of child keys: ``parents`` (n,), ``pages`` (n, page) of tokens."""
    with np.errstate(over="ignore"):
        h = np_mix64(parents.astype(np.int64).view(_U) + _U(0x9E3779B97F4A7C15))
        for j in range(pages.shape[1]):
            h = np_mix64(h ^ pages[:, j].astype(np.int64).view(_U))
    return h


def np_tag(hashes):
    """NumPy twin of ``table.tag_of``: the high 32 bits of key hashes, as
    the int64 upper halves of table entries."""
    return (hashes & _U(0xFFFFFFFF00000000)).view(np.int64)


def check_views(s):
    """The arrays the kernels are handed are the storage's own arrays, with
    consistent sizes (a growth that went half-way would break this)."""
    tree = s.tree
    _require(all(getattr(s, name) is arr for name, arr in zip(TREE_FIELDS, tree)),
             "every array attribute is the storage's tree array")
    _require(s.readonly or tree.hkey is not tree.stamp,
             "a writable tree's heap keys are an array of their own")
    _require(len(s.arrays) == len(TREE_FIELDS) and all(a is b for a, b in zip(s.arrays, tree)),
             "the kernels' tree tuple is the storage's arrays")
    _require(all(a is getattr(tree, n) for a, n in
                 zip(s.exists_args, ("tokens", "start", "length", "parent", "term", "table"))),
             "the lookup arguments are the storage's arrays")
    _require(all(a is getattr(tree, n) for a, n in
                 zip(s.match_args, ("tokens", "start", "length", "parent", "table"))),
             "the match arguments are the storage's arrays")
    ncap = tree.start.shape[0]
    _require(all(getattr(tree, n).shape[0] == ncap for n in s.per_node_arrays),
             "every per-node array has the same length")
    if not s.track:
        _require(all(getattr(tree, n).shape[0] == 0 for n in ("lock", "stamp", "hpos", "heap",
                                                              "hkey", "gen", "own")),
                 "an untracked tree has no bookkeeping arrays")
    _require(tree.term.shape[0] >= (ncap + 7) // 8, "the terminal bitmap covers every node id")
    size = tree.table.shape[0]
    _require(size >= 16 and size & (size - 1) == 0, "the child table size is a power of two")
    _require(tree.values.shape[0] == (tree.tokens.shape[0] if s.has_values else 0),
             "the values buffer is parallel to the tokens (or empty)")
    _require(tree.tokens.dtype == s.dtype, "the token buffer has the tree's dtype")


def check_bounds(s):
    """Everything the kernels follow or trust, in O(nodes) vectorised NumPy:
    node kinds, spans inside the used buffer, the free list (one chain
    through exactly the free ids), the counters, the child table's entries
    and an empty slot, the heap and the lock counts. A loaded tree passes
    this before any kernel runs, so damage past the checksums cannot make a
    kernel read out of bounds, write past a buffer or loop forever;
    ``check_tree`` builds on it."""
    t = s.tree
    tok, end = s.count("tok_used"), s.node_end
    _require(0 <= tok <= t.tokens.shape[0] and 0 <= end <= t.start.shape[0],
         "the high-water marks lie outside the arrays")
    length = t.length[:end].astype(np.int64)
    start = t.start[:end]
    parent = t.parent[:end].astype(np.int64)
    free = length == FREE
    root = (parent == -1) & (length == 0)
    live = ~free & ~root
    _require(bool(np.all(free | root | ((length > 0) & (parent >= 0) & (parent < end)))),
         "a node is neither free, a root, nor a span with a parent")
    _require(bool(np.all(parent[free] == -2)), "a free node has a parent")
    # no cycle in the parents: a walk up from any node ends at a root
    up, _ = roots_and_depths(parent, live)
    _require(bool(np.all(root[up] | ~live)), "a node does not reach a root (its parents form a cycle)")
    _require(bool(np.all((start[live] >= 0) & (start[live] + length[live] <= tok))),
         "a span points outside the token buffer")
    _require(bool(np.all(~free[parent[live]])), "a live node hangs off a free node")
    _require(t.term.shape[0] >= (end + 7) // 8, "the terminal bitmap is too short")
    # the free list: a chain through exactly the free ids, ending at -1
    head, count = s.count("free_head"), s.count("free_count")
    nfree = int(free.sum())
    _require(count == nfree and (head == -1 if nfree == 0 else 0 <= head < end and free[head]),
         "the free list's head or count disagrees with the free nodes")
    if nfree:
        nxt = np.where(free, start, -1)
        links = nxt[free]
        _require(bool(np.all((links == -1) | ((links >= 0) & (links < end)))),
             "a free-list link points outside the node ids")
        _require(bool(np.all(free[links[links >= 0]])), "a free-list link points at a live node")
        _require(int((links == -1).sum()) == 1 and len(np.unique(links[links >= 0])) == nfree - 1,
             "the free list is not one chain")
        hop = np.concatenate([nxt, [-1]])  # -1 indexes the sink
        reach = hop.copy()
        for _ in range(max(1, end.bit_length() + 1)):
            reach = hop[reach]
            hop = reach
        _require(bool(np.all(reach[:end][free] == -1)), "the free list has a cycle")
    # counters the kernels trust
    _require(s.count("nodes") == int(live.sum()), "the node count disagrees with the nodes")
    _require(s.count("tokens") == int(length[live].sum()), "the token count disagrees with the spans")
    _require(s.count("dead_tokens") == tok - int(length[live].sum()),
         "the dead-token count disagrees with the spans")
    _require(s.count("roots") == int(root.sum()), "the root count disagrees with the roots")
    _require(0 <= s.root < end and bool(root[s.root]), "the default root is not a root")
    table = t.table
    _require(table.dtype == np.int64, "the child table is not int64")
    filled = table != EMPTY
    nodes = table[filled] & ENTRY_NODE_MASK
    _require(bool(np.all(nodes < end)), "a table entry is not a node id")
    _require(int(filled.sum()) == int(live.sum()), "the child table does not hold every node once")
    _require(bool(np.all(live[nodes])) and int(np.bincount(nodes, minlength=1).max(initial=0)) <= 1,
             "the child table does not hold every node once")
    _require(bool(np.any(~filled)), "the child table has no empty slot")
    if s.track:
        hsize = s.count("heap_size")
        _require(0 <= hsize <= end, "the heap size lies outside the node ids")
        heap = t.heap[:hsize].astype(np.int64)
        _require(bool(np.all((heap >= 0) & (heap < end)))
             and int(np.bincount(heap, minlength=1).max(initial=0)) <= 1
             and bool(np.all(live[heap])), "a heap entry is not a distinct live node")
        hpos = t.hpos[:end]
        _require(bool(np.all((hpos >= -1) & (hpos < max(hsize, 1)))), "a heap position is out of range")
        lock, own = t.lock[:end], t.own[:end]
        _require(bool(np.all((lock >= 0) & (lock <= LOCK_LIMIT) & (own >= 0) & (own <= lock))),
             f"a lock count lies outside [0, {LOCK_LIMIT}] or below the node's own locks")
        locked = int(length[live & (t.lock[:end] > 0)].sum())
        _require(s.count("locked_tokens") == locked, "the locked-token count disagrees with the locks")


def check_tree(s, full=True, canonical=False):
    check_views(s)
    end = s.node_end
    _require(0 <= s.count("tok_used") <= s.tokens.shape[0], "token high-water mark within the buffer")
    _require(0 <= end <= s.start.shape[0], "node high-water mark within the node arrays")
    _require(s.count("nodes") <= MAX_LOAD * s.table.shape[0] + 1e-9, "child table load <= 0.7")
    _require(s.count("terminals") >= 0 and s.count("nodes") >= 0, "counters non-negative")
    if not full:
        return
    # node kinds, the free list, counters, spans inside the buffer, table
    # entries and the heap's members: as a loaded tree is checked
    check_bounds(s)
    page = s.page_size
    length = s.length[:end].astype(np.int64)
    parent = s.parent[:end].astype(np.int64)
    start = s.start[:end]
    free = length == FREE
    root = (parent == -1) & (length == 0)
    live = ~free & ~root
    ids = np.flatnonzero(live)
    par = parent[ids]
    if page > 1:
        _require(np.all(length[ids] % page == 0), "spans are whole pages")

    # child counts and xor of children
    nchild = np.bincount(par, minlength=end)
    _require(np.array_equal(nchild[:end], s.nchild[:end]), "nchild counts the children")
    cx = np.zeros(end, np.int64)
    np.bitwise_xor.at(cx, par, ids)
    _require(np.array_equal(cx[~free], s.cxor[:end].astype(np.int64)[~free]), "cxor is the xor of the children")

    # spans (inside the used buffer: check_bounds) pairwise disjoint
    st = start[ids]
    ln = length[ids]
    order = np.argsort(st, kind="stable")
    st_s, ln_s = st[order], ln[order]
    _require(np.all(st_s[:-1] + ln_s[:-1] <= st_s[1:]), "spans do not overlap")

    # child table: every live non-root node exactly once, reachable by probing
    table = s.table
    filled = table != EMPTY
    entries = table[filled] & ENTRY_NODE_MASK
    _require(np.array_equal(np.sort(entries), ids), "table entries are exactly the live nodes")
    pages = _first_pages(s.tokens, start, entries, page)
    hashes = np_key_hash(parent[entries], pages)
    _require(np.array_equal(table[filled] & ENTRY_TAG_MASK, np_tag(hashes)),
             "a table entry's tag is not its node's key (parent, first page)")
    homes = (hashes & _U(table.shape[0] - 1)).astype(np.int64)
    slots = np.flatnonzero(filled)
    # no empty slot may lie cyclically between an entry's home and its slot
    empties = np.concatenate([[0], np.cumsum(~filled)])
    m = table.shape[0]
    wrap = slots < homes
    gap = np.where(wrap,
                   (empties[m] - empties[homes]) + empties[slots + 1],
                   empties[slots + 1] - empties[homes])
    _require(np.all(gap == 0), "every table entry is reachable from its home slot")
    _require(_distinct_keys(hashes, parent[entries], pages), "siblings have distinct first pages")

    terms = s.terminal_mask()
    _require(int(terms.sum()) == s.count("terminals"), "terminal count matches meta")
    _require(not np.any(terms & ~live), "only live nodes are terminal")
    if canonical:
        inner = live & ~terms
        _require(np.all(nchild[:end][inner] >= 2), "a non-terminal node has at least two children (canonical)")
        _require(np.all(terms[live & (nchild[:end] == 0)]), "every leaf is terminal (canonical)")
    if s.track:
        _check_tracking(s, end, live, root, free, length, parent, nchild[:end])



def _distinct_keys(hashes, parents, pages):
    """True if no two rows of ``(parents, pages)`` are equal. Equal rows have
    equal ``hashes``, so one uint64 column is sorted, and only the rows whose
    hash repeats are sorted whole and compared."""
    h = np.sort(hashes)
    repeated = np.unique(h[1:][h[1:] == h[:-1]])
    if repeated.size == 0:
        return True
    rows = np.flatnonzero(np.isin(hashes, repeated))
    keys = np.concatenate([parents[rows][:, None], pages[rows].astype(np.int64)], axis=1)
    keys = keys[np.lexsort(keys.T[::-1])]
    return not bool(np.any(np.all(keys[1:] == keys[:-1], axis=1)))


def _first_pages(tokens, start, entries, page):
    idx = start[entries][:, None] + np.arange(page)[None, :]
    return tokens[idx]


def _check_tracking(s, end, live, root, free, length, parent, nchild):
    lock = s.lock[:end].astype(np.int64)
    _require(np.all((lock[~free] >= 0) & (lock[~free] <= LOCK_LIMIT)),
             f"lock counts are in [0, {LOCK_LIMIT}]")
    ids = np.flatnonzero(live)
    own = s.own[:end].astype(np.int64)
    _require(np.all(own[~free] >= 0), "own lock counts are non-negative")
    below = np.zeros(end, np.int64)
    np.add.at(below, parent[ids], lock[ids])
    _require(np.array_equal(lock[live], own[live] + below[live]),
             "a node's lock count is its own locks plus its children's counts")
    locked = int(length[ids][lock[ids] > 0].sum())
    _require(locked == s.count("locked_tokens"), "locked token count matches the locks")
    hsize = s.count("heap_size")
    heap = s.heap[:hsize].astype(np.int64)
    hpos = s.hpos[:end].astype(np.int64)
    evictable = live & (nchild == 0) & (lock == 0)
    _require(np.array_equal(np.sort(heap), np.flatnonzero(evictable)),
             "the LRU heap holds exactly the unlocked leaves")
    _require(np.all(hpos[heap] == np.arange(hsize)), "heap positions are consistent")
    _require(np.all(hpos[~evictable & ~free] == -1), "nodes outside the heap have no heap position")
    _require(bool(np.all(s.hkey[heap] <= s.stamp[heap])),
             "a heap entry's key is above its node's key (a key only rises in place)")
    if hsize > 1:
        hkey = s.hkey
        kids = np.arange(1, hsize)
        par = heap[(kids - 1) // 2]
        ch = heap[kids]
        ok = (hkey[par] < hkey[ch]) | ((hkey[par] == hkey[ch]) & (par < ch))
        _require(bool(np.all(ok)), "heap order: a parent entry is older than its children")
