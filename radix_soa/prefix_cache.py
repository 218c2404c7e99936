"""``PrefixCache``: RadixAttention semantics on the struct-of-arrays tree.

The same arrays and kernels as ``RadixCache`` (``track=True`` adds lock
counts, eviction keys and a heap of evictable leaves), with the semantics of
SGLang's radix cache: per-token values (KV slot ids), locks that protect
in-flight paths, eviction of leaf tails under a capacity (LRU or another
policy), pages
and namespaces.
"""

import operator
import secrets
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
from numpy.typing import DTypeLike

from ._events import event_log
from ._events.block_hash import check_event_hash, none_hash
from ._tree.base import TreeCache
from ._serving import ServingMixin
from ._serving_batch import BatchLifecycleMixin
from ._tree.invariants import check_tree
from ._kernels import descent as descent_kernels
from ._kernels import prefix as prefix_kernels
from ._kernels.layout import (DONE, FULL, LOCK_LIMIT, M_INFLIGHT, M_LOCKED_TOKENS, M_POLICY,
                             M_TOKENS, POLICIES, PRIORITY_OFFSET, ROOM, STALE, STAT_SLOTS)
from ._tree.results import (NO_VALUES_MATCHED, NOTHING_EVICTED, BatchMatch, CacheFullError,
                       EvictResult, InsertResult, InvariantError, Match, TreeFormatError)
from ._input.sequence import as_tokens, as_values, check_fits
from ._input.types import BatchLike, Namespace, Parallel, TokenSequence
from ._tree.storage import TreeStorage, batch_plan, span_positions
from ._input.validate import (MAX_COUNT, MAX_PAGE, MAX_SEQUENCE_TOKENS, check_int, check_length,
                        check_policy)
from ._input.batch import Batch, as_batches, pack
from ._input.run import map_batches, use_parallel

__all__ = ["PrefixCache", "CacheFullError", "InsertResult", "Match", "EvictResult"]

_VALUES_NEEDED = ("values: this cache keeps a value per token (its KV slot); pass values=, or "
                  "make it with PrefixCache(values=False) to keep none")
_NO_VALUES = np.empty(0, np.int64)  # ``out`` of a call that writes no values
_INT64 = np.dtype(np.int64)
_new = tuple.__new__

_GEN_SHIFT = 32
_ID_MASK = (1 << _GEN_SHIFT) - 1

# A serving cache starts sized for a few requests of a few thousand tokens:
# each growth costs ~40 µs however small the arrays, and a cache that grew from
# the storage's minimum paid eight of them in its first 200 requests. An
# empty cache reserves ~320 KiB, nearly all zero pages it has not written.
_START_NODES = 1 << 10
_START_TOKENS = 1 << 14


