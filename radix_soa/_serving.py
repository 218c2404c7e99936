"""What a serving loop needs from ``PrefixCache`` beyond match/insert/lock:
the request lifecycle (``begin`` / ``checkpoint`` / ``finish`` / ``abort``,
SGLang's ``cache_unfinished_req`` / ``cache_finished_req``), read-only
``peek``, ``touch``, a lock context manager, ``reset``, ``reset_stats``,
dropping a namespace, a text view of the tree and the list of cached values.

A mixin of ``PrefixCache`` (which provides ``_s``, ``_lock``, ``_root``,
``match``, ``insert``, ``lock``, ``unlock``, ``evict`` and the handle
encoding); kept apart so each module has one job.
"""

import contextlib
import secrets

import numpy as np

from ._kernels import prefix as KP
from ._kernels.layout import DONE, M_POLICY, STAT_SLOTS
from ._results import (NO_VALUES_MATCHED, NOTHING_EVICTED, CacheFullError, EvictResult,
                       Finished, Match)
from ._sequence import as_tokens
from ._storage import TreeStorage, roots_and_depths
from ._validate import check_int


class Request:
    """A request between ``begin`` and ``finish``/``abort``: the cached
    prefix it found (``cached`` tokens, their ``values``), the locked
    ``node`` protecting it, its ``namespace``, the ``reserved`` tokens it
    holds in flight (counted against the capacity when the cache has
    ``count_inflight=True``) and what making that room ``evicted``."""

    __slots__ = ("node", "cached", "values", "namespace", "reserved", "evicted", "open", "owner",
                 "epoch")

    def __init__(self, node, cached, values, namespace, reserved, evicted):
        self.node = node
        self.cached = cached
        self.values = values
        self.namespace = namespace
        self.reserved = reserved
        self.evicted = evicted
        self.open = True
        self.owner = None  # the cache and its reset count, set by begin
        self.epoch = 0

    def __repr__(self):
        state = "open" if self.open else "closed"
        return (f"Request(cached={self.cached}, node={self.node}, reserved={self.reserved}, "
                f"{state})")


