"""``PrefixCache``, the class: its constructor, its sizes, and a table of
contents that binds each method from the module of its feature.

The methods are plain functions of the feature modules (``lookup``,
``mutation``, ``handles``, ``lifecycle``, ``batch_lifecycle``, ``events``,
``inspection``, ``persistence``), bound here by assignment, as
``pydata/sparse`` binds ``COO``'s: no mixin, and the class's contract is
written once. A feature function annotates ``self`` as ``PrefixCache``
(imported from here for type checkers only), so mypy checks its body
against this class.
"""

import secrets
from typing import Any, Dict, List, Optional, Union

import numpy as np
from numpy.typing import DTypeLike

from .._events.block_hash import check_event_hash, none_hash
from .._events.event_log import EventLog
from .._input.types import Namespace
from .._input.validate import MAX_PAGE, check_int, check_policy
from .._kernels.layout import M_INFLIGHT, M_POLICY, POLICIES
from .._tree.base import TreeCache
from .._tree.storage import TreeStorage
from . import (batch_lifecycle, events, handles, inspection, lifecycle, lookup, mutation,
               persistence)
from .mutation import START_NODES, START_TOKENS



class PrefixCache(TreeCache):
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

    Parameters
    ----------
    capacity : int or None
        Most tokens held (``None``: unbounded); an insert first evicts to
        fit, in the order of ``eviction_policy``.
    page_size : int
        Tokens are cached, matched and evicted in whole pages.
    values : bool
        Keep one int64 value per token (False for studies that only count).
    dtype : NumPy integer dtype
        The token buffer's type (``np.int32`` halves it).
    count_inflight : bool
        The capacity also counts what open requests (``begin``) reserve.
    eviction_policy : str
        ``"lru"`` by default; see ``eviction_policy``.
    events : bool
        Queue a KV event for every run of whole pages cached or removed
        (``take_events``); off by default, and then free.
    event_hash : str
        The events' page hash, ``"fast64"`` (the default: 64-bit, chained
        in the kernels) or vLLM's ``"sha256_cbor"`` (32 bytes,
        byte-identical to vLLM's block hashes; see
        ``radix_soa._events.block_hash`` for how namespaces map to vLLM's
        extra keys).
    event_hash_seed : str, bytes or None
        With ``"sha256_cbor"``: the engines' ``PYTHONHASHSEED``.

    Node handles (``Match.node``, ``InsertResult.node``) are ints that stay
    valid while the node lives; a handle to an evicted node is rejected.

    Safe to share between threads (see ``radix_soa._tree.base``): writes hold the
    cache's lock, ``match_length`` reads without it and the batch reads
    release the GIL; between two calls (``match`` then ``lock``)
    another thread may evict the node, and ``lock`` then raises
    ``ValueError``. An exception leaves the cache as it was or as the call
    made it (``match_batch``: a prefix of its matches done).
    """

    _events: Optional[EventLog] = None  # the KV event queue (``events=True``); None: off
    _state_rows: Optional[np.ndarray] = None  # the block ``lifecycle._state_row`` hands rows from
    _next_row = 0

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
        self._requests: Dict[int, Any] = {}  # id -> Request (or RequestBatch), begin to finish
        # this cache's incarnation: a new object at each reset() and load (and
        # so in a copy), and a Request of another incarnation is void
        self._epoch = object()
        self._page = page_size
        # mixed into every handle's generation, so a handle of another cache
        # is refused even when its node id and generation happen to match
        self._salt = secrets.randbits(32)
        self._init_lock()
        self._s = self._new_storage(dtype, values, page_size, check_policy(eviction_policy))
        self._ns_keys: List[Namespace] = [0]  # namespace number -> key, in order of first use
        self._ns_number: Dict[Namespace, int] = {0: 0}  # key -> namespace number
        # key -> root id: what the arrays say, cached
        self._roots: Dict[Namespace, int] = {0: self._s.root}
        check_event_hash(event_hash)
        seed = None
        if event_hash == "sha256_cbor":
            if not events:
                raise ValueError("event_hash='sha256_cbor' needs events=True")
            seed = none_hash(event_hash_seed)
        if events:
            self._events = EventLog(page_size, seed)

    @staticmethod
    def _new_storage(dtype: Any, values: bool, page_size: int, policy: int) -> TreeStorage:
        """The empty arrays of a cache (``__init__`` and ``reset``)."""
        s = TreeStorage(dtype, values=values, track=True, page_size=page_size,
                        node_capacity=START_NODES, token_capacity=START_TOKENS)
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
    def inflight_tokens(self) -> int:
        """Tokens reserved by open requests (``count_inflight=True``)."""
        return int(self._s.meta[M_INFLIGHT])

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

    @property
    def events_enabled(self) -> bool:
        """True if the cache queues KV events (``events=True``)."""
        return self._events is not None

    # ------------------------------------------------------------ queries (lookup)
    match = lookup.match
    peek = lookup.peek
    match_length = lookup.match_length
    match_length_batch = lookup.match_length_batch
    match_batch = lookup.match_batch
    _match_csr = lookup._match_csr
    _count_misses = lookup._count_misses

    # ------------------------------------------------------------ mutation
    insert = mutation.insert
    insert_batch = mutation.insert_batch
    evict = mutation.evict
    drop_namespace = mutation.drop_namespace
    reset = mutation.reset
    reset_stats = mutation.reset_stats
    _insert_batch_input = mutation._insert_batch_input
    _kernel_cap = mutation._kernel_cap
    _tokens_and_values = mutation._tokens_and_values
    _check_priority = staticmethod(mutation._check_priority)
    _check_values = mutation._check_values
    _evicted = mutation._evicted
    _check_evict_out = mutation._check_evict_out
    _subtree_deepest_first = mutation._subtree_deepest_first

    # ------------------------------------------------------------ handles and locks
    lock = handles.lock
    unlock = handles.unlock
    locked = handles.locked
    touch = handles.touch
    _lock_handle = handles._lock_handle
    _root = handles._root
    _roots_in_sync = handles._roots_in_sync
    _handle = handles._handle
    _handles = handles._handles
    _handle_of = handles._handle_of
    _split_handle = handles._split_handle

    # ------------------------------------------------------------ request lifecycle
    begin = lifecycle.begin
    checkpoint = lifecycle.checkpoint
    finish = lifecycle.finish
    abort = lifecycle.abort
    open_requests = lifecycle.open_requests
    _state_row = lifecycle._state_row
    _begin_evict_out = lifecycle._begin_evict_out
    _transition = lifecycle._transition
    _check_open = lifecycle._check_open
    _check_reserve = staticmethod(lifecycle._check_reserve)

    # ------------------------------------------------------------ a scheduler step
    begin_batch = batch_lifecycle.begin_batch
    checkpoint_batch = batch_lifecycle.checkpoint_batch
    finish_batch = batch_lifecycle.finish_batch
    _batch_tokens = batch_lifecycle._batch_tokens
    _check_begin_out = batch_lifecycle._check_begin_out
    _batch_reserves = staticmethod(batch_lifecycle._batch_reserves)
    _batch_evict_out = batch_lifecycle._batch_evict_out
    _backup = batch_lifecycle._backup
    _cache_batch = batch_lifecycle._cache_batch
    _cache_batch_values = batch_lifecycle._cache_batch_values
    _begin_batch_input = batch_lifecycle._begin_batch_input
    _batch_need = batch_lifecycle._batch_need
    _batch_states = batch_lifecycle._batch_states
    _stage_batch = staticmethod(batch_lifecycle._stage_batch)

    # ------------------------------------------------------------ events
    take_events = events.take_events
    snapshot_events = events.snapshot_events

    # ------------------------------------------------------------ inspection
    check_invariants = inspection.check_invariants
    cached_values = inspection.cached_values
    to_text = inspection.to_text
    pretty_print = inspection.pretty_print
    _check_requests = inspection._check_requests

    # ------------------------------------------------------------ save and load
    _extra_state = persistence._extra_state
    _restore_state = persistence._restore_state

    def __repr__(self) -> str:
        return (f"PrefixCache(tokens={self.total_tokens}, nodes={self.num_nodes}, "
                f"locked={self.locked_tokens}, capacity={self._capacity}, page_size={self._page})")
