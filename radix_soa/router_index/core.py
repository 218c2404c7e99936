"""``RouterIndex``: the class, as a table of contents. Its methods are
functions of the feature modules beside it, bound here by name (as
pydata/sparse's ``COO`` binds ``__getitem__ = getitem``): ``storage`` (the
arrays, their growth, the byte budget, the worker columns), ``events``
(``apply``, ``apply_snapshot``), ``workers`` (registration, status) and
``queries`` (``overlap`` and its kin).
"""

import numpy as np

from .._tree.base import ReadersWriter
from .._events.block_hash import check_event_hash, none_hash
from .._events.kv_events import namespace_seed
from .._input.validate import MAX_PAGE, check_int
from . import events, queries, state, storage, wire, workers as workers_
from .queries import OverlapReport, SEEDS_KEPT
from .storage import MIN_BYTES
from .._kernels.router import X_LIVE
from .workers import worker_id

__all__ = ["RouterIndex", "OverlapReport", "worker_id", "SEEDS_KEPT", "MIN_BYTES"]

_BOOL = (bool, np.bool_)


class RouterIndex(ReadersWriter):
    """Every worker's cached pages in one struct-of-arrays index, from their
    KV events.

    >>> import radix_soa as rs
    >>> a = rs.PrefixCache(page_size=2, events=True, values=False)
    >>> b = rs.PrefixCache(page_size=2, events=True, values=False)
    >>> _ = a.insert([1, 2, 3, 4, 5]); _ = b.insert([1, 2, 7, 8])
    >>> ix = rs.RouterIndex(page_size=2)
    >>> ix.apply("a", a.take_events()); ix.apply("b", [e.to_dict() for e in b.take_events()])
    >>> ix.workers, ix.overlap([1, 2, 3, 4, 9]).tolist()
    (['a', 'b'], [4, 2])
    >>> ix.overlap_batch([[1, 2, 7, 8], [5, 6]]).tolist()
    [[2, 4], [0, 0]]
    >>> ix.remove_worker("a"); ix.workers, len(ix)
    (['b'], 2)
    >>> ix.add_worker("c"); ix.overlap_scores([1, 2, 7])
    {'b': 2, 'c': 0}

    The index keeps an explicit set of workers, in the order they were
    registered (``workers=`` at construction, ``add_worker``, or the first
    ``apply`` of a new id, even with no events): ``overlap``'s columns follow
    ``workers``, a worker with nothing cached included (the best target of
    a cold request), and ``remove_worker`` takes a worker out of both. So
    ``RouterIndex(workers=range(n)).overlap(q)[w]`` is worker ``w``'s
    ``match_length(q)`` whatever order their events come in. A worker id is
    an int, a str, or a tuple of those (such as Dynamo's ``(worker_id,
    dp_rank)``); NumPy integers count as ints. ``overlap_scores`` gives the
    same answer as a dict keyed by worker id.

    ``apply(worker, events)`` takes one worker's events in the order it
    emitted them, as objects or dicts. A malformed event (or one of another
    page size or hash kind) raises ``EventError`` (a ``ValueError``) before
    anything changes, in every mode. An event that is well formed but
    cannot apply to what the index holds for the worker (a stored run whose
    parent block the worker does not hold: an event missed or out of order;
    a block stored twice; a removed block the worker does not hold; a gap in
    ``seq``) is handled by the mode:

    - ``strict=True`` (the default): all or nothing, ``EventError`` naming
      the event and the problem, and the index is left exactly as it was
      (the events of the call applied before it are undone);
    - ``strict=False``: the worker becomes *degraded* (``status``,
      ``degraded``) and every event still applies as far as it can: the
      pages of a stored run are added (a page counts for ``overlap`` only
      when the worker holds every page before it, so a run under a missing
      parent adds no overlap until the parent comes), held ones and pages
      known under another parent are skipped, removals take what the worker
      holds. ``overlap`` keeps answering for it from what it holds, and
      ``overlap_report`` says which workers are degraded. The worker is
      *exact* again after an ``AllBlocksCleared`` or ``apply_snapshot``
      (``PrefixCache.snapshot_events``), which replace its pages.

    ``seq`` numbers a worker's calls (vLLM numbers its event batches): a
    call whose ``seq`` is at most the last one applied is a duplicate and
    is skipped; one past the next is a gap (strict: ``EventError``;
    otherwise the worker is degraded and the events apply).
    Hashes are trusted as page identities: two different pages with one
    64-bit hash would be one node.

    ``max_bytes`` bounds the index's arrays (``memory_report``): past it the
    index forgets, for every worker, the pages queries walked least recently
    (a query stamps each page it walks; a store stamps the pages it adds),
    so overlap only ever drops, never rises. A worker whose pages were
    forgotten then sends events about them; the index counts, per worker,
    the pages it forgot, and takes that many removals of blocks it no
    longer has (and stored runs under them) as expected rather than as
    errors. Forgetting is never undone: a strict apply that fails restores
    the worker's pages but those the budget forgot meanwhile (which only
    lowers overlap). Nodes and table slots are reused, so under churn at a steady
    cached set the memory stays flat (one node per page: no run ever splits,
    so none needs merging back).

    Pages are keyed by their tokens (``event_hash="fast64"``, the
    default): the index's own chained hash of the parent page's key, the
    page's tokens and its extra keys (``BlockStored.extra_keys``, a LoRA
    name carried as the page's namespace), so any engine hash works (vLLM's
    ``sha256``, ``sha256_cbor``, ``xxhash``, ...; ints or bytes). Each
    worker's own block hash of a page is kept only as a handle (a per-worker
    map from it to the page's key) to resolve that worker's
    ``BlockRemoved`` and ``parent_block_hash``; a ``PrefixCache``'s own
    ``fast64`` hashes are the keys themselves and need no entry. A query
    never computes an engine's hash. ``event_hash="sha256_cbor"`` (with
    the engines' ``event_hash_seed``, ``PYTHONHASHSEED``) is the
    engine-hash form, for events without tokens: each block keyed by the
    low 64 bits of vLLM's hash (``key64``), and ``overlap`` hashing the
    query in Python, a SHA-256 and a CBOR encoding per page (tens of
    microseconds for a 1,100-token request of 16-token pages) where the
    token keys are hashed in the kernel. Either way two different pages
    with one 64-bit key would be one node (about ``n**2 / 2**65`` for
    ``n`` pages).

    Parameters
    ----------
    page_size : int
        Tokens per page (the engines' block size).
    workers : iterable of worker ids
        Workers registered from the start, in this order.
    event_hash : str
        ``"fast64"``: pages keyed by their tokens (any engine hash);
        ``"sha256_cbor"``: keyed by vLLM's ``sha256_cbor`` block hash.
    event_hash_seed : int, str or None
        ``sha256_cbor``'s seed (the engines' ``PYTHONHASHSEED``).
    strict : bool
        The default mode of ``apply``.
    max_bytes : int or None
        The budget of the index's arrays (None: unbounded).

    Safe to share between threads: ``apply`` and ``remove_worker`` hold the
    index's lock from their first check to their last change (and wait for
    running ``overlap_batch`` calls), ``overlap`` and the other reads hold
    it while they read, and ``overlap_batch`` reads as a registered reader
    beside other readers, its kernel without the GIL. So any mix of calls
    from any threads answers as some serial order of them would: a read
    sees every ``apply`` entirely or not at all. (With ``max_bytes``,
    concurrent ``overlap_batch`` calls may race on a page's stamp: a lost
    write leaves the page a few queries older, never an answer wrong.)
    """

    def __init__(self, page_size=16, *, workers=(), event_hash="fast64",
                 event_hash_seed=None, strict=True, max_bytes=None):
        self._page = check_int("page_size", page_size, minimum=1, maximum=MAX_PAGE)
        self._event_hash = check_event_hash(event_hash)
        if not isinstance(strict, _BOOL):
            raise TypeError(f"strict must be a bool; got {type(strict).__name__}")
        self._strict = bool(strict)
        self._max_bytes = None if max_bytes is None else check_int(
            "max_bytes", max_bytes, minimum=MIN_BYTES)
        self._none_hash = none_hash(event_hash_seed) if event_hash == "sha256_cbor" else None
        self._no_keys = np.empty(0, np.uint64)  # overlap's hkeys: the kernel hashes
        self._hmaps = {}       # column -> its handle map (engine hash -> page key)
        self._cols = {}        # worker id -> column
        self._col_ids = []     # column -> worker id (None: a free column)
        self._order = []       # the worker ids in the order they were registered
        self._out = slice(0, 0)  # their columns in a result row (a slice when in order)
        self._status = {}      # degraded worker id -> the first problem since it was exact
        self._syncing = {}     # worker id -> why its feed has not confirmed it yet
        self._seq = {}         # worker id -> the last seq applied
        self._forgotten = 0    # pages the budget forgot, since creation
        self._words = 1
        self._eh_on = False    # nodes keep their engine hash (``_ehash_on``)
        self._budget_words = self._budget_nodes = 0  # _node_budget's cache
        self._live = np.zeros(1, np.int64)  # bitmask of the live columns
        self._forgot = np.zeros(64, np.int64)  # per column: pages forgotten it still holds
        self._alloc(64 if max_bytes is None else min(64, self._node_budget()), 128)
        self._seed_none = np.uint64(namespace_seed(None))
        self._seeds = {None: self._seed_none}
        self._init_lock()
        if isinstance(workers, (str, bytes)) or not hasattr(workers, "__iter__"):
            raise TypeError("workers must be an iterable of worker ids; got "
                            f"{type(workers).__name__}")
        ids = [worker_id(w) for w in workers]
        if len(set(ids)) != len(ids):
            raise ValueError("workers holds a worker id twice")
        for w in ids:
            self._register(w, self._column(w, True))

    _LOCK_STATE = ("_lock", "_no_readers", "_readers", "_writers_waiting", "_writing")

    def __getstate__(self):
        """Pickled and copied without its lock (a copy gets a fresh one)."""
        with self._lock:
            return {k: v for k, v in self.__dict__.items() if k not in self._LOCK_STATE}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("_syncing", {})  # pickled before syncing existed
        if "_ehash" not in self.__dict__:  # pickled before engine hashes were kept per node
            self.__dict__.update({"_eh_on": False, "_ehash": np.zeros(0, np.uint64),
                                  "_etable": np.zeros(0, np.int32)})
        self._init_lock()

    # ------------------------------------------------------------ state (state.py)
    export_state = state.export_state
    from_state = classmethod(state.from_state)

    # ------------------------------------------------------------ storage (storage.py)
    _alloc = storage._alloc
    _arrays = storage._arrays
    _node_bytes = storage._node_bytes
    _fixed_bytes = storage._fixed_bytes
    _node_budget = storage._node_budget
    _reserve = storage._reserve
    _forget = storage._forget
    _column = storage._column
    _register = storage._register
    _bit = staticmethod(storage._bit)
    _columns_changed = storage._columns_changed
    memory_report = storage.memory_report
    _new_handles = storage._new_handles
    _handle_room = storage._handle_room
    _handle_bytes = storage._handle_bytes
    _handle_put = storage._handle_put
    _handle_del = storage._handle_del
    _handle_note = storage._handle_note
    _ehash_on = storage._ehash_on
    _ehash_off = storage._ehash_off
    _slot_bytes = storage._slot_bytes
    _memory_bytes = storage._memory_bytes
    _fit = storage._fit

    # ------------------------------------------------------------ events (events.py)
    _parse = events._parse
    apply = events.apply
    apply_snapshot = events.apply_snapshot
    _seq_check = events._seq_check
    _apply_strict = events._apply_strict
    _apply_lenient = events._apply_lenient
    _apply_one = events._apply_one
    _keys_of = events._keys_of
    _apply_keys = events._apply_keys
    _tokens_of = events._tokens_of
    _seen_for = events._seen_for
    _extras = events._extras
    _undo = events._undo
    _add = events._add
    _drop_held = events._drop_held
    _clear = events._clear

    # ------------------------------------------------------------ wire batches (wire.py)
    apply_wire = wire.apply_wire
    read_wire = staticmethod(wire.decode)
    _wire_run = wire._run
    _wire_strict = wire._wire_strict
    _wire_lenient = wire._wire_lenient
    _undo_run = wire.undo_run
    _event_at = wire._event_at

    # ------------------------------------------------------------ workers (workers.py)
    add_worker = workers_.add_worker
    remove_worker = workers_.remove_worker
    status = workers_.status
    mark_degraded = workers_.mark_degraded
    mark_syncing = workers_.mark_syncing
    syncing = property(workers_.syncing)
    statuses = workers_.statuses
    degraded = property(workers_.degraded)

    # ------------------------------------------------------------ queries (queries.py)
    _page_keys = queries._page_keys
    _seed = queries._seed
    _query_seed = queries._query_seed
    _res_size = staticmethod(queries._res_size)
    overlap = queries.overlap
    overlap_scores = queries.overlap_scores
    overlap_report = queries.overlap_report
    overlap_batch = queries.overlap_batch
    blocks_of = queries.blocks_of

    # ------------------------------------------------------------ properties
    @property
    def page_size(self):
        return self._page

    @property
    def event_hash(self):
        """The page hash of the events this index takes (``"fast64"`` or
        ``"sha256_cbor"``)."""
        return self._event_hash

    @property
    def max_bytes(self):
        """The byte budget of the index's arrays (None: unbounded)."""
        return self._max_bytes

    @property
    def workers(self):
        """The registered worker ids, oldest first: the order of
        ``overlap``'s columns."""
        with self._lock:
            return list(self._order)

    def __len__(self):
        """Distinct pages some worker holds."""
        return int(self._meta[X_LIVE])

    def __contains__(self, worker):
        try:
            worker = worker_id(worker)
        except TypeError:
            return False
        with self._lock:
            return worker in self._cols

    def __repr__(self):
        h = "" if self._none_hash is None else ", event_hash='sha256_cbor'"
        b = "" if self._max_bytes is None else f", max_bytes={self._max_bytes}"
        return (f"RouterIndex(page_size={self._page}{h}{b}, workers={len(self._cols)}, "
                f"pages={len(self)})")
