"""What changes the tokens a ``PrefixCache`` holds: ``insert``,
``insert_batch``, ``evict``, ``drop_namespace``, ``reset`` and
``reset_stats``, and the input checks they share."""

import secrets
from typing import TYPE_CHECKING, Optional, Tuple

import numpy as np

from .._input.batch import pack
from .._input.sequence import as_tokens, as_values, check_fits
from .._input.types import BatchLike, Namespace, TokenSequence
from .._input.validate import (MAX_COUNT, MAX_SEQUENCE_TOKENS, check_int,
                               check_length)
from .._kernels import prefix as prefix_kernels
from .._kernels.layout import (FULL, M_INFLIGHT, M_LOCKED_TOKENS, M_POLICY, M_TOKENS,
                               PRIORITY_OFFSET, ROOM,
                               STAT_SLOTS)
from .._tree.results import NOTHING_EVICTED, EvictResult, InsertResult
from .._tree.status import INSERT, status_error
from .._tree.storage import batch_plan, roots_and_depths
from .events import drop_subtree, log_size
from .handles import GEN_SHIFT as _GEN_SHIFT

if TYPE_CHECKING:
    from .core import PrefixCache

VALUES_NEEDED = ("values: this cache keeps a value per token (its KV slot); pass values=, or "
                 "make it with PrefixCache(values=False) to keep none")
_NO_VALUES = np.empty(0, np.int64)  # ``out`` of a call that writes no values
# A serving cache starts sized for a few requests of a few thousand tokens:
# each growth costs ~40 µs however small the arrays, and a cache that grew from
# the storage's minimum paid eight of them in its first 200 requests. An
# empty cache reserves ~320 KiB, nearly all zero pages it has not written.
START_NODES = 1 << 10
START_TOKENS = 1 << 14
_INT64 = np.dtype(np.int64)
_new = tuple.__new__


def insert(self: "PrefixCache", tokens: TokenSequence, values: Optional[TokenSequence] = None,
           namespace: Namespace = None, priority: int = 0) -> InsertResult:
    """Cache ``tokens`` (whole pages) with their ``values``:
    ``InsertResult(cached, node, evicted)``.

    ``cached``: leading tokens already cached (they keep their old values:
    first writer wins, so the caller frees its duplicate slots). ``node``:
    handle of the node the sequence ends at. ``evicted``: what making room
    under ``capacity`` freed, as an ``EvictResult``. Raises
    ``CacheFullError`` (changing nothing) when locked tokens leave no room.

    Parameters
    ----------
    tokens : sequence of int
        The sequence to cache; only its whole pages are.
    values : sequence of int or None
        One value per token (its KV slot), or for the whole pages only;
        None for a cache without values.
    namespace : int, str or None
        Where to cache (None: the default namespace); a new namespace is
        created by its first insert.
    priority : int
        The request's priority (``eviction_policy="priority"``: a node
        keeps the highest priority of the inserts that reached it).
    """
    s = self._s
    if type(priority) is not int or priority:
        self._check_priority(priority)
    if s.readonly:
        self._writable()
    if (type(tokens) is np.ndarray and type(values) is np.ndarray and tokens.dtype is _INT64
            and values.dtype is _INT64 and tokens.ndim == 1 and values.ndim == 1
            and tokens.shape[0] == values.shape[0] <= MAX_SEQUENCE_TOKENS and s.has_values
            and not s.narrow and tokens.flags.c_contiguous and values.flags.c_contiguous):
        q, vals = tokens, values  # the common case: _tokens_and_values' checks, inline
        n = q.shape[0] - q.shape[0] % self._page
    else:
        q, n, vals = self._tokens_and_values(tokens, values)
    out = (np.empty(n, np.int64) if self._capacity is not None and s.has_values
           else _NO_VALUES)
    with self._lock:
        if self._readers:
            self._drain_readers()
        s = self._s  # under the lock: a reset() may have replaced it
        cap = self._cap if not self._count_inflight else self._kernel_cap()
        key = 0 if namespace is None else namespace  # None: the default namespace
        root = self._roots.get(key, -1) if type(key) is int else -1
        ns = 0
        if root < 0:
            root, ns = self._root(namespace)
        ev = None if self._events is None else self._events.ev(
            s, self._ns_keys, log_size(n, self._page))
        status, cached, v, gen, freed = prefix_kernels.pc_insert_one(
            s.directory, s.like, root, ns, q, n, vals, self._page, cap, out, priority, ev
        )
        if status == ROOM:
            status, cached, v, gen, freed = s.run(lambda: prefix_kernels.pc_insert_one(
                s.directory, s.like, root, ns, q, n, vals, self._page, cap, out, priority, ev))
        if status == FULL:
            raise status_error(INSERT, status, self, n)
        if root < 0:
            self._roots_in_sync()
    evicted = NOTHING_EVICTED[s.has_values] if not freed else self._evicted(freed, out)
    return _new(InsertResult, (cached, ((gen ^ self._salt) << _GEN_SHIFT) | v, evicted))


