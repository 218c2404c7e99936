"""``PrefixCache``: RadixAttention semantics on the struct-of-arrays tree.

The same arrays and kernels as ``RadixCache`` (``track=True`` adds lock
counts, logical access stamps and an LRU heap of evictable leaves), with the
semantics of SGLang's radix cache: per-token values (KV slot ids), locks that
protect in-flight paths, LRU eviction of leaf tails under a capacity, pages
and namespaces.
"""

import operator

import numpy as np

from . import _kernels as K
from ._base import TreeCache
from ._invariants import InvariantError, check_tree
from ._sequence import as_tokens, check_fits
from ._storage import TreeStorage
from .batch import as_batches, map_batches, use_parallel
from .reference_prefix import _STATS, CacheFullError, EvictResult, InsertResult, Match

__all__ = ["PrefixCache", "CacheFullError", "InsertResult", "Match", "EvictResult"]

_NO_VALUES = np.empty(0, np.int64)
_GEN_SHIFT = 32
_ID_MASK = (1 << _GEN_SHIFT) - 1


class PrefixCache(TreeCache):
    """The longest cached prefix of a request, where its KV cache lives, and
    what to evict when full.

    >>> pc = PrefixCache(capacity=8)
    >>> pc.insert([1, 2, 3, 4], values=[10, 11, 12, 13]).cached
    0
    >>> m = pc.match([1, 2, 3, 9])
    >>> m.length, m.values.tolist()
    (3, [10, 11, 12])
    >>> pc.lock(m.node)            # protect [1, 2, 3] while a request uses it
    >>> pc.evict(4).values.tolist()  # only the unlocked tail can go
    [13]
    >>> pc.unlock(m.node)
    >>> pc.total_tokens, pc.locked_tokens
    (3, 0)

    ``capacity``: most tokens held (``None``: unbounded); an insert first
    evicts least recently used tokens to fit. ``page_size``: tokens are
    cached, matched and evicted in whole pages. ``values``: keep one int64
    value per token (False for studies that only count). ``dtype``: the
    token buffer's type (``np.int32`` halves it).

    Node handles (``Match.node``, ``InsertResult.node``) are ints that stay
    valid while the node lives; a handle to an evicted node is rejected.
    """

    def __init__(self, capacity=None, page_size=1, *, values=True, dtype=np.int64):
        page_size = operator.index(page_size)
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1; got {page_size}")
        if capacity is not None:
            capacity = operator.index(capacity)
            if capacity < 0:
                raise ValueError(f"capacity must be >= 0 or None; got {capacity}")
        self._capacity = capacity
        self._page = page_size
        self._s = TreeStorage(dtype, values=values, track=True, page_size=page_size)
        self._roots = {0: self._s.root}
        self._stats = dict.fromkeys(_STATS, 0)

    # ------------------------------------------------------------ sizes
    @property
    def capacity(self):
        return self._capacity

    @property
    def page_size(self):
        return self._page

    @property
    def has_values(self):
        return self._s.has_values

    @property
    def dtype(self):
        return self._s.dtype

    @property
    def total_tokens(self):
        """Tokens cached, over all namespaces."""
        return self._s.m(K.M_TOKENS)

    @property
    def locked_tokens(self):
        """Tokens on paths some lock protects."""
        return self._s.m(K.M_LOCKED_TOKENS)

    @property
    def evictable_tokens(self):
        """``total_tokens - locked_tokens``: what ``evict`` can free."""
        return self.total_tokens - self.locked_tokens

    @property
    def num_nodes(self):
        """Nodes over all namespaces, roots excluded."""
        return self._s.m(K.M_NODES)

    @property
    def namespaces(self):
        return list(self._roots)

    @property
    def stats(self):
        """Counters since creation: lookups, query_tokens, hit_tokens,
        inserted_tokens, evicted_tokens and hit_rate (hit / query tokens)."""
        out = dict(self._stats)
        out["hit_rate"] = out["hit_tokens"] / out["query_tokens"] if out["query_tokens"] else 0.0
        return out

    # ------------------------------------------------------------ handles
    def _root(self, namespace, create=True):
        """Root node id of ``namespace`` (made on first use unless ``create``
        is False, which returns None for a new namespace)."""
        if type(namespace) is int or type(namespace) is str:  # the common case, fast
            root = self._roots.get(namespace)
            if root is not None:
                return root
        if not isinstance(namespace, str):
            try:
                namespace = operator.index(namespace)
            except TypeError:
                raise TypeError("a namespace must be an int or a str; got "
                                f"{type(namespace).__name__}") from None
        root = self._roots.get(namespace)
        if root is None and create:
            root = self._roots[namespace] = self._s.new_root()
        return root

    def _handle(self, v):
        return (int(self._s.gen[v]) << _GEN_SHIFT) | int(v)

    def _resolve(self, handle):
        """Node id of a live handle, else ``ValueError``."""
        try:
            h = operator.index(handle)
        except TypeError:
            raise TypeError(f"a node handle is an int; got {type(handle).__name__}") from None
        v, gen = h & _ID_MASK, h >> _GEN_SHIFT
        s = self._s
        if h < 0 or v >= s.node_end or s.length[v] < 0 or int(s.gen[v]) != gen:
            raise ValueError(f"node handle {handle} does not refer to a live node of this cache")
        return v

    def _aligned(self, n):
        return n - n % self._page

    # ------------------------------------------------------------ queries
    def match(self, tokens, namespace=0):
        """Longest cached prefix of ``tokens`` in whole pages: ``Match(length,
        node, values)``.

        When the match ends inside a node, that node is split so ``node``
        ends exactly at ``length``; the path's access time is refreshed.
        ``length == 0`` gives the namespace's root handle.
        """
        s = self._s
        if s.readonly:
            self._writable()
        q = as_tokens(tokens)
        root = self._root(namespace)
        out = np.empty(q.shape[0] if s.has_values else 0, np.int64)
        length, v, gen = K.pc_match_one(s.T, root, q, self._page, out)
        if length < 0:
            s.reserve(nodes=1)
            length, v, gen = K.pc_match_one(s.T, root, q, self._page, out)
        st = self._stats
        st["lookups"] += 1
        st["query_tokens"] += q.shape[0]
        st["hit_tokens"] += length
        return Match(length, (int(gen) << _GEN_SHIFT) | v, out[:length] if s.has_values else None)

    def match_length(self, tokens, namespace=0):
        """Length of the longest cached whole-page prefix of ``tokens``, read
        only: no split, no recency refresh, no stats (for schedulers and
        studies; also works on a memory-mapped cache).

        >>> pc = PrefixCache(values=False); _ = pc.insert([1, 2, 3])
        >>> pc.match_length([1, 2, 7]), pc.num_nodes
        (2, 1)
        """
        q = as_tokens(tokens)
        root = self._root(namespace, create=False)
        if root is None:
            return 0
        s = self._s
        return int(K.match_one(*s.M, root, q, 0, q.shape[0], self._page))

    def match_length_batch(self, batch, namespace=0, parallel=None):
        """``match_length`` for every sequence of ``batch`` (an int64 array),
        in parallel for large batches (see ``RadixCache.exists_batch``)."""
        batches = as_batches(batch)
        root = self._root(namespace, create=False)
        kernel = K.match_batch_parallel if use_parallel(parallel, batches) else K.match_batch
        s = self._s
        if root is None:  # a namespace never used: nothing cached in it
            return map_batches(batches, np.int64, lambda b, res: None)
        return map_batches(batches, np.int64,
                           lambda b, res: kernel(*s.M, root, b.flat, b.offsets, self._page, res))

    def match_batch(self, batch, namespace=0):
        """Match lengths for many requests, exactly as a loop of ``match``
        (same splits, same recency updates, same stats), in one call.

        ``batch``: anything ``RadixCache.exists_batch`` takes.
        """
        self._writable()
        batches = as_batches(batch)
        root = self._root(namespace)
        res = map_batches(batches, np.int64, lambda b, out: self._match_csr(root, b, out))
        st = self._stats
        st["lookups"] += res.shape[0]
        st["query_tokens"] += sum(b.num_tokens for b in batches)
        st["hit_tokens"] += int(res.sum())
        return res

    def _match_csr(self, root, b, res):
        s = self._s
        flat, offsets = b.flat, b.offsets
        n = len(b)
        clock0 = int(s.meta[K.M_CLOCK])
        i = 0
        while i < n:
            i = K.pc_match_batch(s.T, root, flat, offsets, self._page, clock0, i, res)
            if i < n:
                s.reserve(nodes=max(1, n - i))
        s.meta[K.M_CLOCK] = clock0 + n

    # ------------------------------------------------------------ mutation
    def insert(self, tokens, values=None, namespace=0):
        """Cache ``tokens`` (whole pages) with their ``values``:
        ``InsertResult(cached, node, evicted)``.

        ``cached``: leading tokens already cached (they keep their old values:
        first writer wins, so the caller frees its duplicate slots). ``node``:
        handle of the node the sequence ends at. ``evicted``: what making room
        under ``capacity`` freed, as an ``EvictResult``. Raises
        ``CacheFullError`` (changing nothing) when locked tokens leave no room.
        """
        self._writable()
        q = as_tokens(tokens)
        s = self._s
        check_fits(q, s.dtype)
        vals = self._check_values(values, q.shape[0])
        n = self._aligned(q.shape[0])
        evicted = self._evicted(0, _NO_VALUES)
        if self._capacity is not None and n:
            evicted = self._make_room(self._root(namespace, create=False), q, n)
        root = self._root(namespace)
        cached, v, gen = K.pc_insert_one(s.T, root, q, n, vals, self._page)
        if cached < 0:
            s.reserve(tokens=n, nodes=2)
            cached, v, gen = K.pc_insert_one(s.T, root, q, n, vals, self._page)
        self._stats["inserted_tokens"] += n - cached
        s.meta[K.M_TOKENS_INSERTED] += q.shape[0]
        return InsertResult(cached, (int(gen) << _GEN_SHIFT) | v, evicted)

    def _check_values(self, values, n):
        if not self.has_values:
            if values is not None:
                raise ValueError("this cache keeps no values (values=False); pass values=None")
            return np.empty(0, np.int64)
        if values is None:
            raise ValueError("this cache keeps a value per token; pass values=")
        vals = as_tokens(values)
        if vals.shape[0] != n:
            raise ValueError(f"values has {vals.shape[0]} entries for {n} tokens")
        return vals

    def _evicted(self, freed, out):
        return EvictResult(freed, out[:freed] if self.has_values else None)

    def _make_room(self, root, q, n):
        """Evict what inserting ``q[:n]`` under ``root`` (None: a namespace
        not made yet) needs, never from the path the insert extends; or
        raise ``CacheFullError`` having changed nothing."""
        s = self._s
        out = np.empty(n if self.has_values else 0, np.int64)
        freed = K.pc_make_room(s.T, -1 if root is None else root, q, 0, n, self._page,
                               self._capacity, out)
        if freed < 0:
            raise CacheFullError(
                f"no room to insert {n} tokens: capacity {self._capacity}, "
                f"{self.total_tokens} cached of which {self.locked_tokens} locked, and the "
                "request's own path is never evicted")
        self._stats["evicted_tokens"] += freed
        return self._evicted(freed, out)

    def lock(self, node):
        """Protect the path root..``node`` from eviction (a reference count:
        each ``lock`` needs its ``unlock``)."""
        self._writable()
        v = self._resolve(node)
        if self._s.parent[v] >= 0:
            K.pc_lock(self._s.T, v, 1)

    def unlock(self, node):
        """Release one ``lock`` of ``node``; ``ValueError`` if it holds none."""
        self._writable()
        v = self._resolve(node)
        if self._s.parent[v] < 0:
            return
        if self._s.own[v] <= 0:
            raise ValueError(f"node handle {node} holds no lock of its own"
                             if self._s.lock[v] else f"node handle {node} is not locked")
        K.pc_lock(self._s.T, v, -1)

    def evict(self, num_tokens):
        """Free ``num_tokens`` (rounded up to whole pages; fewer only if fewer
        are evictable) from the tails of the least recently used unlocked
        leaves: ``EvictResult(num_tokens, values)`` with the freed values."""
        self._writable()
        n = operator.index(num_tokens)
        if n < 0:
            raise ValueError(f"cannot evict a negative number of tokens ({n})")
        n = -(-n // self._page) * self._page
        n = min(n, self.evictable_tokens)
        s = self._s
        out = np.empty(n if self.has_values else 0, np.int64)
        freed = int(K.pc_evict(s.T, n, self._page, out))
        self._stats["evicted_tokens"] += freed
        return self._evicted(freed, out)

    # ------------------------------------------------------------ state
    def _extra_state(self):
        return {"capacity": self._capacity, "page_size": self._page,
                "roots": [[ns, int(r)] for ns, r in self._roots.items()],
                "stats": dict(self._stats)}

    def _restore_state(self, state):
        self._capacity = state.get("capacity")
        self._page = int(state.get("page_size", self._s.page_size))
        self._roots = {ns: int(r) for ns, r in state.get("roots", [[0, self._s.root]])}
        self._stats = dict.fromkeys(_STATS, 0)
        self._stats.update(state.get("stats", {}))

    # ------------------------------------------------------------ checks
    def check_invariants(self, full=True):
        """Structure, lock accounting (``evictable + locked == total``, locked
        tokens = spans of locked nodes, locks never grow towards the root...)
        and the LRU heap (exactly the unlocked leaves, in heap order)."""
        check_tree(self._s, full=full, canonical=False)
        if self.evictable_tokens + self.locked_tokens != self.total_tokens:
            raise InvariantError("evictable + locked tokens == total tokens")
        if self._capacity is not None and self.total_tokens > self._capacity:
            raise InvariantError("total tokens within capacity")

    def __repr__(self):
        return (f"PrefixCache(tokens={self.total_tokens}, nodes={self.num_nodes}, "
                f"locked={self.locked_tokens}, capacity={self._capacity}, page_size={self._page})")
