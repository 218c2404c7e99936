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

import numpy as np

from ._tree.base import ReadersWriter
from ._events.block_hash import block_hashes, check_event_hash, key64, none_hash
from ._kernels import router as router_kernels
from ._events.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored, EventError,
                         event_from_dict, namespace_seed)
from ._input.sequence import as_tokens
from ._input.validate import MAX_PAGE, check_int
from ._input.batch import as_batches

__all__ = ["RouterIndex"]

_MESSAGES = {
    router_kernels.E_PARENT: "its parent block {parent} is not held by worker {worker!r} (an "
                             "event missed or applied out of order)",
    router_kernels.E_HELD: "block {block} is held by worker {worker!r} already (an event "
                           "applied twice?)",
    router_kernels.E_MISMATCH: "block {block} is known with another parent block (another "
                               "hash function or page size?)",
}


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
    emitted them, as objects or dicts. Every check comes before any change:
    an event of another page size, a stored run whose parent block the
    worker does not hold (an event missed or out of order), a block stored
    twice, a removed block the worker does not hold, or a malformed event
    raises ``EventError`` (a ``ValueError``) naming the event and the
    problem, and the index is left exactly as it was (the events of the
    call applied before it are undone). Hashes are trusted as page
    identities: two different pages with one 64-bit hash would be one node.

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
    sees every ``apply`` entirely or not at all.
    """

    def __init__(self, page_size=16, *, workers=(), event_hash="fast64",
                 event_hash_seed=None):
        self._page = check_int("page_size", page_size, minimum=1, maximum=MAX_PAGE)
        self._event_hash = check_event_hash(event_hash)
        self._none_hash = none_hash(event_hash_seed) if event_hash == "sha256_cbor" else None
        self._no_keys = np.empty(0, np.uint64)  # overlap's hkeys: the kernel hashes
        self._cols = {}        # worker id -> column
        self._col_ids = []     # column -> worker id (None: a free column)
        self._order = []       # the worker ids in the order they were registered
        self._out = slice(0, 0)  # their columns in a result row (a slice when in order)
        self._words = 1
        self._live = np.zeros(1, np.int64)  # bitmask of the live columns
        self._alloc(64, 128)
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
        self._init_lock()

    # ------------------------------------------------------------ storage
    def _alloc(self, nodes, slots, old=None):
        keys = np.zeros(nodes, np.uint64)
        pkeys = np.zeros(nodes, np.uint64)
        flags = np.full(nodes, -1, np.int8)
        masks = np.zeros((nodes, self._words), np.int64)
        meta = np.zeros(router_kernels.X_SIZE, np.int64)
        meta[router_kernels.X_FREE] = -1
        if old is not None:
            end = int(old["meta"][router_kernels.X_END])
            keys[:end], pkeys[:end], flags[:end] = (old["keys"][:end], old["pkeys"][:end],
                                                    old["flags"][:end])
            masks[:end, :old["masks"].shape[1]] = old["masks"][:end]
            meta[:] = old["meta"]
        table = np.full(slots, -1, np.int32)
        router_kernels.rx_table_rebuild(table, keys, flags, int(meta[router_kernels.X_END]))
        self.__dict__.update({"_keys": keys, "_pkeys": pkeys, "_flags": flags, "_masks": masks,
                              "_meta": meta, "_table": table})

    def _arrays(self):
        return {"keys": self._keys, "pkeys": self._pkeys, "flags": self._flags,
                "masks": self._masks, "meta": self._meta}

    def _reserve(self, new):
        """Room for ``new`` more nodes (and their table slots, load <= 1/2)."""
        meta = self._meta
        live = int(meta[router_kernels.X_LIVE])
        nodes = self._keys.shape[0]
        ids = max(int(meta[router_kernels.X_END]), live + new)  # free ids are reused first
        if ids <= nodes and 2 * (live + new) <= self._table.shape[0]:
            return
        size = max(nodes, 64)
        while size < ids:
            size *= 2
        slots = self._table.shape[0]
        while slots < 2 * (live + new):
            slots *= 2
        self._alloc(size, slots, self._arrays())

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
            self._alloc(self._keys.shape[0], self._table.shape[0], self._arrays())
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
        return col // 64, np.array([1 << (col % 64)], np.uint64).view(np.int64)[0]

    # ------------------------------------------------------------ events
    def apply(self, worker, events):
        """Apply ``events`` (``BlockStored``/``BlockRemoved``/
        ``AllBlocksCleared`` objects or their dicts) that ``worker`` emitted,
        oldest first; a new worker id joins the index (also with no
        events). All or nothing: ``EventError`` on the first bad event, with
        every change undone (a new worker not registered)."""
        worker = worker_id(worker)
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
        with self._writing:
            new = worker not in self._cols
            col = self._column(worker, True)
            undo = []
            try:
                for i, e in enumerate(parsed):
                    self._apply_one(i, col, worker, e, undo)
            except BaseException:
                for step in reversed(undo):
                    step()
                if new:
                    self._col_ids[col] = None
                raise
            if new:
                self._register(worker, col)

    def _apply_one(self, i, col, worker, e, undo):
        w, bit = self._bit(col)
        k, t, f, m, meta = self._keys, self._pkeys, self._flags, self._masks, self._meta
        if isinstance(e, AllBlocksCleared):
            self._clear(w, bit, undo)
            return
        hashes = np.array([key64(h) for h in e.block_hashes], np.uint64)
        if isinstance(e, BlockRemoved):
            bad = router_kernels.rx_check_remove(self._table, k, m, w, bit, hashes)
            if bad >= 0:
                raise EventError(f"event {i}: BlockRemoved of block {e.block_hashes[bad]}, which "
                                 f"worker {worker!r} does not hold")
            parents = np.empty(hashes.shape[0], np.uint64)
            hasp = np.empty(hashes.shape[0], np.int8)
            router_kernels.rx_drop(self._table, k, t, f, m, meta, w, bit, hashes, parents, hasp)
            undo.append(lambda: self._add(w, bit, hashes, parents, hasp))
            return
        has_parent = e.parent_block_hash is not None
        parent = np.uint64(key64(e.parent_block_hash) if has_parent else 0)
        status, at = router_kernels.rx_check_store(self._table, k, t, f, m, w, bit, hashes, parent,
                                       has_parent)
        if status != router_kernels.OK:
            raise EventError(f"event {i}: BlockStored: " + _MESSAGES[status].format(
                parent=e.parent_block_hash, worker=worker,
                block=e.block_hashes[at] if len(e.block_hashes) else None))
        parents = np.empty(hashes.shape[0], np.uint64)
        if hashes.shape[0]:
            parents[0] = parent
            parents[1:] = hashes[:-1]
        hasp = np.ones(hashes.shape[0], np.int8)
        if hashes.shape[0]:
            hasp[0] = 1 if has_parent else 0
        self._add(w, bit, hashes, parents, hasp)
        undo.append(lambda: self._drop(w, bit, hashes))

    def _add(self, w, bit, hashes, parents, hasp):
        self._reserve(hashes.shape[0])
        router_kernels.rx_add(
            self._table,
            self._keys,
            self._pkeys,
            self._flags,
            self._masks,
            self._meta,
            w,
            bit,
            hashes,
            parents,
            hasp,
        )

    def _drop(self, w, bit, hashes):
        parents = np.empty(hashes.shape[0], np.uint64)
        hasp = np.empty(hashes.shape[0], np.int8)
        router_kernels.rx_drop(
            self._table,
            self._keys,
            self._pkeys,
            self._flags,
            self._masks,
            self._meta,
            w,
            bit,
            hashes,
            parents,
            hasp,
        )

    def _clear(self, w, bit, undo=None):
        live = int(self._meta[router_kernels.X_LIVE])
        out = np.empty(live, np.uint64)
        parents = np.empty(live, np.uint64)
        hasp = np.empty(live, np.int8)
        n = router_kernels.rx_clear(self._table, self._keys, self._pkeys, self._flags, self._masks,
                        self._meta, w, bit, out, parents, hasp)
        if undo is not None:
            undo.append(lambda: self._add(w, bit, out[:n], parents[:n], hasp[:n]))

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
            self._live[w] &= ~bit
            self._columns_changed()

    def _columns_changed(self):
        keep = [self._cols[w] for w in self._order]
        n = len(keep)
        self._out = slice(0, n) if keep == list(range(n)) else np.array(keep, np.intp)

    # ------------------------------------------------------------ queries
    @property
    def page_size(self):
        return self._page

    @property
    def event_hash(self):
        """The page hash of the events this index takes (``"fast64"`` or
        ``"sha256_cbor"``)."""
        return self._event_hash

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
            if type(namespace) in (int, str):
                self._seeds[namespace] = seed
        return seed

    def overlap(self, tokens, namespace=None):
        """Per worker (``workers`` order), the leading tokens of ``tokens``
        whose whole pages it caches under ``namespace``: an int64 array."""
        q = as_tokens(tokens)
        seed = self._seed_none if namespace is None else self._seed(namespace)
        hkeys = self._no_keys if self._none_hash is None else self._page_keys(q, namespace)
        with self._lock:  # the kernel holds the GIL: the lock keeps out a half-done apply
            res = np.empty(65 * self._words, np.int64)
            router_kernels.rx_overlap(
                self._table, self._keys, self._masks, q, self._page, seed, self._live, res, hkeys
            )
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
                res = np.empty((len(rows), 65 * self._words), np.int64)
                for i, q in enumerate(rows):
                    router_kernels.rx_overlap(
                        self._table,
                        self._keys,
                        self._masks,
                        q,
                        self._page,
                        seed,
                        self._live,
                        res[i],
                        keys[i],
                    )
                return res[:, self._out]

        def run():  # registered: no writer changes the arrays until it returns
            words, out = self._words, self._out
            parts = []
            for b in batches:
                res = np.empty((len(b), 65 * words), np.int64)
                router_kernels.rx_overlap_batch(
                    self._table,
                    self._keys,
                    self._masks,
                    b.flat,
                    b.offsets,
                    self._page,
                    seed,
                    self._live,
                    res,
                    self._no_keys,
                )
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
        return (f"RouterIndex(page_size={self._page}{h}, workers={len(self._cols)}, "
                f"pages={len(self)})")