def insert_batch(self: "PrefixCache", batch: BatchLike, values: BatchLike = None,
                 namespace: Namespace = None, priority: int = 0
                 ) -> Tuple[np.ndarray, EvictResult]:
    """``insert`` of every sequence of ``batch`` in one call: returns
    ``(cached, evicted)``, an int64 array (leading tokens already cached
    per sequence; -1 where a sequence could not fit under the capacity
    because of locked tokens, and was skipped) and the ``EvictResult``
    of everything making room freed.

    ``values``: a batch of the same shape (anything ``pack`` takes, e.g.
    a ``(flat, offsets)`` pair), one value per token of every sequence
    (``insert`` also takes the whole pages' values only; this does not),
    or None for a cache without values. An empty batch creates no
    namespace; a batch whose every sequence is refused still does.
    Everything is validated before anything is inserted.

    Parameters
    ----------
    batch : batch of token sequences
        Anything ``pack`` takes: lists, a 2-D array, Arrow, a ``(flat,
        offsets)`` pair.
    values : batch of int sequences or None
        One value per token of every sequence, the shape of ``batch``.
    namespace : int, str or None
        Where every sequence is cached (None: the default namespace).
    priority : int
        The requests' priority (see ``insert``).

    >>> from radix_soa import PrefixCache
    >>> pc = PrefixCache()
    >>> cached, _ = pc.insert_batch([[1, 2, 3], [1, 2, 4]], values=[[7, 8, 9], [7, 8, 6]])
    >>> cached.tolist(), pc.match([1, 2, 4]).values.tolist()
    ([0, 2], [7, 8, 6])
    """
    s = self._s
    self._writable()
    b, flat, offsets, vflat = self._insert_batch_input(batch, values, priority)
    cached = np.zeros(len(b), np.int64)
    out = np.empty(flat.shape[0] if s.has_values and self._capacity is not None else 0,
                   np.int64)
    cursor = np.zeros(2, np.int64)
    with self._writing:
        s = self._s  # under the lock: a reset() may have replaced it
        if not len(b):
            return cached, NOTHING_EVICTED[s.has_values]
        root, ns = self._root(namespace)
        if root < 0:
            root = s.new_root(ns)
            self._roots_in_sync()
        cap = self._kernel_cap()
        ev = None if self._events is None else self._events.ev(
            s, self._ns_keys, log_size(flat.shape[0], self._page, len(b)))
        grew: list = []
        s.run(
            lambda: prefix_kernels.pc_insert_batch(
                s.directory, s.like, root, flat, offsets, vflat, self._page, cap, cursor, cached,
                out, priority, ev),
            plan=batch_plan(b, cursor, s.count("tokens"), s.count("nodes"), grew),
        )
        if grew:
            try:
                s.trim_slack(START_NODES, START_TOKENS)
            except MemoryError:  # giving memory back is optional; the batch is in
                pass
    freed = int(cursor[1])
    return cached, self._evicted(freed, out)



