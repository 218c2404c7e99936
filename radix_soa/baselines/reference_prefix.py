"""A pure-Python object-tree prefix cache: the oracle ``PrefixCache`` is tested
against and the "SGLang-like" baseline it is benchmarked against.

Nodes are Python objects with ``__slots__``; each holds its edge as a tuple of
tokens and the edge's values (KV slot ids) as an int64 NumPy array; children
sit in a dict keyed by their first page; edges are compared with C-level
slice comparisons (:func:`radix_soa.baselines.reference.common_prefix`), never a
per-token Python loop. Eviction is done the way SGLang's ``RadixCache`` does
it: collect every evictable leaf, heapify by access stamp, pop and trim.

>>> pc = ReferencePrefixCache(capacity=8)
>>> pc.insert([1, 2, 3, 4], [10, 11, 12, 13]).cached
0
>>> pc.insert([1, 2, 5], [10, 11, 99]).cached      # shares [1, 2]
2
>>> m = pc.match([1, 2, 3, 7])
>>> m.length, m.values.tolist()
(3, [10, 11, 12])
>>> pc.total_tokens, pc.num_nodes                  # [1,2] -> [3] -> [4], [1,2] -> [5]
(5, 4)
>>> pc.evict(2)        # oldest leaf first: [4] (last used by the first insert), then [5]
EvictResult(num_tokens=2, values=array([13, 99]))
>>> pc.stats["hit_rate"]
0.75

Semantics in short (the docstrings of the methods are precise):

- a logical clock ticks once per ``insert`` and per ``match``; every node on
  the path a call ends at is stamped with it;
- only whole pages of ``page_size`` tokens are stored or matched;
- each namespace has its own root; eviction is one LRU over all of them;
- a match or insert that ends inside a node splits it; the lower part keeps
  its identity, the new upper part takes its lock count and stamp;
- ``evict`` trims tokens from the tail of the unlocked leaf the eviction policy
  scores lowest (``lru``: the least recently used; see ``_POLICY_KEYS``),
  repeatedly, and never merges nodes.
"""

import heapq
import operator

import numpy as np

from .._tree.results import STATS, CacheFullError, EvictResult, InsertResult, InvariantError, Match
from .._input.sequence import as_tokens
from .reference import common_prefix

__all__ = ["ReferencePrefixCache", "InsertResult", "Match", "EvictResult", "CacheFullError"]

_EMPTY = np.empty(0, dtype=np.int64)
_EMPTY.flags.writeable = False


# what each eviction policy evicts first: the lowest score (ties: creation order)
_POLICY_KEYS = {
    "lru": lambda v: v.stamp,
    "lfu": lambda v: (v.hits, v.stamp),
    "fifo": lambda v: v.created,
    "mru": lambda v: -v.stamp,
    "filo": lambda v: -v.created,
    "priority": lambda v: (v.priority, v.stamp),
    "slru": lambda v: (1 if v.hits >= 2 else 0, v.stamp),  # probationary, then protected
}


class _Node:
    __slots__ = ("edge", "values", "children", "parent", "lock", "own", "stamp", "order",
                 "created", "hits", "priority")

    def __init__(self, edge, values, parent, stamp, order, created=0, hits=0, priority=0):
        self.edge = edge          # tuple of ints, a positive multiple of page_size long
        self.values = values      # int64 array parallel to edge, or None
        self.children = {}        # first page (token when page_size == 1) -> _Node
        self.parent = parent      # None for a root and for a node evicted from the tree
        self.lock = 0             # outstanding locks on this node and its descendants
        self.own = 0              # outstanding locks taken on this node itself
        self.stamp = stamp        # clock value of the last insert/match through this node
        self.order = order        # creation order: the tie-break
        self.created = created    # clock of the insert that created it (a split's upper
        #                           part: the lower part's)
        self.hits = hits          # inserts that reached it (lfu)
        self.priority = priority  # highest priority of the inserts that reached it

    def __repr__(self):
        head = ", ".join(map(str, self.edge[:4])) + (", ..." if len(self.edge) > 4 else "")
        return (f"<prefix-cache node [{head}] len={len(self.edge)} lock={self.lock} "
                f"stamp={self.stamp}>")


