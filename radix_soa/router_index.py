"""``RouterIndex``: which worker caches which pages, rebuilt from the
workers' KV events, and how many leading tokens of a request each holds.

What a cache-aware router (SGLang's gateway, NVIDIA Dynamo's KV router)
keeps: one node per page any worker caches, keyed by the page's chained
hash, with the set of workers holding it (a bitmask row, 64 workers a
word; more words as workers join). Built only from events
(``PrefixCache(events=True).take_events()``, or their dicts off the wire):
after a worker's events are applied in order, ``overlap(q)`` gives that
worker exactly its cache's ``match_length(q)``.
"""

import operator
from typing import NamedTuple

import numpy as np

from ._tree.base import ReadersWriter
from ._events.block_hash import block_hashes, check_event_hash, key64, none_hash
from ._kernels import router as router_kernels
from ._events.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored, EventError,
                         event_from_dict, namespace_seed)
from ._input.sequence import as_tokens
from ._input.validate import MAX_PAGE, check_int
from ._input.batch import as_batches

__all__ = ["RouterIndex", "OverlapReport"]

_BOOL = (bool, np.bool_)
_ADD, _DROP, _FORGOT = 0, 1, 2  # the kinds of a strict call's undo steps
MIN_BYTES = 4096  # the smallest max_bytes: room for a table and a few dozen pages


SEEDS_KEPT = 4096  # namespace seeds remembered per index


class OverlapReport(NamedTuple):
    """``RouterIndex.overlap_report``: the overlap of every registered
    worker (``overlap_scores``) and the workers among them whose pages are
    not known exactly (``RouterIndex.degraded``), read at one instant."""
    scores: dict
    degraded: frozenset
    syncing: frozenset = frozenset()  # not confirmed yet (``RouterIndex.syncing``)