def _insert_batch_input(self: "PrefixCache", batch, values, priority):
    """``(b, flat, offsets, vflat)`` of ``insert_batch``'s arguments, every
    one checked before anything is inserted: the packed batch, its tokens
    and offsets from 0 (C-contiguous), and its values (empty without)."""
    s = self._s
    if type(priority) is not int or priority:
        self._check_priority(priority)
    b = pack(batch)
    if s.narrow:
        check_fits(b.flat, s.dtype)
    if len(b):
        check_length(int(b.lengths.max()), "a sequence of the batch")
    if s.has_values:
        if values is None:
            raise ValueError(VALUES_NEEDED)
        vb = pack(values)
        if not np.array_equal(vb.offsets - vb.offsets[0], b.offsets - b.offsets[0]):
            raise ValueError("values must have one value per token of every sequence")
        vflat = np.ascontiguousarray(vb.flat)
    else:
        if values is not None:
            raise ValueError("this cache keeps no values (values=False); pass values=None")
        vflat = _NO_VALUES
    return b, np.ascontiguousarray(b.flat), np.ascontiguousarray(b.offsets - b.offsets[0]), vflat


def _kernel_cap(self: "PrefixCache", own=0):
    """The capacity kernels take (-1: unbounded): with
    ``count_inflight``, less what open requests reserve (but ``own``)."""
    cap = self._cap
    if self._count_inflight and cap >= 0:
        cap = max(0, cap - int(self._s.meta[M_INFLIGHT]) + own)
    return cap


def _tokens_and_values(self: "PrefixCache", tokens, values):
    """``(q, n, vals)`` of one request: its tokens as an array, checked
    against the dtype and the length limit, the tokens in its whole
    pages, and its values (one per token, or for the whole pages only)."""
    s = self._s
    q = as_tokens(tokens)
    nq = q.shape[0]
    if s.narrow:
        check_fits(q, s.dtype)
    if nq > MAX_SEQUENCE_TOKENS:
        check_length(nq)  # raises
    n = nq - nq % self._page
    if (type(values) is np.ndarray and values.dtype == _INT64 and values.ndim == 1
            and values.shape[0] == nq and values.flags.c_contiguous and s.has_values):
        return q, n, values  # the common case, checked inline
    return q, n, self._check_values(values, nq, n)


def _check_priority(priority):
    check_int("priority", priority, minimum=-PRIORITY_OFFSET, maximum=PRIORITY_OFFSET - 1)


def _check_values(self: "PrefixCache", values, n, aligned=None):
    """``values`` for ``n`` tokens as int64: one per token, or (with
    ``aligned``) one per token of the whole pages only."""
    if not self.has_values:
        if values is not None:
            raise ValueError("this cache keeps no values (values=False); pass values=None")
        return _NO_VALUES
    if values is None:
        raise ValueError(VALUES_NEEDED)
    vals = as_values(values)
    if vals.shape[0] != n and vals.shape[0] != aligned:
        pages = f" or {aligned} (the whole pages)" if aligned is not None and aligned != n \
            else ""
        raise ValueError(f"values has {vals.shape[0]} entries for {n} tokens; pass {n}"
                         f"{pages}")
    return vals


def _evicted(self: "PrefixCache", freed, out):
    """The ``EvictResult`` of ``freed`` tokens whose values are in ``out``."""
    has_values = self._s.has_values
    if not freed:
        return NOTHING_EVICTED[has_values]
    return _new(EvictResult, (freed, out[:freed] if has_values else None))