class _Request:
    """A request of the reference lifecycle: its namespace, the node it holds
    locked (None: none), the tokens cached for it, the values ``begin``
    found, its reservation and what ``begin`` evicted."""

    __slots__ = ("namespace", "node", "cached", "values", "reserved", "evicted", "priority")

    def __init__(self, namespace, node, cached, values):
        self.namespace = namespace
        self.node = node if node is not None and node.parent is not None else None
        self.cached = cached
        self.values = values
        self.reserved = 0
        self.priority = 0
        self.evicted = EvictResult(0, _EMPTY.copy() if values is not None else None)


class ReferencePrefixCache:
    """A RadixAttention-style prefix cache over integer token sequences.

    ``capacity``: the most tokens the cache holds (``None``: unbounded); an
    insert that would exceed it first evicts least recently used tokens.
    ``page_size``: tokens are stored and matched in whole pages of this many.
    ``values``: keep one int64 value (a KV slot id) per cached token.
    """

    def __init__(self, capacity=None, page_size=1, values=True, eviction_policy="lru",
                 count_inflight=False):
        if eviction_policy not in _POLICY_KEYS:
            raise ValueError(f"eviction_policy must be one of {', '.join(_POLICY_KEYS)}")
        self._score = _POLICY_KEYS[eviction_policy]
        page_size = operator.index(page_size)
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1; got {page_size}")
        if capacity is not None:
            capacity = operator.index(capacity)
            if capacity < 0:
                raise ValueError(f"capacity must be >= 0 or None; got {capacity}")
        self._page = page_size
        self._capacity = capacity
        self._has_values = bool(values)
        self._roots = {}          # namespace -> root node
        self._root_set = set()    # the roots, by identity: tells live handles from stale ones
        self._clock = 0
        self._created = 0         # nodes ever created (the creation-order counter)
        self._num_nodes = 0
        self._total = 0
        self._locked = 0
        self._stats = dict.fromkeys(STATS, 0)
        self._count_inflight = bool(count_inflight)
        self._inflight = 0        # tokens open requests reserve (count_inflight)

    # ------------------------------------------------------------ properties
    @property
    def capacity(self):
        return self._capacity

    @property
    def page_size(self):
        return self._page

    @property
    def has_values(self):
        return self._has_values

    @property
    def total_tokens(self):
        """Tokens held in the tree, over all namespaces."""
        return self._total

    @property
    def locked_tokens(self):
        """Tokens in nodes with a positive lock count."""
        return self._locked

    @property
    def evictable_tokens(self):
        """``total_tokens - locked_tokens``: what ``evict`` could free."""
        return self._total - self._locked

    @property
    def num_nodes(self):
        """Live nodes over all namespaces, roots excluded."""
        return self._num_nodes

    @property
    def stats(self):
        """Counters since construction, and ``hit_rate = hit_tokens / query_tokens``."""
        s = dict(self._stats)
        s["hit_rate"] = s["hit_tokens"] / s["query_tokens"] if s["query_tokens"] else 0.0
        return s

    # ------------------------------------------------------------ helpers
    def _root(self, namespace):
        if isinstance(namespace, str):
            key = namespace
        else:
            try:
                key = operator.index(namespace)
            except TypeError:
                raise TypeError("a namespace must be an int or a str; got "
                                f"{type(namespace).__name__}") from None
        root = self._roots.get(key)
        if root is None:
            root = self._roots[key] = _Node((), _EMPTY if self._has_values else None, None, 0, -1)
            self._root_set.add(root)
        return root

    def _tokens(self, tokens):
        """Validated ``tokens`` as (page-aligned tuple of ints, raw length)."""
        arr = as_tokens(tokens)
        raw = len(arr)
        return tuple(arr[:raw - raw % self._page].tolist()), raw

    def _values(self, values, raw):
        if not self._has_values:
            if values is not None:
                raise ValueError("this cache keeps no values; pass values=None")
            return None
        if values is None:
            raise ValueError("this cache keeps values: insert needs one value per token")
        vals = as_tokens(values)
        if len(vals) != raw:
            raise ValueError(f"got {len(vals)} values for {raw} tokens")
        return vals

    def _descend(self, node, t):
        """Follow whole pages of ``t`` down from ``node``.

        Returns ``(node, pos, child, k)``: ``node`` is the deepest node matched
        whole, ``pos`` the tokens matched through it; ``child`` is the child
        of ``node`` that the match ends strictly inside of, ``k`` tokens (a
        positive multiple of the page) into it, or ``None, 0``.
        """
        p, n, pos = self._page, len(t), 0
        while pos < n:
            child = node.children.get(t[pos] if p == 1 else t[pos:pos + p])
            if child is None:
                break
            k = common_prefix(t, pos, child.edge)
            k -= k % p
            if k < len(child.edge):
                return node, pos, child, k
            node, pos = child, pos + k
        return node, pos, None, 0

    def _key(self, edge):
        return edge[0] if self._page == 1 else edge[:self._page]

    def _split(self, x, k):
        """Put a new node holding ``x``'s first ``k`` tokens between ``x`` and
        its parent; ``x`` keeps the rest (and its identity). Returns the new node."""
        self._created += 1
        up = _Node(x.edge[:k], None if x.values is None else x.values[:k],
                   x.parent, x.stamp, self._created, x.created, x.hits, x.priority)
        up.lock = x.lock
        key = self._key(x.edge)
        x.edge = x.edge[k:]
        if x.values is not None:
            x.values = x.values[k:]
        x.parent = up
        up.parent.children[key] = up
        up.children[self._key(x.edge)] = x
        self._num_nodes += 1
        return up

    def _check_handle(self, node):
        """Raise ValueError unless ``node`` is a live node (or root) of this cache."""
        if not isinstance(node, _Node):
            raise ValueError(f"not a node handle: {type(node).__name__}")
        top = node
        while top.parent is not None:
            top = top.parent
        if top not in self._root_set:
            raise ValueError("stale node handle: evicted, or from another cache")

    # ------------------------------------------------------------ match
    def match_length(self, tokens, namespace=0):
        """Length of the longest cached page-aligned prefix, read only (no
        split, no clock tick, no stats)."""
        t, _ = self._tokens(tokens)
        root = self._roots.get(namespace if isinstance(namespace, str) else operator.index(namespace))
        if root is None:
            return 0
        node, pos, x, k = self._descend(root, t)
        return pos + k

    def match(self, tokens, namespace=0):
        """The longest cached page-aligned prefix of ``tokens``.

        Ticks the clock. If the prefix ends strictly inside a node, that node
        splits there (the returned node is the new upper part). Every node on
        the path from the root to the returned node is stamped with the clock.

        >>> pc = ReferencePrefixCache(page_size=2)
        >>> _ = pc.insert([1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5])
        >>> m = pc.match([1, 2, 3, 4, 5, 9])       # pages [1,2] [3,4] match; [5,9] does not
        >>> m.length, m.values.tolist(), pc.num_nodes
        (4, [0, 1, 2, 3], 2)
        """
        t, raw = self._tokens(tokens)
        root = self._root(namespace)
        return self._match(root, t, raw)

    def _match(self, root, t, raw):
        self._clock += 1
        now = self._clock
        node, pos, x, k = self._descend(root, t)
        if x is not None:
            node = self._split(x, k)
            pos += k
        end, parts = node, []
        while node.parent is not None:
            node.stamp = now
            parts.append(node.values)
            node = node.parent
        values = None
        if self._has_values:
            parts.reverse()
            values = np.concatenate(parts) if parts else _EMPTY.copy()
        st = self._stats
        st["lookups"] += 1
        st["query_tokens"] += raw
        st["hit_tokens"] += pos
        return Match(pos, end, values)

    def match_batch(self, sequences, namespace=0):
        """``[match(s, namespace).length for s in sequences]``, with every
        sequence validated before the first match runs.

        >>> pc = ReferencePrefixCache(values=False)
        >>> _ = pc.insert([1, 2, 3])
        >>> pc.match_batch([[1, 2], [1, 2, 3, 4], [5]])
        [2, 3, 0]
        """
        queries = [self._tokens(s) for s in sequences]
        root = self._root(namespace)
        return [self._match(root, t, raw).length for t, raw in queries]

    # ------------------------------------------------------------ insert
    def insert(self, tokens, values=None, namespace=0, priority=0):
        """Cache the page-aligned part of ``tokens`` with one value per token.

        Ticks the clock. Tokens already cached keep their values (first writer
        wins). With a capacity, first evicts as ``evict`` would, never touching
        the path this insert extends; raises :class:`CacheFullError` (and
        changes nothing) if that cannot make room.

        >>> pc = ReferencePrefixCache(values=False, page_size=2)
        >>> pc.insert([1, 2, 3, 4, 5]).cached          # stores [1, 2, 3, 4]
        0
        >>> pc.insert([1, 2, 3, 9]).cached, pc.total_tokens
        (2, 6)
        """
        t, raw = self._tokens(tokens)
        vals = self._values(values, raw)
        capacity = self._capacity
        if capacity is not None and self._count_inflight:
            capacity = max(0, capacity - self._inflight)
        return self._insert(t, vals, self._root(namespace), priority, capacity)

    def _insert(self, t, vals, root, priority, capacity):
        n = len(t)

        node, pos, x, k = self._descend(root, t)
        cached = pos + k
        evicted = EvictResult(0, _EMPTY.copy() if self._has_values else None)
        if capacity is not None and self._total + n - cached > capacity:
            evicted = self._make_room(x if x is not None else node,
                                      self._total + n - cached - capacity)

        self._clock += 1
        now = self._clock
        if x is not None:
            node = self._split(x, k)
        if cached < n:
            self._created += 1
            leaf = _Node(t[cached:], None if vals is None else vals[cached:n].copy(),
                         node, now, self._created, created=now, priority=priority)
            node.children[t[cached] if self._page == 1 else t[cached:cached + self._page]] = leaf
            self._num_nodes += 1
            self._total += n - cached
            node = leaf
        end = node
        while node.parent is not None:  # every node the insert reaches (the new leaf too)
            node.stamp = now
            node.hits += 1
            node.priority = max(node.priority, priority)
            node = node.parent
        self._stats["inserted_tokens"] += n - cached
        return InsertResult(cached, end, evicted)

    def _make_room(self, deepest, need):
        """Evict ``need`` tokens (rounded up to pages) with the path root..``deepest``
        protected, or raise CacheFullError having changed nothing."""
        unlocked_on_path = 0
        node = deepest
        while node.parent is not None:
            if node.lock == 0:
                unlocked_on_path += len(node.edge)
            node = node.parent
        available = self._total - self._locked - unlocked_on_path
        if available < need:
            raise CacheFullError(
                f"insert needs {need} more tokens of room but only {available} are "
                f"evictable (capacity {self._capacity}, {self._locked} locked)")
        self._lock(deepest)
        try:
            return self._evict(need)
        finally:
            self._unlock(deepest)

    # ------------------------------------------------------------ lifecycle
    # PrefixCache.begin/checkpoint/finish/abort, composed of the calls above
    def begin(self, tokens, namespace=0, reserve=None, priority=0):
        """Match and lock ``tokens``' cached prefix; with ``count_inflight``
        reserve ``reserve`` tokens (default: the unmatched ones), evicting
        what that needs, or raise ``CacheFullError`` (nothing locked,
        reserved or counted; a split the match made stays)."""
        t, raw = self._tokens(tokens)
        key = namespace if isinstance(namespace, str) else operator.index(namespace)
        root = self._roots.get(key)
        length, newly_locked = 0, 0
        if root is not None:  # what the match will find and lock, read only
            node, pos, x, k = self._descend(root, t)
            length = pos + k
            newly_locked = k if x is not None and x.lock == 0 else 0
            while node.parent is not None:
                newly_locked += len(node.edge) if node.lock == 0 else 0
                node = node.parent
        need, want = 0, 0
        if self._count_inflight:
            need = raw - length if reserve is None else operator.index(reserve)
        if self._count_inflight and self._capacity is not None:
            over = self._total + self._inflight + need - self._capacity
            if over > 0:
                evictable = self._total - self._locked - newly_locked
                if over > evictable:
                    raise CacheFullError(f"no room to reserve {need} tokens")
                want = min(-(-over // self._page) * self._page, evictable)
        if root is not None:
            m = self._match(root, t, raw)
        else:  # an unknown namespace: a miss, and nothing is created
            self._stats["lookups"] += 1
            self._stats["query_tokens"] += raw
            m = Match(0, None, _EMPTY.copy() if self._has_values else None)
        request = _Request(namespace, m.node, m.length, m.values)
        request.priority = priority
        if request.node is not None:
            self._lock(m.node)
        if want:
            request.evicted = self._evict(want)
        request.reserved = need
        self._inflight += need
        return request

    def _cache_request(self, request, tokens, values):
        if request.node is not None and request.node.own == 0:
            raise ValueError("the request no longer holds its lock")
        t, raw = self._tokens(tokens)
        vals = self._values(values, raw)
        root = self._root(request.namespace)
        node, pos, x, k = self._descend(root, t)
        if pos + k < request.cached or (request.node is not None and tuple(
                t[:request.cached]) != self._path_tokens(request.node)):
            raise ValueError("tokens must start with the request's cached prefix")
        capacity = self._capacity
        if capacity is not None and self._count_inflight:
            capacity = max(0, capacity - self._inflight + request.reserved)
        r = self._insert(t, vals, root, request.priority, capacity)
        dup = vals[request.cached:r.cached] if self._has_values else None
        return r, len(t), vals, dup

    @staticmethod
    def _path_tokens(node):
        """The tokens of the path from the root down to ``node``."""
        edges = []
        while node.parent is not None:
            edges.append(node.edge)
            node = node.parent
        return tuple(t for edge in reversed(edges) for t in edge)

    def checkpoint(self, request, tokens, values):
        """Cache what ``request`` computed so far, move its lock to the new
        node; returns its duplicate slots, then the evicted ones."""
        r, n, vals, dup = self._cache_request(request, tokens, values)
        if r.node.parent is not None:
            self._lock(r.node)
        if request.node is not None:
            self._unlock(request.node)
        request.node = r.node if r.node.parent is not None else None
        moved = min(request.reserved, max(0, n - request.cached))
        request.reserved -= moved
        self._inflight -= moved
        request.cached = max(request.cached, n)
        return np.concatenate([dup, r.evicted.values]) if self._has_values else None

    def finish(self, request, tokens, values):
        """Cache ``request``'s tokens, release its lock and reservation:
        ``(cached, node, free, evicted)`` as ``PrefixCache.finish``."""
        r, n, vals, dup = self._cache_request(request, tokens, values)
        self.abort(request)
        free = np.concatenate([dup, vals[n:]]) if self._has_values else None
        return r.cached, r.node, free, r.evicted

    def abort(self, request):
        """Release ``request``'s lock (unless an outside ``unlock`` took it)
        and reservation."""
        if request.node is not None and request.node.own > 0:
            self._unlock(request.node)
            request.node = None
        self._inflight -= request.reserved
        request.reserved = 0

    @property
    def inflight_tokens(self):
        return self._inflight

    # ------------------------------------------------------------ locks
    def lock(self, node):
        """Add a lock on ``node`` and each of its ancestors (a root: no-op)."""
        self._check_handle(node)
        self._lock(node)

    def unlock(self, node):
        """Remove a lock taken by ``lock(node)`` on this very node; ValueError
        if none is held (a lock on a descendant does not count)."""
        self._check_handle(node)
        if node.parent is not None and node.own == 0:
            raise ValueError("unlock of a node that holds no lock of its own"
                             if node.lock else "unlock of a node that is not locked")
        self._unlock(node)

    def _lock(self, node):
        if node.parent is None:
            return
        node.own += 1
        while node.parent is not None:
            if node.lock == 0:
                self._locked += len(node.edge)
            node.lock += 1
            node = node.parent

    def _unlock(self, node):
        if node.parent is None:
            return
        node.own -= 1
        while node.parent is not None:
            node.lock -= 1
            if node.lock == 0:
                self._locked -= len(node.edge)
            node = node.parent

    # ------------------------------------------------------------ eviction
    def evict(self, num_tokens):
        """Free ``num_tokens`` (rounded up to whole pages) from the tails of the
        least recently used unlocked leaves, or everything evictable if less.

        >>> pc = ReferencePrefixCache(page_size=2)
        >>> _ = pc.insert([1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15])
        >>> pc.evict(3)                            # rounds up to 4: trims [3, 4, 5, 6]
        EvictResult(num_tokens=4, values=array([12, 13, 14, 15]))
        """
        n = operator.index(num_tokens)
        if n < 0:
            raise ValueError(f"cannot evict a negative number of tokens: {n}")
        return self._evict(n)

    def _evictable_leaves(self):
        out = []
        stack = list(self._roots.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.lock == 0 and node.parent is not None:
                out.append((self._score(node), node.order, node))
        return out

    def _evict(self, n):
        p = self._page
        target = -(-n // p) * p
        freed, parts = 0, []
        if target:
            heap = self._evictable_leaves()
            heapq.heapify(heap)
            while freed < target and heap:
                leaf = heapq.heappop(heap)[2]
                size = len(leaf.edge)
                keep = size - min(size, target - freed)
                if leaf.values is not None:
                    parts.append(leaf.values[keep:])
                    leaf.values = leaf.values[:keep]
                freed += size - keep
                if keep:
                    leaf.edge = leaf.edge[:keep]
                    continue
                parent = leaf.parent
                del parent.children[self._key(leaf.edge)]
                leaf.parent = None
                self._num_nodes -= 1
                if parent.parent is not None and not parent.children and parent.lock == 0:
                    heapq.heappush(heap, (self._score(parent), parent.order, parent))
            self._total -= freed
            self._stats["evicted_tokens"] += freed
        values = None
        if self._has_values:
            values = np.concatenate(parts) if parts else _EMPTY.copy()
        return EvictResult(freed, values)

    # ------------------------------------------------------------ checks
    def check_invariants(self):
        """Walk every tree and raise :class:`InvariantError` naming the first
        broken invariant."""
        def require(cond, message):
            if not cond:
                raise InvariantError(message)

        p = self._page
        total = locked = nodes = 0
        seen, leaf_stamps = set(), []
        require(len(self._root_set) == len(self._roots)
                and all(r in self._root_set for r in self._roots.values()),
                "the root set holds exactly the namespace roots")
        for root in self._roots.values():
            require(root.parent is None and root.edge == () and root.lock == 0
                    and root.own == 0, "a root has no parent, no edge and no locks")
            stack = [root]
            while stack:
                node = stack.pop()
                require(id(node) not in seen, "every node is reachable once")
                seen.add(id(node))
                child_locks = 0
                for key, child in node.children.items():
                    e = child.edge
                    require(isinstance(e, tuple) and len(e) > 0 and len(e) % p == 0,
                            "edges are non-empty tuples of whole pages")
                    require(key == self._key(e), "a child is keyed by its edge's first page")
                    require(child.parent is node, "a child's parent pointer is its parent")
                    require(child.own >= 0, "direct lock counts are non-negative")
                    require(0 < child.stamp <= self._clock, "stamps are ticks of the clock")
                    require(node.parent is None or child.stamp <= node.stamp,
                            "a node is accessed no later than its parent")
                    require(0 < child.order <= self._created,
                            "creation orders are from the counter")
                    if self._has_values:
                        v = child.values
                        require(isinstance(v, np.ndarray) and v.dtype == np.int64
                                and v.shape == (len(e),), "values are int64, one per token")
                    else:
                        require(child.values is None, "no values in a cache without values")
                    child_locks += child.lock
                    total += len(e)
                    locked += len(e) if child.lock else 0
                    nodes += 1
                    stack.append(child)
                if node.parent is not None:
                    require(node.lock == node.own + child_locks,
                            "a node's lock count is its own locks plus its children's")
                    if not node.children:
                        leaf_stamps.append(node.stamp)
        require(len(set(leaf_stamps)) == len(leaf_stamps), "leaves have distinct stamps")
        require(nodes == self._num_nodes, "num_nodes counts the live nodes")
        require(total == self._total, "total_tokens counts the tokens in live nodes")
        require(locked == self._locked, "locked_tokens counts the tokens in locked nodes")
        require(0 <= self._locked <= self._total, "0 <= locked_tokens <= total_tokens")
        if self._capacity is not None:
            require(self._total <= self._capacity, "total_tokens within capacity")