def worker_id(worker):
    """``worker`` checked as a worker id: an int (a NumPy integer becomes
    one; not a bool), a str, or a tuple of those; ``TypeError`` otherwise
    (a float, NaN among them, is never equal to itself reliably).

    >>> worker_id(("gpu", 3)), worker_id(np.int64(2))
    (('gpu', 3), 2)
    """
    if isinstance(worker, str) or (type(worker) is int):
        return worker
    if isinstance(worker, tuple):
        return tuple(worker_id(w) for w in worker)
    if not isinstance(worker, (bool, np.bool_)):
        try:
            return operator.index(worker)
        except TypeError:
            pass
    raise TypeError("a worker id must be an int, a str or a tuple of them; got "
                    f"{type(worker).__name__} {worker!r}")


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

    ``event_hash`` is the hash the workers' events use (``PrefixCache``'s
    ``event_hash``): ``"fast64"`` (the default) or vLLM's ``"sha256_cbor"``
    with the engines' ``event_hash_seed`` (``PYTHONHASHSEED``). With
    ``sha256_cbor`` a block hash is 32 bytes (or vLLM's int form of it, its
    low 64 bits) and the index keys each block by those low 64 bits
    (``_block_hash.key64``): the same collision rule as ``fast64``, two
    blocks whose 32-byte hashes share the low 64 bits would be one node
    (about ``n**2 / 2**65`` for ``n`` blocks). ``overlap`` then hashes the
    query in Python, pages times a SHA-256 and a CBOR encoding (tens of
    microseconds for a 1,100-token request of 16-token pages), where
    ``fast64`` hashes in the kernel. A ``fast64`` index refuses bytes hashes.

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
        self._cols = {}        # worker id -> column
        self._col_ids = []     # column -> worker id (None: a free column)
        self._order = []       # the worker ids in the order they were registered
        self._out = slice(0, 0)  # their columns in a result row (a slice when in order)
        self._status = {}      # degraded worker id -> the first problem since it was exact
        self._seq = {}         # worker id -> the last seq applied
        self._syncing = {}     # worker id -> why its feed has not confirmed it yet
        self._forgotten = 0    # pages the budget forgot, since creation
        self._words = 1
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
        self._init_lock()

    # ------------------------------------------------------------ storage
    def _alloc(self, nodes, slots, old=None):
        """Fresh arrays of ``nodes`` nodes and ``slots`` table slots, holding
        the live nodes of ``old`` (compacted) and the table rebuilt."""
        keys = np.zeros(nodes, np.uint64)
        pkeys = np.zeros(nodes, np.uint64)
        flags = np.full(nodes, -1, np.int8)
        masks = np.zeros((nodes, self._words), np.int64)
        stamps = np.zeros(0 if self._max_bytes is None else nodes + 1, np.int64)
        meta = np.zeros(router_kernels.X_SIZE, np.int64)
        meta[router_kernels.X_FREE] = -1
        if old is not None:  # the live nodes, renumbered 0.. (free ids dropped)
            ids = np.flatnonzero(old["flags"][:int(old["meta"][router_kernels.X_END])] >= 0)
            n = ids.shape[0]
            keys[:n], pkeys[:n], flags[:n] = old["keys"][ids], old["pkeys"][ids], old["flags"][ids]
            masks[:n, :old["masks"].shape[1]] = old["masks"][ids]
            if stamps.shape[0]:
                stamps[:n] = old["stamps"][ids]
                stamps[-1] = old["stamps"][-1]  # the clock
            meta[router_kernels.X_END] = meta[router_kernels.X_LIVE] = n
        table = np.full(slots, -1, np.int32)
        router_kernels.rx_table_rebuild(table, keys, flags, int(meta[router_kernels.X_END]))
        self.__dict__.update({"_keys": keys, "_pkeys": pkeys, "_flags": flags, "_masks": masks,
                              "_stamps": stamps, "_meta": meta, "_table": table})

    def _arrays(self):
        return {"keys": self._keys, "pkeys": self._pkeys, "flags": self._flags,
                "masks": self._masks, "stamps": self._stamps, "meta": self._meta}

    def _node_bytes(self):
        """Bytes per node of the node arrays (keys, pkeys, flags, masks, stamps)."""
        return 17 + 8 * self._words + (0 if self._max_bytes is None else 8)

    def _fixed_bytes(self):
        return 8 * (router_kernels.X_SIZE + self._live.shape[0] + self._forgot.shape[0] + 1)

    def _node_budget(self):
        """The most nodes whose arrays (and a table at load <= 3/4) fit
        ``max_bytes`` (with this many mask words; cached)."""
        if self._budget_words == self._words:
            return self._budget_nodes
        room = self._max_bytes - self._fixed_bytes()
        per = self._node_bytes()
        best, slots = 0, 128
        while 4 * slots < room:
            best = max(best, min(3 * slots // 4, (room - 4 * slots) // per))
            slots *= 2
        self._budget_words, self._budget_nodes = self._words, best
        return best

    def _reserve(self, new):
        """Room for ``new`` more nodes (and their table slots, load <= 3/4);
        with a budget, at most ``_node_budget()`` nodes, forgetting the
        least recently used pages to make room (``new`` is within it)."""
        meta = self._meta
        cap = None if self._max_bytes is None else self._node_budget()
        if cap is not None and int(meta[router_kernels.X_LIVE]) + new > cap:
            live = int(meta[router_kernels.X_LIVE])
            self._forget(live + new - cap + cap // 16)  # a sixteenth more: amortized
        live = int(meta[router_kernels.X_LIVE])
        nodes = self._keys.shape[0]
        ids = max(int(meta[router_kernels.X_END]), live + new)  # free ids are reused first
        if ids <= nodes and 4 * (live + new) <= 3 * self._table.shape[0]:
            return
        # nodes grow by a quarter (each copy compacts them), the table doubles
        size = max(nodes, ids, 64)
        if ids > nodes:
            size = max(ids, nodes + nodes // 4)
        slots = self._table.shape[0]
        while 4 * (live + new) > 3 * slots:
            slots *= 2
        if cap is not None:
            size = min(size, cap)  # the copy renumbers the live nodes: live + new <= cap
        self._alloc(size, slots, self._arrays())

    def _forget(self, n):
        """Forget the ``n`` live pages queries walked least recently, for
        every worker (the budget)."""
        end = int(self._meta[router_kernels.X_END])
        ids = np.flatnonzero(self._flags[:end] >= 0)
        n = min(n, ids.shape[0])
        if n <= 0:
            return
        if n < ids.shape[0]:
            ids = ids[np.argpartition(self._stamps[ids], n - 1)[:n]]
        router_kernels.rx_forget(self._table, self._keys, self._flags, self._masks, self._meta,
                     ids.astype(np.int64), self._forgot)
        self._forgotten += n

    def _column(self, worker, create):
        """The column of ``worker`` (a checked id); with ``create``, a free
        column for a new one (taken by ``_register`` once its events applied)."""
        col = self._cols.get(worker)
        if col is not None or not create:
            return col
        col = next((c for c, w in enumerate(self._col_ids) if w is None), len(self._col_ids))
        if col == len(self._col_ids):
            self._col_ids.append(None)
        if col >= 64 * self._words:  # another word of bits per node
            self._words += 1
            self._live = np.concatenate([self._live, np.zeros(1, np.int64)])
            self._forgot = np.concatenate([self._forgot, np.zeros(64, np.int64)])
            nodes = self._keys.shape[0]
            if self._max_bytes is not None:  # wider rows: fewer of them fit
                cap = self._node_budget()
                if int(self._meta[router_kernels.X_LIVE]) > cap:
                    self._forget(int(self._meta[router_kernels.X_LIVE]) - cap)
                nodes = min(nodes, cap)
            self._alloc(nodes, self._table.shape[0], self._arrays())
        self._forgot[col] = 0  # a fresh column (its events may add to it before _register)
        return col

    def _register(self, worker, col):
        self._cols[worker] = col
        self._col_ids[col] = worker
        self._order.append(worker)
        w, bit = self._bit(col)
        self._live[w] |= bit
        self._columns_changed()

    @staticmethod
    def _bit(col):
        """``(word, bit)`` of column ``col``: the bit as an int64 (bit 63 negative)."""
        b = col % 64  # a Python int: Numba unboxes it faster than a NumPy scalar
        return col // 64, -(1 << 63) if b == 63 else 1 << b

    # ------------------------------------------------------------ events
    def _parse(self, events):
        if isinstance(events, (dict, BlockStored, BlockRemoved, AllBlocksCleared)):
            events = [events]
        parsed = []
        for i, e in enumerate(events):
            try:
                e = event_from_dict(e)
            except EventError as exc:
                raise EventError(f"event {i}: {exc}") from None
            if isinstance(e, BlockStored) and e.block_size != self._page:
                raise EventError(f"event {i}: block_size {e.block_size} but this index has "
                                 f"page_size {self._page}")
            if (self._none_hash is None and not isinstance(e, AllBlocksCleared) and e.block_hashes
                    and isinstance(e.block_hashes[0], bytes)):
                raise EventError(f"event {i}: bytes block hashes, but this index has "
                                 "event_hash='fast64' (make it with event_hash='sha256_cbor')")
            parsed.append(e)
        return parsed

    def apply(self, worker, events, *, strict=None, seq=None):
        """Apply ``events`` (``BlockStored``/``BlockRemoved``/
        ``AllBlocksCleared`` objects or their dicts) that ``worker`` emitted,
        oldest first; a new worker id joins the index (also with no
        events). ``strict`` (default: the index's): all or nothing,
        ``EventError`` on the first event that cannot apply, with every
        change undone (a new worker not registered); ``strict=False``: the
        worker becomes degraded instead and the events apply as far as they
        can (see the class). ``seq``: this call's number in the worker's
        stream (a duplicate is skipped, a gap is a problem).

        >>> import radix_soa as rs
        >>> ix = rs.RouterIndex(page_size=2, strict=False)
        >>> ix.apply("w", [rs.BlockRemoved([7])], seq=0)   # a block it never held
        >>> ix.status("w"), ix.apply("w", [], seq=0), list(ix.degraded)
        ('degraded', None, ['w'])
        """
        worker = worker_id(worker)
        if strict is None:
            strict = self._strict
        elif not isinstance(strict, _BOOL):
            raise TypeError(f"strict must be a bool or None; got {type(strict).__name__}")
        if seq is not None:
            seq = check_int("seq", seq, minimum=0)
        parsed = self._parse(events)
        with self._writing:
            last = self._seq.get(worker)
            if seq is not None and last is not None and seq <= last:
                return  # a duplicate (or a batch older than one applied): skipped
            gap = None
            if seq is not None and last is not None and seq != last + 1:
                gap = (f"seq {seq}: calls {last + 1}..{seq - 1} of worker {worker!r} never "
                       "arrived")
                if strict:
                    raise EventError(gap)
            new = worker not in self._cols
            col = self._column(worker, True)
            if strict:
                undo = []
                try:
                    for i, e in enumerate(parsed):
                        self._apply_one(i, col, worker, e, undo)
                except BaseException:
                    self._undo(undo)
                    if new:
                        self._col_ids[col] = None
                    raise
            else:
                problem = self._status.get(worker, gap)
                try:
                    for i, e in enumerate(parsed):
                        found = self._apply_one(i, col, worker, e, None)
                        if isinstance(e, AllBlocksCleared):
                            problem = None
                        elif problem is None:
                            problem = found
                except BaseException:  # some events applied, not all: not exact
                    self._status[worker] = (f"an apply of {len(parsed)} events was interrupted "
                                            "(KeyboardInterrupt, MemoryError)")
                    if new:
                        self._register(worker, col)
                    raise
                if problem is None:
                    self._status.pop(worker, None)
                else:
                    self._status[worker] = problem
            if new:
                self._register(worker, col)
            if seq is not None:
                self._seq[worker] = seq

    def apply_snapshot(self, worker, events, *, seq=None):
        """Replace every page of ``worker`` by ``events``, stored runs parents
        first (``PrefixCache.snapshot_events()``: its cache now), and mark it
        exact. All or nothing: a snapshot whose events do not apply as a
        stream after a clear raises ``EventError`` and changes nothing.
        ``seq``: the worker's last call number the snapshot covers (later
        calls continue from it).

        >>> import radix_soa as rs
        >>> pc = rs.PrefixCache(page_size=2, events=True, values=False)
        >>> _ = pc.insert([1, 2, 3, 4]); _ = pc.take_events()     # lost on the way
        >>> ix = rs.RouterIndex(page_size=2, strict=False)
        >>> _ = pc.insert([1, 2, 3, 4, 5, 6]); ix.apply("w", pc.take_events())
        >>> ix.status("w"), ix.overlap([1, 2, 3, 4, 5, 6]).tolist()
        ('degraded', [0])
        >>> ix.apply_snapshot("w", pc.snapshot_events())
        >>> ix.status("w"), ix.overlap([1, 2, 3, 4, 5, 6]).tolist()
        ('exact', [6])
        """
        worker = worker_id(worker)
        if seq is not None:
            seq = check_int("seq", seq, minimum=0)
        parsed = [AllBlocksCleared()] + self._parse(events)
        with self._writing:
            new = worker not in self._cols
            col = self._column(worker, True)
            undo = []
            try:
                for i, e in enumerate(parsed):
                    self._apply_one(i - 1, col, worker, e, undo)
            except BaseException:
                self._undo(undo)
                if new:
                    self._col_ids[col] = None
                raise
            if new:
                self._register(worker, col)
            self._status.pop(worker, None)
            if seq is not None:
                self._seq[worker] = seq
            else:
                self._seq.pop(worker, None)

    def _apply_one(self, i, col, worker, e, undo):
        """Apply event ``e`` (the ``i``-th of the call) for ``worker``:
        strict (``undo`` a list: raise on a problem, log the undo steps)
        or lenient (``undo`` None: return the problem, or None)."""
        w, bit = self._bit(col)
        if isinstance(e, AllBlocksCleared):
            self._clear(w, bit, undo)
            forgot = int(self._forgot[col])
            self._forgot[col] = 0
            if undo is not None:
                undo.append((_FORGOT, col, forgot))
            return None
        hashes = self._keys_of(e.block_hashes)
        n = hashes.shape[0]
        codes = np.empty(n, np.int8)
        stored = isinstance(e, BlockStored)
        has_parent = stored and e.parent_block_hash is not None
        parent = np.uint64(key64(e.parent_block_hash) if has_parent else 0)
        cap = None if self._max_bytes is None else self._node_budget()
        # the common event in one kernel call: every page applies as it is
        if not stored:
            parents = np.empty(n, np.uint64)
            hasp = np.empty(n, np.int8)
            if router_kernels.rx_remove(self._table, self._keys, self._pkeys, self._flags, self._masks,
                            self._meta, w, bit, hashes, codes, parents, hasp) < 0:
                if undo is not None:
                    undo.append((_ADD, w, bit, hashes, parents, hasp))
                return None
        elif cap is None or n <= cap:
            self._reserve(n)
            where, bad = router_kernels.rx_store(self._table, self._keys, self._pkeys, self._flags,
                                     self._masks, self._meta, w, bit, hashes, parent, has_parent,
                                     self._stamps, codes)
            if where == router_kernels.P_HELD and bad < 0:
                if undo is not None:
                    undo.append((_DROP, w, bit, hashes))
                return None
        where = router_kernels.rx_classify(self._table, self._keys, self._pkeys, self._flags, self._masks,
                               w, bit, hashes, parent, has_parent, stored, codes)
        forgot = int(self._forgot[col])
        if not stored:
            # a removal of a page the budget forgot: gone from the index, or
            # stored again since by other workers only
            unheld = (codes == router_kernels.C_ABSENT) | (codes == router_kernels.C_UNHELD)
            excused = min(int(np.count_nonzero(unheld)), forgot)
            problem = None
            bad = np.flatnonzero(codes == router_kernels.C_REPEAT)
            if excused < np.count_nonzero(unheld) or bad.shape[0]:
                at = int(np.flatnonzero(unheld | (codes == router_kernels.C_REPEAT))[0])
                problem = (f"event {i}: BlockRemoved of block {e.block_hashes[at]}, which worker "
                           f"{worker!r} does not hold")
                if undo is not None:
                    raise EventError(problem)
            self._forgot[col] = forgot - excused
            held = hashes[codes == router_kernels.C_OK]
            parents = np.empty(held.shape[0], np.uint64)
            hasp = np.empty(held.shape[0], np.int8)
            router_kernels.rx_drop(self._table, self._keys, self._pkeys, self._flags, self._masks,
                       self._meta, w, bit, held, parents, hasp)
            if undo is not None:
                undo.append((_FORGOT, col, forgot))
                undo.append((_ADD, w, bit, held, parents, hasp))
            return problem
        problem = None
        if where != router_kernels.P_HELD and forgot == 0:  # else: under a page the budget forgot?
            problem = (f"event {i}: BlockStored: its parent block {e.parent_block_hash} is not "
                       f"held by worker {worker!r} (an event missed or applied out of order)")
        else:
            bad = np.flatnonzero(codes != router_kernels.C_OK)
            if bad.shape[0]:
                at = int(bad[0])
                block = e.block_hashes[at]
                problem = (f"event {i}: BlockStored: " + (
                    f"block {block} is held by worker {worker!r} already (an event applied "
                    "twice?)" if codes[at] == router_kernels.C_HELD else
                    f"block {block} is known with another parent block (another hash "
                    "function or page size?)"))
        if problem is not None and undo is not None:
            raise EventError(problem)
        parents = np.empty(hashes.shape[0], np.uint64)
        hasp = np.ones(hashes.shape[0], np.int8)
        if hashes.shape[0]:
            parents[0] = parent
            parents[1:] = hashes[:-1]
            hasp[0] = 1 if has_parent else 0
        keep = codes == router_kernels.C_OK
        hashes, parents, hasp = hashes[keep], parents[keep], hasp[keep]
        if cap is not None and hashes.shape[0] > cap:  # a run past the budget: its tail forgotten
            self._forgot[col] += hashes.shape[0] - cap
            self._forgotten += hashes.shape[0] - cap
            hashes, parents, hasp = hashes[:cap], parents[:cap], hasp[:cap]
        self._add(w, bit, hashes, parents, hasp)
        if undo is not None:
            undo.append((_FORGOT, col, forgot))
            undo.append((_DROP, w, bit, hashes))
        return problem

    def _keys_of(self, block_hashes):
        """The 64-bit keys of an event's (checked) block hashes."""
        if self._none_hash is None:  # ints in [0, 2**64) already
            return np.array(block_hashes, np.uint64)
        return np.array([key64(h) for h in block_hashes], np.uint64)

    def _undo(self, steps):
        """Undo a strict call's steps, last first. They are tuples, not
        closures: a call of many events keeps no objects the cyclic
        garbage collector would scan again and again."""
        for step in reversed(steps):
            kind = step[0]
            if kind == _ADD:
                self._add(*step[1:])
            elif kind == _DROP:
                self._drop_held(*step[1:])
            else:
                self._forgot[step[1]] = step[2]

    def _add(self, w, bit, hashes, parents, hasp):
        self._reserve(hashes.shape[0])
        router_kernels.rx_add(self._table, self._keys, self._pkeys, self._flags, self._masks, self._meta, w,
                  bit, hashes, parents, hasp, self._stamps)

    def _drop_held(self, w, bit, hashes):
        """Take from worker ``(w, bit)`` those of ``hashes`` it still holds
        (an undo: the budget may have forgotten some meanwhile)."""
        codes = np.empty(hashes.shape[0], np.int8)
        router_kernels.rx_classify(self._table, self._keys, self._pkeys, self._flags, self._masks, w, bit,
                       hashes, np.uint64(0), False, False, codes)
        held = hashes[codes == router_kernels.C_OK]
        parents = np.empty(held.shape[0], np.uint64)
        hasp = np.empty(held.shape[0], np.int8)
        router_kernels.rx_drop(self._table, self._keys, self._pkeys, self._flags, self._masks, self._meta, w,
                   bit, held, parents, hasp)

    def _clear(self, w, bit, undo=None):
        live = int(self._meta[router_kernels.X_LIVE])
        out = np.empty(live, np.uint64)
        parents = np.empty(live, np.uint64)
        hasp = np.empty(live, np.int8)
        n = router_kernels.rx_clear(self._table, self._keys, self._pkeys, self._flags, self._masks,
                        self._meta, w, bit, out, parents, hasp)
        if undo is not None:
            undo.append((_ADD, w, bit, out[:n], parents[:n], hasp[:n]))

    def add_worker(self, worker):
        """Register ``worker`` (nothing cached yet) as the last of
        ``workers``; a worker already registered stays where it is."""
        worker = worker_id(worker)
        with self._writing:
            if worker not in self._cols:
                self._register(worker, self._column(worker, True))

    def remove_worker(self, worker):
        """Forget ``worker`` and every page it holds (``KeyError`` if unknown)."""
        worker = worker_id(worker)
        with self._writing:
            col = self._cols.get(worker)
            if col is None:
                raise KeyError(f"worker {worker!r} is not in the index")
            w, bit = self._bit(col)
            self._clear(w, bit)
            del self._cols[worker]
            self._col_ids[col] = None
            self._order.remove(worker)
            self._status.pop(worker, None)
            self._seq.pop(worker, None)
            self._syncing.pop(worker, None)
            self._live[w] &= ~bit
            self._columns_changed()

    def _columns_changed(self):
        keep = [self._cols[w] for w in self._order]
        n = len(keep)
        self._out = slice(0, n) if keep == list(range(n)) else np.array(keep, np.intp)

    # ------------------------------------------------------------ status
    def status(self, worker):
        """``"exact"`` (every event since the worker's last clear or
        snapshot applied), ``"degraded"`` (one could not: its pages are
        what the index could apply) or ``"syncing"`` (its feed has not
        confirmed it yet: ``mark_syncing``); ``KeyError`` for an unknown
        worker."""
        worker = worker_id(worker)
        with self._lock:
            if worker not in self._cols:
                raise KeyError(f"worker {worker!r} is not in the index")
            if worker in self._status:
                return "degraded"
            return "syncing" if worker in self._syncing else "exact"

    def mark_syncing(self, worker, reason=None):
        """Mark ``worker`` syncing because of ``reason`` (a str: its feed has
        not confirmed its pages yet, such as a replay under way), or, with
        ``reason=None``, confirmed again. Its pages stay; ``status`` says
        ``"degraded"`` while it is degraded too. ``KeyError`` for an
        unknown worker.

        >>> import radix_soa as rs
        >>> ix = rs.RouterIndex(page_size=2, workers=["w"])
        >>> ix.mark_syncing("w", "replaying from 0"); ix.status("w"), ix.syncing
        ('syncing', {'w': 'replaying from 0'})
        >>> ix.mark_syncing("w", None); ix.status("w")
        'exact'
        """
        worker = worker_id(worker)
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"reason must be a str or None; got {type(reason).__name__}")
        with self._writing:
            if worker not in self._cols:
                raise KeyError(f"worker {worker!r} is not in the index")
            if reason is None:
                self._syncing.pop(worker, None)
            else:
                self._syncing[worker] = reason

    @property
    def syncing(self):
        """The syncing workers, in registration order: a dict from worker id
        to why (``mark_syncing``)."""
        with self._lock:
            return {w: self._syncing[w] for w in self._order if w in self._syncing}

    def statuses(self):
        """Every worker's ``(status, reason)``, in registration order, at one
        instant (``reason`` None for an exact worker).

        >>> import radix_soa as rs
        >>> rs.RouterIndex(page_size=2, workers=["w"]).statuses()
        {'w': ('exact', None)}
        """
        with self._lock:
            out = {}
            for w in self._order:
                if w in self._status:
                    out[w] = ("degraded", self._status[w])
                elif w in self._syncing:
                    out[w] = ("syncing", self._syncing[w])
                else:
                    out[w] = ("exact", None)
            return out

    def mark_degraded(self, worker, problem):
        """Mark ``worker`` degraded because of ``problem`` (a str: an event
        its feed lost, such as a malformed batch off the wire); its pages
        stay. A worker already degraded keeps its first problem. It is exact
        again after an ``AllBlocksCleared`` or ``apply_snapshot``;
        ``KeyError`` for an unknown worker.

        >>> import radix_soa as rs
        >>> ix = rs.RouterIndex(page_size=2, workers=["w"])
        >>> ix.mark_degraded("w", "batch 7 unreadable"); ix.degraded
        {'w': 'batch 7 unreadable'}
        """
        worker = worker_id(worker)
        if not isinstance(problem, str):
            raise TypeError(f"problem must be a str; got {type(problem).__name__}")
        with self._writing:
            if worker not in self._cols:
                raise KeyError(f"worker {worker!r} is not in the index")
            self._status.setdefault(worker, problem)

    @property
    def degraded(self):
        """The degraded workers, in registration order: a dict from worker
        id to the first problem since it was last exact (``in``, ``len``
        and iteration read it as the set of them)."""
        with self._lock:
            return {w: self._status[w] for w in self._order if w in self._status}

    def memory_report(self):
        """The index's arrays in bytes: ``bytes`` (all of them, as
        allocated), ``bytes_per_page`` (that over the pages held),
        ``pages``, ``workers``, ``mask_words`` (64 workers a word),
        ``node_capacity``, ``table_slots``, ``max_bytes`` (None: unbounded),
        ``forgotten_pages`` (by the budget, since creation) and ``arrays``
        (bytes by array).

        >>> import radix_soa as rs
        >>> r = rs.RouterIndex(page_size=4, max_bytes=1 << 16).memory_report()
        >>> r["bytes"] <= r["max_bytes"], r["pages"], r["mask_words"]
        (True, 0, 1)
        """
        with self._lock:
            arrays = {"keys": self._keys, "pkeys": self._pkeys, "flags": self._flags,
                      "masks": self._masks, "stamps": self._stamps, "table": self._table,
                      "meta": self._meta, "live": self._live, "forgot": self._forgot}
            sizes = {k: int(a.nbytes) for k, a in arrays.items()}
            total = sum(sizes.values())
            pages = int(self._meta[router_kernels.X_LIVE])
            return {"bytes": total, "bytes_per_page": total / pages if pages else 0.0,
                    "pages": pages, "workers": len(self._order), "mask_words": self._words,
                    "node_capacity": int(self._keys.shape[0]),
                    "table_slots": int(self._table.shape[0]), "max_bytes": self._max_bytes,
                    "forgotten_pages": self._forgotten, "arrays": sizes}

    # ------------------------------------------------------------ queries
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

    def _page_keys(self, q, namespace):
        """``sha256_cbor``: the 64-bit keys of the whole pages of ``q``."""
        if namespace is None:
            namespace = 0
        if not (isinstance(namespace, str) or type(namespace) is int):
            namespace = operator.index(namespace)  # the _seed check named the type already
        hs = block_hashes(q.tolist(), self._page, None, namespace, self._none_hash)
        return np.array([key64(h) for h in hs], np.uint64)

    @property
    def workers(self):
        """The registered worker ids, oldest first: the order of
        ``overlap``'s columns."""
        with self._lock:
            return list(self._order)

    def __len__(self):
        """Distinct pages some worker holds."""
        return int(self._meta[router_kernels.X_LIVE])

    def __contains__(self, worker):
        try:
            worker = worker_id(worker)
        except TypeError:
            return False
        with self._lock:
            return worker in self._cols

    def _seed(self, namespace):
        try:
            return self._seeds[namespace]
        except (KeyError, TypeError):
            seed = None
        if seed is None:
            if not (namespace is None or isinstance(namespace, str)):
                try:
                    operator.index(namespace)
                except TypeError:
                    raise TypeError("a namespace must be an int or a str; got "
                                    f"{type(namespace).__name__}") from None
            seed = np.uint64(namespace_seed(namespace))
            # remembered for the namespaces seen first (a service's callers can send
            # any number of new ones: the rest are hashed again each time)
            if type(namespace) in (int, str) and len(self._seeds) < SEEDS_KEPT:
                self._seeds[namespace] = seed
        return seed

    @staticmethod
    def _res_size(words):
        """The row ``overlap_at`` fills: 64 columns a word, then its scratch."""
        return 65 * words + 2 * router_kernels.GROUP

    def overlap(self, tokens, namespace=None):
        """Per worker (``workers`` order), the leading tokens of ``tokens``
        whose whole pages it caches under ``namespace``: an int64 array."""
        q = as_tokens(tokens)
        seed = self._seed_none if namespace is None else self._seed(namespace)
        hkeys = self._no_keys if self._none_hash is None else self._page_keys(q, namespace)
        with self._lock:  # the kernel holds the GIL: the lock keeps out a half-done apply
            res = np.empty(self._res_size(self._words), np.int64)
            router_kernels.rx_overlap(self._table, self._keys, self._masks, q, self._page, seed, self._live,
                          res, hkeys, self._stamps)
            return res[self._out]

    def overlap_scores(self, tokens, namespace=None):
        """``overlap`` as a dict from worker id to the leading tokens of
        ``tokens`` it caches (every registered worker, 0 included), as
        Dynamo's ``OverlapScores``.

        >>> import radix_soa as rs
        >>> ix = rs.RouterIndex(page_size=2, workers=[("w", 1), ("w", 0)])
        >>> ix.overlap_scores([1, 2])
        {('w', 1): 0, ('w', 0): 0}
        """
        with self._lock:  # one instant: the columns and the order they are read in
            return dict(zip(self._order, self.overlap(tokens, namespace).tolist()))

    def overlap_report(self, tokens, namespace=None):
        """``overlap_scores``, the degraded workers and the syncing ones
        among them, at one instant: an ``OverlapReport(scores, degraded,
        syncing)``.

        >>> import radix_soa as rs
        >>> ix = rs.RouterIndex(page_size=2, workers=[0, 1], strict=False)
        >>> ix.apply(1, [rs.BlockRemoved([5])])
        >>> ix.overlap_report([1, 2])
        OverlapReport(scores={0: 0, 1: 0}, degraded=frozenset({1}), syncing=frozenset())
        """
        with self._lock:
            return OverlapReport(self.overlap_scores(tokens, namespace),
                                 frozenset(self._status),
                                 frozenset(w for w in self._syncing if w not in self._status))

    def overlap_batch(self, batch, namespace=None):
        """``overlap`` of every sequence of ``batch`` (anything ``rs.pack``
        takes): an int64 array of requests x workers."""
        seed = self._seed(namespace)
        batches = list(as_batches(batch))
        if self._none_hash is not None:  # hashed here, row by row, then read at one instant
            rows = [b.flat[b.offsets[i]:b.offsets[i + 1]] for b in batches
                    for i in range(len(b))]
            keys = [self._page_keys(q, namespace) for q in rows]
            with self._lock:
                res = np.empty((len(rows), self._res_size(self._words)), np.int64)
                for i, q in enumerate(rows):
                    router_kernels.rx_overlap(self._table, self._keys, self._masks, q, self._page, seed,
                                  self._live, res[i], keys[i], self._stamps)
                return res[:, self._out]

        def run():  # registered: no writer changes the arrays until it returns
            words, out = self._words, self._out
            parts = []
            for b in batches:
                res = np.empty((len(b), self._res_size(words)), np.int64)
                router_kernels.rx_overlap_batch(self._table, self._keys, self._masks, b.flat, b.offsets,
                                    self._page, seed, self._live, res, self._no_keys,
                                    self._stamps)
                parts.append(res[:, out])
            if not parts:
                return np.zeros((0, len(self._cols)), np.int64)
            return np.concatenate(parts) if len(parts) > 1 else parts[0]

        return self._read_released(run)

    def blocks_of(self, worker):
        """The page hashes ``worker`` holds, sorted (for audits and tests)."""
        worker = worker_id(worker)
        with self._lock:
            col = self._cols.get(worker)
            if col is None:
                raise KeyError(f"worker {worker!r} is not in the index")
            w, bit = self._bit(col)
            end = int(self._meta[router_kernels.X_END])
            held = (self._flags[:end] >= 0) & ((self._masks[:end, w] & bit) != 0)
            return sorted(self._keys[:end][held].tolist())

    def __repr__(self):
        h = "" if self._none_hash is None else ", event_hash='sha256_cbor'"
        b = "" if self._max_bytes is None else f", max_bytes={self._max_bytes}"
        return (f"RouterIndex(page_size={self._page}{h}{b}, workers={len(self._cols)}, "
                f"pages={len(self)})")