class PrefixCache(BatchLifecycleMixin, ServingMixin, TreeCache):
    """The longest cached prefix of a request, where its KV cache lives, and
    what to evict when full.

    >>> pc = PrefixCache(capacity=8)
    >>> pc.insert([1, 2, 3, 4], values=[10, 11, 12, 13]).cached
    0
    >>> m = pc.match([1, 2, 3, 9])
    >>> m.length, m.values.tolist()
    (3, [10, 11, 12])
    >>> pc.lock(m.node)            # protect [1, 2, 3] while a request uses it: 3 tokens
    3
    >>> pc.evict(4).values.tolist()  # only the unlocked tail can go
    [13]
    >>> pc.unlock(m.node)
    3
    >>> pc.total_tokens, pc.locked_tokens
    (3, 0)

    ``capacity``: most tokens held (``None``: unbounded); an insert first
    evicts to fit, in the order of ``eviction_policy`` (``"lru"`` by
    default; see ``eviction_policy``). ``count_inflight``: the capacity also
    counts what open requests (``begin``) reserve. ``page_size``: tokens are
    cached, matched and evicted in whole pages. ``values``: keep one int64
    value per token (False for studies that only count). ``dtype``: the
    token buffer's type (``np.int32`` halves it). ``events``: queue a KV
    event for every run of whole pages cached or removed (``take_events``);
    off by default, and then free. ``event_hash``: the events' page hash,
    ``"fast64"`` (the default: 64-bit, chained in the kernels) or vLLM's
    ``"sha256_cbor"`` (32 bytes, byte-identical to vLLM's block hashes,
    ``event_hash_seed`` the engines' ``PYTHONHASHSEED``; see
    ``radix_soa._events.block_hash`` for how namespaces map to vLLM's extra keys).

    Node handles (``Match.node``, ``InsertResult.node``) are ints that stay
    valid while the node lives; a handle to an evicted node is rejected.

    Safe to share between threads (see ``radix_soa._tree.base``): writes hold the
    cache's lock, ``match_length`` reads without it and the batch reads
    release the GIL; between two calls (``match`` then ``lock``)
    another thread may evict the node, and ``lock`` then raises
    ``ValueError``. An exception leaves the cache as it was or as the call
    made it (``match_batch``: a prefix of its matches done).
    """

    _events = None  # the KV event queue (``events=True``); None: events off

    def __init__(self, capacity: Optional[int] = None, page_size: int = 1, *,
                 values: bool = True, dtype: DTypeLike = np.int64, count_inflight: bool = False,
                 eviction_policy: str = "lru", events: bool = False,
                 event_hash: str = "fast64", event_hash_seed: Union[str, bytes, None] = None
                 ) -> None:
        page_size = check_int("page_size", page_size, minimum=1, maximum=MAX_PAGE)
        if capacity is not None:
            capacity = check_int("capacity", capacity, minimum=0)
        self._capacity = capacity
        self._cap = -1 if capacity is None else capacity  # what kernels take
        self._count_inflight = bool(count_inflight)
        self._requests = {}  # id -> Request, from begin to finish/abort
        # this cache's incarnation: a new object at each reset() and load (and
        # so in a copy), and a Request of another incarnation is void
        self._epoch = object()
        self._page = page_size
        # mixed into every handle's generation, so a handle of another cache
        # is refused even when its node id and generation happen to match
        self._salt = secrets.randbits(32)
        self._init_lock()
        self._s = self._new_storage(dtype, values, page_size, check_policy(eviction_policy))
        self._ns_keys = [0]       # namespace number -> key, in order of first use
        self._ns_number = {0: 0}  # key -> namespace number
        self._roots = {0: self._s.root}  # key -> root id: what the arrays say, cached
        check_event_hash(event_hash)
        seed = None
        if event_hash == "sha256_cbor":
            if not events:
                raise ValueError("event_hash='sha256_cbor' needs events=True")
            seed = none_hash(event_hash_seed)
        if events:
            self._events = event_log.EventLog(page_size, seed)

    @staticmethod
    def _new_storage(dtype, values, page_size, policy):
        """The empty arrays of a cache (``__init__`` and ``reset``)."""
        s = TreeStorage(dtype, values=values, track=True, page_size=page_size,
                        node_capacity=_START_NODES, token_capacity=_START_TOKENS)
        s.meta[M_POLICY] = policy
        return s

    # ------------------------------------------------------------ sizes
    @property
    def capacity(self) -> Optional[int]:
        return self._capacity

    @property
    def eviction_policy(self) -> str:
        """What ``evict`` frees first: ``"lru"`` (least recently used),
        ``"lfu"`` (fewest inserts reached the node, ties least recent),
        ``"fifo"`` / ``"filo"`` (oldest / newest node), ``"mru"`` (most
        recently used), ``"priority"`` (lowest ``insert(priority=)`` of the
        requests that reached the node, ties least recent) or ``"slru"``
        (nodes fewer than 2 inserts reached first, then the rest; least
        recent first within each)."""
        return POLICIES[int(self._s.meta[M_POLICY])]

    @property
    def page_size(self) -> int:
        return self._page

    @property
    def has_values(self) -> bool:
        return self._s.has_values

    @property
    def dtype(self) -> np.dtype:
        return self._s.dtype

    @property
    def total_tokens(self) -> int:
        """Tokens cached, over all namespaces."""
        return self._s.count("tokens")

    @property
    def locked_tokens(self) -> int:
        """Tokens on paths some lock protects."""
        return self._s.count("locked_tokens")

    @property
    def evictable_tokens(self) -> int:
        """``total_tokens - locked_tokens``: what ``evict`` can free."""
        s = self._s
        with self._lock:
            return s.count("tokens") - s.count("locked_tokens")

    @property
    def num_nodes(self) -> int:
        """Nodes over all namespaces, roots excluded."""
        return self._s.count("nodes")

    @property
    def namespaces(self) -> List[Namespace]:
        """The namespaces that hold a root, in order of first use."""
        with self._lock:
            self._roots_in_sync()
            return list(self._roots)

    @property
    def stats(self) -> Dict[str, Any]:
        """Counters since creation: lookups, query_tokens, hit_tokens,
        inserted_tokens, evicted_tokens and hit_rate (hit / query tokens)."""
        with self._lock:
            out = self._s.stats()
        out["hit_rate"] = out["hit_tokens"] / out["query_tokens"] if out["query_tokens"] else 0.0
        return out

    # ------------------------------------------------------------ events
    @property
    def events_enabled(self) -> bool:
        """True if the cache queues KV events (``events=True``)."""
        return self._events is not None

    def take_events(self) -> List[Any]:
        """The KV events queued since the last call, oldest first, and the
        queue emptied: ``BlockStored`` for each new run of whole pages an
        insert (or ``checkpoint``/``finish``) cached, ``BlockRemoved`` for
        each run eviction, ``evict`` or ``drop_namespace`` removed, and
        ``AllBlocksCleared`` at ``reset``. Page hashes are chained from the
        namespace's seed (``radix_soa._kernels.chain``), so the same tokens
        in the same namespace hash alike on every cache; ``RouterIndex``
        rebuilds what each cache holds from them. A match (even one that
        splits a node) changes no pages and queues nothing. A loaded,
        unpickled or copied cache starts with events off. An exception
        during the call (``KeyboardInterrupt``, ``MemoryError``) loses no
        event: the next call returns them (``tests/test_faults.py``).

        >>> pc = PrefixCache(capacity=4, page_size=2, events=True)
        >>> _ = pc.insert([1, 2, 3, 4], values=[0, 0, 0, 0])
        >>> _ = pc.insert([5, 6, 7], values=[0, 0, 0])  # evicts [3, 4]
        >>> [type(e).__name__ for e in pc.take_events()]
        ['BlockStored', 'BlockRemoved', 'BlockStored']
        >>> pc.take_events()
        []
        """
        if self._events is None:
            raise ValueError("this cache queues no events; make it with events=True")
        out = None
        try:
            with self._writing:
                out = self._events.take()
            return out
        except BaseException:
            # an exception (KeyboardInterrupt, MemoryError) after the take
            # emptied the queue but before the events reached the caller:
            # they go back, first, for the next call
            if out is not None:
                with self._writing:
                    self._events.hold(out)
            raise

    def snapshot_events(self, event_hash: Optional[str] = None,
                        event_hash_seed: Union[str, bytes, None] = None) -> List[Any]:
        """Every whole page the cache holds now, as ``BlockStored`` events
        (one run per node, a parent's run before its children's) with the
        hashes ``take_events`` gives those pages: what a router applies
        (``RouterIndex.apply_snapshot``) to know this cache exactly again
        after a restart or a lost event. The event queue is left as it is;
        the snapshot already holds what the queued events do, so take
        (and drop) those first, then snapshot, then apply what comes after.

        A cache with ``events=True`` hashes as its events do (passing
        another ``event_hash`` is a ``ValueError``). Any other cache can
        snapshot too, its pages hashed with ``event_hash`` (``"fast64"`` by
        default; ``"sha256_cbor"`` with ``event_hash_seed``, the engines'
        ``PYTHONHASHSEED``).

        >>> pc = PrefixCache(page_size=2, values=False)
        >>> _ = pc.insert([1, 2, 3, 4, 5]); _ = pc.insert([1, 2, 7, 8])
        >>> [(len(e.block_hashes), e.parent_block_hash is None, e.token_ids)
        ...  for e in pc.snapshot_events()]
        [(1, True, [1, 2]), (1, False, [3, 4]), (1, False, [7, 8])]
        """
        if event_hash is not None:
            check_event_hash(event_hash)
        if self._events is not None:
            mine = "fast64" if self._events.seed is None else "sha256_cbor"
            if event_hash not in (None, mine):
                raise ValueError(f"event_hash: this cache's events use {mine!r}; got "
                                 f"{event_hash!r}")
            if event_hash_seed is not None:
                raise ValueError("event_hash_seed: this cache's events have their seed already")
            seed = self._events.seed
        else:
            seed = none_hash(event_hash_seed) if event_hash == "sha256_cbor" else None
            if seed is None and event_hash_seed is not None:
                raise ValueError("event_hash_seed is for event_hash='sha256_cbor'")
        with self._lock:
            return event_log.snapshot(self, seed)

    # ------------------------------------------------------------ handles
    def _root(self, namespace, create=True):
        """``(root id, 0)`` of ``namespace``, or ``(-1, number)`` when it has
        no root yet: the kernel that needs one makes it, with the namespace's
        number in its ``start``, so a namespace is created in the same call
        that first uses it (and the arrays always say which roots exist).
        ``create=False`` (readers, without the lock) gives ``(-1, -1)`` for a
        namespace without a root and numbers nothing."""
        if type(namespace) is int or type(namespace) is str:  # the common case, fast
            root = self._roots.get(namespace)
            if root is not None:
                return root, 0
        elif namespace is None:  # the default namespace (SGLang's extra_key=None)
            return self._root(0, create)
        if not isinstance(namespace, str):
            try:
                namespace = operator.index(namespace)
            except TypeError:
                raise TypeError("a namespace must be an int or a str; got "
                                f"{type(namespace).__name__}") from None
        self._roots_in_sync()
        root = self._roots.get(namespace)
        if root is not None:
            return root, 0
        if not create:
            return -1, -1
        number = self._ns_number.get(namespace)
        if number is None:
            self._ns_keys.append(namespace)  # an unused number is harmless
            number = len(self._ns_keys) - 1
            self._ns_number[namespace] = number
        return -1, number

    def _roots_in_sync(self):
        """Re-read the roots from the arrays if a call that made one did not
        get to record it (it was interrupted after its kernel)."""
        if self._s.count("roots") != len(self._roots):
            keys = self._ns_keys
            self._roots = {keys[n]: r for n, r in sorted(self._s.roots().items())}

    # ------------------------------------------------------------ queries
    def match(self, tokens: TokenSequence, namespace: Namespace = None) -> Match:
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
        out = np.empty(q.shape[0], np.int64) if s.has_values else _NO_VALUES
        with self._lock:
            if self._readers:
                self._drain_readers()
            s = self._s  # under the lock: a reset() may have replaced it
            key = 0 if namespace is None else namespace  # None: the default namespace
            root = self._roots.get(key, -1) if type(key) is int else -1
            if root < 0:
                root, _ = self._root(namespace, create=False)
                if root < 0:  # an unknown namespace: a miss, and nothing is created
                    self._count_misses(1, q.shape[0])
                    return _new(Match, (0, self._handle_of(s.root),
                                        NO_VALUES_MATCHED if s.has_values else None))
            status, length, v, gen = prefix_kernels.pc_match_one(
                s.directory, s.like, root, 0, q, self._page, out
            )
            if status == ROOM:
                status, length, v, gen = s.run(
                    lambda: prefix_kernels.pc_match_one(s.directory, s.like, root, 0, q, self._page, out))
        # tuple.__new__: a named tuple's own constructor is a Python call; the
        # handle is ``_handle``'s formula inline (the kernel returns ints)
        values = (out if length == out.shape[0] else out[:length]) if s.has_values else None
        return _new(Match, (length, ((gen ^ self._salt) << _GEN_SHIFT) | v, values))

    def _count_misses(self, lookups, tokens):
        """Statistics of lookups answered without a kernel (an unknown
        namespace): as the match kernels count them."""
        meta = self._s.meta
        meta[STAT_SLOTS["lookups"]] += lookups
        meta[STAT_SLOTS["query_tokens"]] += tokens

    def match_length(self, tokens: TokenSequence, namespace: Namespace = None) -> int:
        """Length of the longest cached whole-page prefix of ``tokens``, read
        only: no split, no recency refresh, no stats (for schedulers and
        studies; also works on a memory-mapped cache).

        >>> pc = PrefixCache(values=False); _ = pc.insert([1, 2, 3])
        >>> pc.match_length([1, 2, 7]), pc.num_nodes
        (2, 1)
        """
        q = as_tokens(tokens)
        root, ns = self._root(namespace, create=False)
        if root < 0:
            return 0
        s = self._s
        generation = s.generation
        length = descent_kernels.match_at(s.directory, s.like, root, q, self._page)
        if s.generation != generation:  # a growth replaced the arrays meanwhile
            with self._lock:
                length = descent_kernels.match_at(s.directory, s.like, root, q, self._page)
        return int(length)

    def match_length_batch(self, batch: BatchLike, namespace: Namespace = None,
                           parallel: Parallel = None) -> np.ndarray:
        """``match_length`` for every sequence of ``batch`` (an int64 array),
        in parallel for large batches (see ``RadixCache.exists_batch``)."""
        batches = as_batches(batch)
        root, ns = self._root(namespace, create=False)
        kernel = (
            descent_kernels.match_batch_parallel
            if use_parallel(parallel, batches)
            else descent_kernels.match_batch
        )
        s = self._s
        if root < 0:  # a namespace never used: nothing cached in it
            return map_batches(batches, np.int64, lambda b, res: None)
        read = self._read if kernel is descent_kernels.match_batch_parallel else self._read_released
        return map_batches(batches, np.int64, lambda b, res: read(
            lambda: kernel(*s.match_args, root, b.flat, b.offsets, self._page, res)))

    def match_batch(self, batch: BatchLike, namespace: Namespace = None, *,
                    with_values: bool = False) -> Union[np.ndarray, BatchMatch]:
        """Match lengths for many requests, exactly as a loop of ``match``
        (same splits, same recency updates, same stats), in one call.

        ``batch``: anything ``RadixCache.exists_batch`` takes. With
        ``with_values=True``, a ``BatchMatch(lengths, nodes, values)``: the
        node handles too, and the matched values as a ``Batch``.

        >>> pc = PrefixCache(); _ = pc.insert([1, 2, 3], values=[7, 8, 9])
        >>> pc.match_batch([[1, 2], [1, 2, 3, 4], [5]]).tolist()
        [2, 3, 0]
        >>> m = pc.match_batch([[1, 2, 3], [1, 5]], with_values=True)
        >>> m.lengths.tolist(), [v.tolist() for v in m.values]
        ([3, 1], [[7, 8, 9], [7]])
        """
        self._writable()
        batches = as_batches(batch)
        if not with_values:
            with self._writing:
                return map_batches(batches, np.int64,
                                   lambda b, out: self._match_csr(namespace, b, out))
        parts = []
        with self._writing:
            s = self._s  # under the lock: a reset() may have replaced it
            for b in batches:
                out = np.zeros(len(b), np.int64)
                nodes = np.empty((len(b), 2), np.int64)
                nodes[:, 0], nodes[:, 1] = s.root, s.gen[s.root]  # an unknown namespace's answer
                vout = np.empty(b.flat.shape[0] if s.has_values else 0, np.int64)
                self._match_csr(namespace, b, out, vout, nodes.reshape(-1))
                parts.append((b, out, nodes, vout))
            nodes = np.concatenate([p[2] for p in parts])
            handles = self._handles(nodes[:, 0], nodes[:, 1])  # with this cache's salt
        lengths = np.concatenate([p[1] for p in parts]) if len(parts) != 1 else parts[0][1]
        values = None
        if s.has_values:  # each row's matched values, packed
            flat = np.concatenate([vout[span_positions(b.offsets[:-1], out)]
                                   for b, out, _, vout in parts])
            offsets = np.zeros(lengths.shape[0] + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            values = Batch(flat, offsets)
        return BatchMatch(lengths, handles, values)

    def _match_csr(self, namespace, b, out, vout=_NO_VALUES, nodes=_NO_VALUES):
        s = self._s
        root, _ = self._root(namespace, create=False)
        if root < 0:  # an unknown namespace: all misses, nothing created
            self._count_misses(len(b), b.num_tokens)
            return
        cursor = np.array([0, root], np.int64)
        s.run(
            lambda: prefix_kernels.pc_match_batch(
                s.arrays, 0, b.flat, b.offsets, self._page, cursor, out, vout, nodes
            ),
            plan=lambda st, tokens, nodes_: (0, max(nodes_, len(b) - int(cursor[0]))),
        )

    # ------------------------------------------------------------ mutation
    def insert(self, tokens: TokenSequence, values: Optional[TokenSequence] = None,
               namespace: Namespace = None, priority: int = 0) -> InsertResult:
        """Cache ``tokens`` (whole pages) with their ``values``:
        ``InsertResult(cached, node, evicted)``.

        ``cached``: leading tokens already cached (they keep their old values:
        first writer wins, so the caller frees its duplicate slots). ``node``:
        handle of the node the sequence ends at. ``evicted``: what making room
        under ``capacity`` freed, as an ``EvictResult``. Raises
        ``CacheFullError`` (changing nothing) when locked tokens leave no room.
        ``priority``: the request's priority (``eviction_policy="priority"``:
        a node keeps the highest priority of the inserts that reached it).
        """
        s = self._s
        if type(priority) is not int or priority:
            self._check_priority(priority)
        if s.readonly:
            self._writable()
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
                self, event_log.log_size(n, self._page))
            status, cached, v, gen, freed = prefix_kernels.pc_insert_one(
                s.directory, s.like, root, ns, q, n, vals, self._page, cap, out, priority, ev
            )
            if status == ROOM:
                status, cached, v, gen, freed = s.run(lambda: prefix_kernels.pc_insert_one(
                    s.directory, s.like, root, ns, q, n, vals, self._page, cap, out, priority, ev))
            if status == FULL:
                raise self._full(n)
            if root < 0:
                self._roots_in_sync()
        evicted = NOTHING_EVICTED[s.has_values] if not freed else self._evicted(freed, out)
        return _new(InsertResult, (cached, ((gen ^ self._salt) << _GEN_SHIFT) | v, evicted))

    def insert_batch(self, batch: BatchLike, values: BatchLike = None, namespace: Namespace = None,
                     priority: int = 0) -> Tuple[np.ndarray, EvictResult]:
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

        >>> pc = PrefixCache()
        >>> cached, _ = pc.insert_batch([[1, 2, 3], [1, 2, 4]], values=[[7, 8, 9], [7, 8, 6]])
        >>> cached.tolist(), pc.match([1, 2, 4]).values.tolist()
        ([0, 2], [7, 8, 6])
        """
        s = self._s
        self._writable()
        if type(priority) is not int or priority:
            self._check_priority(priority)
        b = pack(batch)
        if s.narrow:
            check_fits(b.flat, s.dtype)
        if len(b):
            check_length(int(b.lengths.max()), "a sequence of the batch")
        if s.has_values:
            if values is None:
                raise ValueError(_VALUES_NEEDED)
            vb = pack(values)
            if not np.array_equal(vb.offsets - vb.offsets[0], b.offsets - b.offsets[0]):
                raise ValueError("values must have one value per token of every sequence")
            vflat = np.ascontiguousarray(vb.flat)
        else:
            if values is not None:
                raise ValueError("this cache keeps no values (values=False); pass values=None")
            vflat = _NO_VALUES
        flat = np.ascontiguousarray(b.flat)
        offsets = np.ascontiguousarray(b.offsets - b.offsets[0])
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
                self, event_log.log_size(flat.shape[0], self._page, len(b)))
            grew: list = []
            s.run(
                lambda: prefix_kernels.pc_insert_batch(
                    s.directory, s.like, root, flat, offsets, vflat, self._page, cap, cursor, cached,
                    out, priority, ev),
                plan=batch_plan(b, cursor, s.count("tokens"), s.count("nodes"), grew),
            )
            if grew:
                try:
                    s.trim_slack(_START_NODES, _START_TOKENS)
                except MemoryError:  # giving memory back is optional; the batch is in
                    pass
        freed = int(cursor[1])
        return cached, self._evicted(freed, out)

    def _kernel_cap(self, own=0):
        """The capacity kernels take (-1: unbounded): with
        ``count_inflight``, less what open requests reserve (but ``own``)."""
        cap = self._cap
        if self._count_inflight and cap >= 0:
            cap = max(0, cap - int(self._s.meta[M_INFLIGHT]) + own)
        return cap

    def _tokens_and_values(self, tokens, values):
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

    @staticmethod
    def _check_priority(priority):
        check_int("priority", priority, minimum=-PRIORITY_OFFSET, maximum=PRIORITY_OFFSET - 1)

    def _full(self, n):
        return CacheFullError(
            f"no room to insert {n} tokens: capacity {self._capacity}, "
            f"{self.total_tokens} cached of which {self.locked_tokens} locked, and the "
            "request's own path is never evicted")

    def _check_values(self, values, n, aligned=None):
        """``values`` for ``n`` tokens as int64: one per token, or (with
        ``aligned``) one per token of the whole pages only."""
        if not self.has_values:
            if values is not None:
                raise ValueError("this cache keeps no values (values=False); pass values=None")
            return _NO_VALUES
        if values is None:
            raise ValueError(_VALUES_NEEDED)
        vals = as_values(values)
        if vals.shape[0] != n and vals.shape[0] != aligned:
            pages = f" or {aligned} (the whole pages)" if aligned is not None and aligned != n \
                else ""
            raise ValueError(f"values has {vals.shape[0]} entries for {n} tokens; pass {n}"
                             f"{pages}")
        return vals

    def _evicted(self, freed, out):
        """The ``EvictResult`` of ``freed`` tokens whose values are in ``out``."""
        has_values = self._s.has_values
        if not freed:
            return NOTHING_EVICTED[has_values]
        return _new(EvictResult, (freed, out[:freed] if has_values else None))

    def lock(self, node: int) -> int:
        """Protect the path root..``node`` from eviction (a reference count:
        each ``lock`` needs its ``unlock``); returns the tokens it newly
        locked (0 when the path was locked already, or for a root).

        >>> pc = PrefixCache(); h = pc.insert([1, 2, 3], values=[4, 5, 6]).node
        >>> pc.lock(h), pc.lock(h), pc.unlock(h), pc.unlock(h)
        (3, 0, 0, 3)
        """
        return self._lock_handle(node, 1)

    def unlock(self, node: int) -> int:
        """Release one ``lock`` of ``node``: returns the tokens it made
        evictable again; ``ValueError`` if the node holds no lock of its own."""
        return self._lock_handle(node, -1)

    def _lock_handle(self, node, delta):
        s = self._s
        if s.readonly:
            self._writable()
        if type(node) is int and 0 <= node < 1 << 64:  # _split_handle's common case, inline
            v, gen = node & _ID_MASK, (node >> _GEN_SHIFT) ^ self._salt
        else:
            v, gen = self._split_handle(node)
        with self._lock:
            if self._readers:
                self._drain_readers()
            s = self._s  # under the lock: a reset() may have replaced it
            status, tokens = prefix_kernels.lock_handle(s.directory, s.like, v, gen, delta)
        if status != DONE:
            raise self._lock_error(node, status, delta)
        return tokens

    def _lock_error(self, node, status, delta):
        if status == STALE:
            return ValueError(f"node handle {node} does not refer to a live node of this cache")
        if delta > 0:
            return OverflowError(f"node handle {node}: a path holds at most {LOCK_LIMIT} locks "
                                 "at once (int32 counts)")
        v = node & _ID_MASK
        return ValueError(f"node handle {node} holds no lock of its own" if self._s.lock[v]
                          else f"node handle {node} is not locked")

    # ------------------------------------------------------------ handles
    # A handle is ``((generation ^ salt) << 32) | node id``: the generation
    # tells a live node from a freed and reused id, the per-cache salt a
    # handle of this cache from one of another.
    def _handle(self, v, gen):
        return ((int(gen) ^ self._salt) << _GEN_SHIFT) | int(v)

    def _handles(self, v, gen):
        """``_handle`` of int64 arrays of ids and generations, as uint64 (a
        handle takes 64 bits)."""
        return ((gen.astype(np.uint64) ^ np.uint64(self._salt)) << np.uint64(_GEN_SHIFT)) \
            | v.astype(np.uint64)

    def _handle_of(self, v):
        """The handle of live node ``v``."""
        return self._handle(v, self._s.gen[v])

    def _split_handle(self, node):
        """``(node id, generation)`` of a handle (``(-1, 0)``: none can be
        live), or ``TypeError`` for a non-integer."""
        if type(node) is not int:
            try:
                if isinstance(node, bool):
                    raise TypeError
                node = operator.index(node)
            except TypeError:
                raise TypeError(f"a node handle is an int; got {type(node).__name__}") from None
        v, gen = node & _ID_MASK, (node >> _GEN_SHIFT) ^ self._salt
        if node < 0 or gen >= 1 << _GEN_SHIFT:
            return -1, 0
        return v, gen

    def evict(self, num_tokens: int, out: Optional[np.ndarray] = None) -> EvictResult:
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
            ev = None if self._events is None else self._events.ev(self, 4 * (bound // page) + 8)
            freed = prefix_kernels.pc_evict_one(s.directory, s.like, n, page, out, ev)
        return self._evicted(freed, out)

    def _check_evict_out(self, out):
        if not self._s.has_values:
            raise ValueError("this cache keeps no values (values=False); pass out=None")
        if type(out) is not np.ndarray:
            raise TypeError(f"out must be a NumPy int64 array; got {type(out).__name__}")
        if out.dtype != _INT64 or out.ndim != 1:
            raise ValueError(f"out must be a 1-D int64 array; got {out.ndim}-D {out.dtype}")
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise ValueError("out must be C-contiguous and writable")

    # ------------------------------------------------------------ state
    def _extra_state(self):
        return {"capacity": self._capacity, "page_size": self._page,
                "count_inflight": self._count_inflight,
                "namespaces": list(self._ns_keys), "handle_salt": self._salt}

    def _restore_state(self, state):
        s = self._s
        capacity = state.get("capacity")
        if capacity is not None and (type(capacity) is not int or capacity < s.count("tokens")):
            raise TreeFormatError(f"the saved capacity {capacity!r} is not an int at least the "
                                  f"{s.count('tokens')} tokens the tree holds")
        if state.get("page_size", s.page_size) != s.page_size:
            raise TreeFormatError("the saved page size disagrees with the tree's")
        if not 0 <= int(s.meta[M_POLICY]) < len(POLICIES):
            raise TreeFormatError(f"the eviction policy number {int(s.meta[M_POLICY])} is not "
                                  f"one of the {len(POLICIES)} policies")
        salt = state.get("handle_salt", 0)  # version 1: plain handles
        if type(salt) is not int or not 0 <= salt < 2**32:
            raise TreeFormatError(f"the saved handle salt {salt!r} is not a 32-bit int")
        self._salt = salt
        self._capacity = capacity
        self._cap = -1 if capacity is None else capacity
        self._count_inflight = bool(state.get("count_inflight", False))
        s.meta[M_INFLIGHT] = 0  # requests do not outlive their process (their locks do)
        self._requests = {}
        self._epoch = object()  # requests copied along with the cache are void
        self._page = s.page_size
        if "namespaces" in state:
            keys = state["namespaces"]
            pairs = None
        else:  # format version 1: roots listed in the header; statistics there too
            pairs = [(ns, int(r)) for ns, r in state.get("roots", [[0, s.root]])]
            keys = [ns for ns, _ in pairs]
            s.set_stats(state.get("stats", {}))
        if not isinstance(keys, list) or not keys or not all(
                type(k) in (int, str) for k in keys) or len(set(keys)) != len(keys):
            raise TreeFormatError("the saved namespaces are not a list of distinct ints and strs")
        self._ns_keys = list(keys)
        self._ns_number = {k: i for i, k in enumerate(keys)}
        if pairs is not None:
            if sorted(r for _, r in pairs) != s.root_ids().tolist():
                raise TreeFormatError("the saved namespace roots are not the tree's roots")
            start = s.start.copy()  # record each root's namespace in the arrays, as now
            for i, (_, r) in enumerate(pairs):
                start[r] = i
            s._publish(s.tree._replace(start=start))
        ids = s.root_ids()
        roots = s.roots()
        if (any(not 0 <= n < len(keys) for n in roots) or len(roots) != len(ids)
                or len(ids) != s.count("roots")):
            raise TreeFormatError("the roots do not name distinct namespaces the header lists")
        self._roots = {keys[n]: r for n, r in sorted(roots.items())}

    # ------------------------------------------------------------ checks
    def check_invariants(self, full: bool = True) -> None:
        """Structure, lock accounting (``evictable + locked == total``, locked
        tokens = spans of locked nodes, locks never grow towards the root...)
        and the eviction heap (exactly the unlocked leaves, in heap order)."""
        with self._lock:
            check_tree(self._s, full=full, canonical=False)
            if self.evictable_tokens + self.locked_tokens != self.total_tokens:
                raise InvariantError("evictable + locked tokens == total tokens")
            if self._capacity is not None and self.total_tokens > self._capacity:
                raise InvariantError("total tokens within capacity")
            self._check_requests()
            roots = self._s.roots()
            if (len(roots) != len(self._s.root_ids())
                    or any(not 0 <= n < len(self._ns_keys) for n in roots)):
                raise InvariantError("every root keeps the number of a distinct namespace")

    def __repr__(self):
        return (f"PrefixCache(tokens={self.total_tokens}, nodes={self.num_nodes}, "
                f"locked={self.locked_tokens}, capacity={self._capacity}, page_size={self._page})")