class ServingMixin:
    """The serving-loop methods of ``PrefixCache`` (see the module docstring)."""

    # ------------------------------------------------------------ read-only
    def peek(self, tokens, namespace=None):
        """``match`` without side effects: no split, no recency refresh, no
        statistics; an unknown namespace matches nothing and creates nothing.
        ``node`` is the node the match ends in (locking it protects at least
        the matched prefix).

        >>> from radix_soa import PrefixCache
        >>> pc = PrefixCache(); _ = pc.insert([1, 2, 3, 4], values=[5, 6, 7, 8])
        >>> m = pc.peek([1, 2, 9]); m.length, m.values.tolist(), pc.num_nodes
        (2, [5, 6], 1)
        """
        q = as_tokens(tokens)
        s = self._s
        with self._lock:
            root, _ = self._root(namespace, create=False)
            out = np.empty(q.shape[0], np.int64) if s.has_values else None
            if root < 0:
                return Match(0, self._handle_of(s.root), NO_VALUES_MATCHED if s.has_values else None)
            length, v, gen = KP.pc_peek(s.D, s.like, root, q, self._page,
                                       out if s.has_values else s.like.astype(np.int64))
        return Match(int(length), self._handle(v, gen), out[:length] if s.has_values else None)

    def touch(self, node):
        """Refresh the recency of the path root..``node`` (as a ``match``
        ending there would, without the statistics)."""
        self._writable()
        v, gen = self._split_handle(node)
        with self._lock:
            if self._readers:
                self._drain_readers()
            status = KP.pc_touch(self._s.D, self._s.like, v, gen)
        if status != DONE:
            raise ValueError(f"node handle {node} does not refer to a live node of this cache")

    @contextlib.contextmanager
    def locked(self, node):
        """``lock(node)`` for the ``with`` block, ``unlock`` after it (also
        on an exception).

        >>> from radix_soa import PrefixCache
        >>> pc = PrefixCache(); h = pc.insert([1, 2], values=[3, 4]).node
        >>> with pc.locked(h):
        ...     pc.evict(10).num_tokens
        0
        >>> pc.evict(10).num_tokens
        2
        """
        self.lock(node)
        try:
            yield node
        finally:
            self.unlock(node)

    # ------------------------------------------------------------ lifecycle
    def begin(self, tokens, namespace=None, reserve=None):
        """A request arrives: match ``tokens`` and lock the cached prefix.

        With ``count_inflight=True`` the request also reserves ``reserve``
        tokens (default: its uncached tokens) against the capacity, evicting
        what it must (``Request.evicted``: free those slots) or raising
        ``CacheFullError`` when locked tokens leave no room (the match has
        then counted as a lookup; nothing stays locked or reserved).
        Returns a ``Request`` for ``checkpoint``/``finish``/``abort``.
        """
        self._writable()
        q = as_tokens(tokens)
        if reserve is not None:
            reserve = self._check_reserve(reserve)
        with self._lock:
            if self._readers:
                self._drain_readers()
            m = self.match(q, namespace)
            self.lock(m.node)
            need = 0
            evicted = NOTHING_EVICTED[self._s.has_values]
            if self._count_inflight:
                need = q.shape[0] - m.length if reserve is None else reserve
                try:
                    evicted = self._make_inflight_room(need)
                except BaseException:
                    self.unlock(m.node)
                    raise
                self._inflight += need
                self._sync_cap()
            request = Request(m.node, m.length, m.values, namespace, need, evicted)
            request.owner, request.epoch = self, self._epoch
        return request

    def checkpoint(self, request, tokens, values):
        """Chunked prefill: cache what ``request`` has computed so far
        (``tokens`` with their ``values``) and move its lock to the new
        node. Returns the slots the caller must free now: values of tokens
        someone else cached first (duplicates). The partial last page stays
        the request's."""
        with self._lock:
            if self._readers:
                self._drain_readers()
            self._check_open(request)
            r, free = self._cache_request(request, tokens, values, keep_partial=True)
            self.lock(r.node)
            self._release_lock(request)
            request.node = r.node
            grown = max(0, r.cached_total - request.cached)
            request.cached = max(request.cached, r.cached_total)
            if self._count_inflight:
                moved = min(request.reserved, grown)
                request.reserved -= moved
                self._inflight -= moved
                self._sync_cap()
        return free

    def finish(self, request, tokens, values):
        """A request is done: cache ``tokens`` (prompt + output, whole pages)
        with their ``values``, release its lock and its in-flight
        reservation. Returns ``Finished(cached, node, free, evicted)``:
        ``free`` holds the slots the caller must free (duplicates of tokens
        already cached, and the partial last page), ``evicted`` what making
        room freed (free those too)."""
        with self._lock:
            if self._readers:
                self._drain_readers()
            self._check_open(request)
            r, free = self._cache_request(request, tokens, values)
            self._release_lock(request)
            self._close(request)
        return Finished(r.cached, r.node, free, r.evicted)

    def abort(self, request):
        """Release ``request``'s lock and reservation without caching it."""
        with self._lock:
            if self._readers:
                self._drain_readers()
            self._check_open(request)
            self._release_lock(request)
            self._close(request)

    def _release_lock(self, request):
        # a request that matched nothing holds its namespace root's handle:
        # nothing is locked, and the root may be gone (drop_namespace)
        if request.cached > 0:
            self.unlock(request.node)

    def _cache_request(self, request, tokens, values, keep_partial=False):
        q = as_tokens(tokens)
        vals = self._check_values(values, q.shape[0])
        n = q.shape[0] - q.shape[0] % self._page
        if self._count_inflight:  # this request's own reservation becomes cached tokens
            self._inflight -= request.reserved
            self._sync_cap()
        try:
            r = self.insert(q, values=vals if self._s.has_values else None,
                            namespace=request.namespace)
        finally:
            if self._count_inflight:
                self._inflight += request.reserved
                self._sync_cap()
        if not self._s.has_values:
            return _Cached(r.cached, n, r.node, r.evicted), None
        # the request's own slots for tokens cached before it (first writer
        # wins), beyond the prefix it found cached at begin, and the partial page
        dup = vals[request.cached:r.cached]
        free = dup.copy() if keep_partial else np.concatenate([dup, vals[n:]])
        return _Cached(r.cached, n, r.node, r.evicted), free

    def _close(self, request):
        if self._count_inflight:
            self._inflight -= request.reserved
            self._sync_cap()
        request.reserved = 0
        request.open = False

    def _check_open(self, request):
        if not isinstance(request, Request):
            raise TypeError(f"request must be a Request from begin(); got {type(request).__name__}")
        if request.owner is not self:
            raise ValueError("this request belongs to another cache")
        if request.epoch != self._epoch:
            request.open = False  # reset() released its lock and reservation
            raise ValueError("this request was begun before a reset() of the cache")
        if not request.open:
            raise ValueError("this request was finished or aborted already")

    @staticmethod
    def _check_reserve(reserve):
        return check_int("reserve", reserve, minimum=0)

    def _make_inflight_room(self, need):
        if self._capacity is None:
            return NOTHING_EVICTED[self._s.has_values]
        over = self.total_tokens + self._inflight + need - self._capacity
        if over <= 0:
            return NOTHING_EVICTED[self._s.has_values]
        if over > self.evictable_tokens:
            raise CacheFullError(
                f"no room to reserve {need} tokens: capacity {self._capacity}, "
                f"{self.total_tokens} cached ({self.locked_tokens} locked), "
                f"{self._inflight} in flight")
        return self.evict(over)

    def _sync_cap(self):
        if self._capacity is not None:
            self._cap = max(0, self._capacity - self._inflight)

    @property
    def inflight_tokens(self):
        """Tokens reserved by open requests (``count_inflight=True``)."""
        return self._inflight

    # ------------------------------------------------------------ whole-cache
    def reset(self):
        """Empty the cache: every token, namespace and statistic goes;
        capacity and page size stay; every handle and open request becomes
        invalid."""
        self._writable()
        with self._lock:
            if self._readers:
                self._drain_readers()
            s = self._s
            fresh = TreeStorage(s.dtype, values=s.has_values, track=True, page_size=s.page_size)
            fresh.meta[M_POLICY] = s.meta[M_POLICY]
            self._s = fresh
            self._salt = secrets.randbits(32)  # old handles can never match again
            self._ns_keys = [0]
            self._ns_number = {0: 0}
            self._roots = {0: fresh.root}
            self._inflight = 0
            self._epoch += 1  # open requests are void
            self._sync_cap()

    def reset_stats(self):
        """Zero the counters ``stats`` reports."""
        self._writable()
        with self._lock:
            if self._readers:
                self._drain_readers()
            for slot in STAT_SLOTS.values():
                self._s.meta[slot] = 0

    def drop_namespace(self, namespace):
        """Remove every token cached under ``namespace`` (and the namespace):
        ``EvictResult`` with the removed tokens' values (free those slots).
        ``ValueError`` (nothing changed) while any of its paths is locked;
        an unknown namespace drops nothing; the default namespace is emptied
        but stays.

        >>> from radix_soa import PrefixCache
        >>> pc = PrefixCache(); _ = pc.insert([1, 2], values=[7, 8], namespace="a")
        >>> pc.drop_namespace("a").values.tolist(), pc.namespaces
        ([7, 8], [0])
        """
        self._writable()
        with self._lock:
            if self._readers:
                self._drain_readers()
            root, _ = self._root(namespace, create=False)
            if root < 0:
                return NOTHING_EVICTED[self._s.has_values]
            s = self._s
            order = self._subtree_deepest_first(root)
            if order.size and int(s.lock[order].max()) > 0:
                raise ValueError(f"namespace {namespace!r} has locked paths; unlock them first")
            total = int(s.length[order].astype(np.int64).sum())
            out = np.empty(total if s.has_values else 0, np.int64)
            keep = root == s.root  # the default namespace's root stays (node 0 is every
            #                        cache's first root; unknown namespaces answer with it)
            freed = KP.drop_subtree(s.D, s.like, root, order, self._page, out, keep)
            if not keep:
                self._roots = {k: r for k, r in self._roots.items() if r != root}
        return EvictResult(int(freed), out if s.has_values else None)

    def _subtree_deepest_first(self, root, roots_depths=None):
        """Non-root node ids under ``root``, deepest first (int64);
        ``roots_depths``: ``_storage.roots_and_depths`` of the tree, when the
        caller has it already."""
        s = self._s
        end = s.node_end
        live = s.length[:end] > 0
        up, depth = roots_depths or roots_and_depths(s.parent[:end].astype(np.int64), live)
        mine = np.flatnonzero(live & (up == root))
        return mine[np.argsort(-depth[mine], kind="stable")]

    # ------------------------------------------------------------ inspection
    def cached_values(self):
        """Every value the cache holds (one per cached token, all
        namespaces), in node order: to audit a slot pool for leaks."""
        with self._lock:
            s = self._s
            if not s.has_values:
                raise ValueError("this cache keeps no values (values=False)")
            end = s.node_end
            live = np.flatnonzero(s.length[:end] > 0)
            starts = s.start[live].astype(np.int64)
            lengths = s.length[live].astype(np.int64)
            if lengths.sum() == 0:
                return np.empty(0, np.int64)
            first = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
            return s.values[first + np.arange(int(lengths.sum()))].copy()

    def to_text(self, tokens_shown=6, max_lines=200):
        """The tree as text, one node per line indented by depth: its first
        tokens, span length, lock count and (leaves) eviction key (``stamp``:
        the last access tick under lru; see ``layout`` for the others).

        >>> from radix_soa import PrefixCache
        >>> pc = PrefixCache(); _ = pc.insert([1, 2, 3], values=[0, 0, 0])
        >>> _ = pc.insert([1, 2, 9], values=[0, 0, 0])
        >>> print(pc.to_text())
        namespace 0 (3 nodes, 4 tokens)
          [1, 2] len=2
            [3] len=1 stamp=1
            [9] len=1 stamp=2
        """
        with self._lock:
            s = self._s
            end = s.node_end
            parent = s.parent[:end]
            live = np.flatnonzero(s.length[:end] > 0)
            kids = {}
            for v in live.tolist():
                kids.setdefault(int(parent[v]), []).append(v)
            first = {v: int(s.tokens[s.start[v]]) for v in live.tolist()}
            every = roots_and_depths(parent.astype(np.int64), s.length[:end] > 0)
            lines = []
            for key, root in self._roots.items():
                sub = self._subtree_deepest_first(root, every)
                lines.append(f"namespace {key!r} ({sub.size} nodes, "
                             f"{int(s.length[sub].astype(np.int64).sum())} tokens)")
                stack = [(c, 1) for c in sorted(kids.get(root, []), key=first.get, reverse=True)]
                while stack and len(lines) < max_lines:
                    v, depth = stack.pop()
                    L = int(s.length[v])
                    a = int(s.start[v])
                    shown = ", ".join(str(int(t)) for t in s.tokens[a:a + min(L, tokens_shown)])
                    more = f", ... +{L - tokens_shown}" if L > tokens_shown else ""
                    line = f"{'  ' * depth}[{shown}{more}] len={L}"
                    if int(s.lock[v]):
                        line += f" lock={int(s.lock[v])}"
                    if v not in kids:
                        line += f" stamp={int(s.stamp[v])}"
                    lines.append(line)
                    stack.extend((c, depth + 1)
                                 for c in sorted(kids.get(v, []), key=first.get, reverse=True))
            if len(lines) >= max_lines:
                lines.append("...")
        return "\n".join(lines)

    def pretty_print(self, **kwargs):
        """Print ``to_text()``."""
        print(self.to_text(**kwargs))


class _Cached:
    __slots__ = ("cached", "cached_total", "node", "evicted")

    def __init__(self, cached, aligned, node, evicted):
        self.cached = cached
        self.cached_total = aligned
        self.node = node
        self.evicted = evicted