def evict(self: "PrefixCache", num_tokens: int, out: Optional[np.ndarray] = None) -> EvictResult:
    """Free ``num_tokens`` (rounded up to whole pages; fewer only if fewer
    are evictable) from the tails of the unlocked leaves the eviction
    policy scores lowest (least recently used by default):
    ``EvictResult(num_tokens, values)`` with the freed values.

    ``out``: a writable, C-contiguous int64 array the freed values are
    written to (``values`` is then ``out[:num_tokens]``), e.g. the free
    end of a slot pool, so nothing is allocated. It needs room for
    ``num_tokens`` rounded up to whole pages (or for every evictable
    token, if fewer); a cache without values takes no ``out``.

    >>> import numpy as np
    >>> from radix_soa import PrefixCache
    >>> pc = PrefixCache(); _ = pc.insert([1, 2, 3], values=[7, 8, 9])
    >>> pool = np.zeros(4, np.int64)
    >>> e = pc.evict(2, out=pool[1:])
    >>> e.num_tokens, pool.tolist()
    (2, [0, 8, 9, 0])
    """
    s = self._s
    if s.readonly:
        self._writable()
    n = num_tokens
    if type(n) is not int or not 0 <= n <= MAX_COUNT:
        n = check_int("num_tokens", num_tokens, minimum=0)
    if out is not None:
        self._check_evict_out(out)
    page = self._page
    with self._lock:
        if self._readers:
            self._drain_readers()
        s = self._s  # under the lock: a reset() may have replaced it
        meta = s.meta
        bound = min(-(-n // page) * page, int(meta[M_TOKENS] - meta[M_LOCKED_TOKENS]))
        if out is None:
            out = np.empty(bound, np.int64) if s.has_values else _NO_VALUES
        elif out.shape[0] < bound:
            raise ValueError(f"out has room for {out.shape[0]} values; this evict frees "
                             f"up to {bound}")
        ev = None if self._events is None else self._events.ev(
            s, self._ns_keys, 4 * (bound // page) + 8)
        freed = prefix_kernels.pc_evict_one(s.directory, s.like, n, page, out, ev)
    return self._evicted(freed, out)


def _check_evict_out(self: "PrefixCache", out):
    if not self._s.has_values:
        raise ValueError("this cache keeps no values (values=False); pass out=None")
    if type(out) is not np.ndarray:
        raise TypeError(f"out must be a NumPy int64 array; got {type(out).__name__}")
    if out.dtype != _INT64 or out.ndim != 1:
        raise ValueError(f"out must be a 1-D int64 array; got {out.ndim}-D {out.dtype}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("out must be C-contiguous and writable")


def reset(self: "PrefixCache") -> None:
    """Empty the cache: every token, namespace and statistic goes;
    capacity and page size stay; every handle and open request becomes
    invalid."""
    self._writable()
    with self._writing:
        s = self._s
        fresh = self._new_storage(s.dtype, s.has_values, s.page_size, s.meta[M_POLICY])
        # one update of existing keys (a single C call): no interrupt can
        # leave the cache half reset
        state = {
            "_s": fresh,
            "_salt": secrets.randbits(32),  # old handles can never match again
            "_ns_keys": [0], "_ns_number": {0: 0}, "_roots": {0: fresh.root},
            "_requests": {},
            "_epoch": object()}  # open requests are void
        if self._events is not None:  # the queue with AllBlocksCleared, in the same update
            state["_events"] = self._events.cleared()
        self.__dict__.update(state)


def reset_stats(self: "PrefixCache") -> None:
    """Zero the counters ``stats`` reports."""
    self._writable()
    with self._writing:
        for slot in STAT_SLOTS.values():
            self._s.meta[slot] = 0


def drop_namespace(self: "PrefixCache", namespace: Namespace) -> EvictResult:
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
    with self._writing:
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
        if self._events is not None:
            freed = drop_subtree(self, root, order, out, keep)
        else:
            freed = prefix_kernels.drop_subtree(s.directory, s.like, root, order, self._page, out, keep)
        if not keep:
            self._roots = {k: r for k, r in self._roots.items() if r != root}
    return EvictResult(int(freed), out if s.has_values else None)


def _subtree_deepest_first(self: "PrefixCache", root, roots_depths=None):
    """Non-root node ids under ``root``, deepest first (int64);
    ``roots_depths``: ``_storage.roots_and_depths`` of the tree, when the
    caller has it already."""
    s = self._s
    end = s.node_end
    live = s.length[:end] > 0
    up, depth = roots_depths or roots_and_depths(s.parent[:end].astype(np.int64), live)
    mine = np.flatnonzero(live & (up == root))
    return mine[np.argsort(-depth[mine], kind="stable")]
