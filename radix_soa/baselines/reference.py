"""A pure-Python object radix tree: the baseline ``RadixCache`` is measured
against, and a second oracle in the tests.

It is written the way a careful Python programmer would write it: each node
holds its edge as a tuple, children sit in a dict keyed by first token, and
edges are compared with C-level slice comparisons (no per-token Python loop
on the hot path).

>>> t = ReferenceRadixTree()
>>> t.insert([1, 2, 3]); t.insert([1, 2, 4]); t.exists([1, 2, 3])
True
True
True
>>> t.match_prefix([1, 2, 9]), t.num_nodes
(2, 3)
"""

import numpy as np


class _Node:
    __slots__ = ("edge", "children", "terminal", "parent")

    def __init__(self, edge, parent):
        self.edge = edge
        self.children = {}
        self.terminal = False
        self.parent = parent


def as_tuple(seq):
    """A sequence as a tuple of Python ints."""
    if isinstance(seq, np.ndarray):
        return tuple(seq.tolist())
    return tuple(seq)


def common_prefix(a, i, b):
    """Length of the common prefix of ``a[i:]`` and ``b``, by bisection on
    C-level slice comparisons."""
    n = min(len(a) - i, len(b))
    if a[i:i + n] == b[:n]:
        return n
    lo, hi = 0, n  # a[i:i+lo] == b[:lo] holds; a[i:i+hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[i + lo:i + mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class ReferenceRadixTree:
    """Set of sequences in a canonical compressed trie of Python objects."""

    def __init__(self):
        self.root = _Node((), None)
        self._size = 0
        self._nodes = 0
        self._tokens = 0

    def __len__(self):
        return self._size

    @property
    def num_nodes(self):
        return self._nodes

    @property
    def num_tokens(self):
        return self._tokens

    def _walk(self, t):
        """(node, matched through node, child matched part-way, tokens into child)."""
        node, pos, n = self.root, 0, len(t)
        while pos < n:
            child = node.children.get(t[pos])
            if child is None:
                return node, pos, None, 0
            k = common_prefix(t, pos, child.edge)
            if k < len(child.edge):
                return node, pos, child, k
            node, pos = child, pos + k
        return node, pos, None, 0

    def exists(self, seq):
        t = as_tuple(seq)
        node, pos, child, _ = self._walk(t)
        return bool(t) and child is None and pos == len(t) and node.terminal

    __contains__ = exists

    def match_prefix(self, seq):
        _, pos, _, k = self._walk(as_tuple(seq))
        return pos + k

    def insert(self, seq):
        t = as_tuple(seq)
        if not t:
            raise ValueError("cannot insert an empty sequence")
        node, pos, child, k = self._walk(t)
        if child is not None:
            node = self._split(child, k)
            pos += k
        if pos < len(t):
            leaf = _Node(t[pos:], node)
            node.children[t[pos]] = leaf
            self._nodes += 1
            self._tokens += len(leaf.edge)
            node = leaf
        if node.terminal:
            return False
        node.terminal = True
        self._size += 1
        return True

    def _split(self, child, k):
        upper = _Node(child.edge[:k], child.parent)
        upper.parent.children[upper.edge[0]] = upper
        child.edge = child.edge[k:]
        child.parent = upper
        upper.children[child.edge[0]] = child
        self._nodes += 1
        return upper

    def remove(self, seq):
        t = as_tuple(seq)
        node, pos, child, _ = self._walk(t)
        if not t or child is not None or pos != len(t) or not node.terminal:
            raise KeyError(t[:8])
        node.terminal = False
        self._size -= 1
        if len(node.children) == 1:
            self._merge(node)
        elif not node.children:
            parent = node.parent
            del parent.children[node.edge[0]]
            self._nodes -= 1
            self._tokens -= len(node.edge)
            if parent is not self.root and not parent.terminal and len(parent.children) == 1:
                self._merge(parent)

    def _merge(self, node):
        (child,) = node.children.values()
        child.edge = node.edge + child.edge
        child.parent = node.parent
        node.parent.children[child.edge[0]] = child
        self._nodes -= 1

    def __iter__(self):
        """Stored sequences in lexicographic order, as tuples."""
        stack = [(self.root, ())]
        out = []
        while stack:
            node, prefix = stack.pop()
            path = prefix + node.edge
            if node.terminal:
                out.append(path)
            for key in sorted(node.children, reverse=True):
                stack.append((node.children[key], path))
        out.sort()
        return iter(out)
