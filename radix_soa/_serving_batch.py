"""A scheduler step in one call: ``begin_batch`` / ``checkpoint_batch`` /
``finish_batch`` of ``PrefixCache`` (a mixin, as ``_serving``), each one
``lifecycle_batch`` kernel call over the whole batch, request for request
what a loop of ``begin`` / ``checkpoint`` / ``finish`` does, and all or
nothing: a batch that a request of it cannot go through changes nothing.

How it stays all or nothing (``_kernels/lifecycle_batch``): room for the
whole batch is reserved before the kernel changes anything, every request
is checked on its own first, and a batch whose requests could be refused
because of one another (under a capacity that evicting might not satisfy,
or lock counts near their limit) is run with a copy of the tree's node
arrays, child table and counters beside it (``_backup``; tokens and values
are append-only), from which the same kernel call restores the tree, the
request states and the event log if a request is refused. A capacity that
needs evicting in a checkpoint or finish batch therefore costs a copy of
the node arrays per call.
"""

from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Sequence, Union

import numpy as np

from ._events.event_log import begin_log_size, log_size
from ._input.batch import Batch, pack
from ._input.sequence import check_fits
from ._input.types import BatchLike, Namespace
from ._input.validate import MAX_SEQUENCE_TOKENS, check_int, check_length
from ._kernels import lifecycle_batch as batch_kernels
from ._kernels.layout import (DONE, LIMIT, LOCK_LIMIT, M_INFLIGHT, M_LOCKED_TOKENS,
                              M_TOKENS, OPEN, R_BEGUN, R_CACHED, R_FREED, R_GEN, R_LAST_CACHED,
                              R_LAST_FREED, R_LAST_GEN, R_LAST_NODE, R_NODE, R_PHASE, R_RESERVED,
                              R_STEPS, REQUEST_SIZE)
from ._serving import Request
from ._tree.results import NOTHING_EVICTED, CacheFullError, EvictResult, Finished
from ._kernels.directory import directory_of

if TYPE_CHECKING:
    from ._events.event_log import EventLog

_INT64 = np.dtype(np.int64)
_NO_VALUES = np.empty(0, np.int64)
_NO_ROWS = np.empty(0, np.int64)
_NO_STATES = np.empty((0, REQUEST_SIZE), np.int64)
_ROW_BYTES = 8 * REQUEST_SIZE
_new = tuple.__new__


def _batch_of(flat, offsets):
    """A ``Batch`` of arrays this module made (valid by construction)."""
    b = Batch.__new__(Batch)
    view = flat.view()
    view.flags.writeable = False
    b.flat = view
    b.offsets = offsets
    return b


class BatchBegin(NamedTuple):
    """Result of ``PrefixCache.begin_batch``: ``requests``, the
    ``RequestBatch`` of the begun requests, and ``cached``, the leading
    tokens found cached per request (int64)."""

    requests: "RequestBatch"
    cached: np.ndarray


class BatchFinished(NamedTuple):
    """Result of ``PrefixCache.finish_batch``, per request what ``finish``
    returns: ``cached`` (int64), ``nodes`` (handles, uint64), ``free`` and
    ``evicted`` (``Batch`` es of slots to free: duplicates and the partial
    last page; what making room evicted), ``None`` without values."""

    cached: np.ndarray
    nodes: np.ndarray
    free: Optional[Batch]
    evicted: Optional[Batch]


class _Stage:
    """What one ``checkpoint_batch`` / ``finish_batch`` hands back, so each
    request's ``result`` can be rebuilt from it (``Request.result``)."""

    __slots__ = ("owner", "finishing", "out", "res", "evout", "evres")

    def __init__(self, owner, finishing, out, res, evout, evres):
        self.owner, self.finishing = owner, finishing
        self.out, self.res, self.evout, self.evres = out, res, evout, evres

    def result(self, j, st):
        owner = self.owner
        has_values = owner._s.has_values
        free = self.out[self.res[j]:self.res[j + 1]] if has_values else None
        if not self.finishing:
            return free
        freed = st[R_LAST_FREED]
        evicted = NOTHING_EVICTED[has_values] if not freed else _new(
            EvictResult, (freed, self.evout[self.evres[j]:self.evres[j + 1]] if has_values
                          else None))
        return _new(Finished, (st[R_LAST_CACHED], owner._handle(st[R_LAST_NODE], st[R_LAST_GEN]),
                               free, evicted))


class RequestBatch:
    """The requests one ``begin_batch`` began, their states in one block:
    ``len``, ``batch[i]`` (the ``Request``, made on first use), iteration,
    and per request as arrays ``cached``, ``nodes`` (handles), ``reserved``,
    ``open``, and as ``Batch`` es ``values`` (what begin matched) and
    ``evicted`` (what making its reservation's room evicted).
    ``checkpoint_batch`` and ``finish_batch`` take it whole (the fast
    path) or any list of requests."""

    __slots__ = ("owner", "epoch", "namespace", "priority", "_states", "_base", "_out",
                 "_offsets", "_evict_out", "_members", "_staged", "_evicts")

    def __init__(self, owner: Any, namespace: Namespace, priority: int, states: np.ndarray,
                 out: Optional[np.ndarray], offsets: np.ndarray, evict_out: np.ndarray) -> None:
        self.owner = owner
        self.epoch = owner._epoch
        self.namespace = namespace
        self.priority = priority
        self._states = states
        self._base = states.ctypes.data  # row i's state lives at _base + i * _ROW_BYTES
        self._out = out
        self._offsets = offsets
        self._evict_out = evict_out
        self._members: List[Optional[Request]] = [None] * states.shape[0]
        self._staged: Any = None  # (steps each row reaches, _Stage) of the last batch call
        self._evicts = None  # offsets of each request's evicted values in _evict_out

    def __len__(self) -> int:
        return self._states.shape[0]

    def __getitem__(self, i: int) -> Request:
        r = self._members[i]
        if r is None:
            n = len(self)
            i = range(n)[i]  # an IndexError, or i made non-negative
            r = self._members[i]
        if r is None:
            a = int(self._offsets[i])
            st = self._states[i]
            ev_off = self._evict_offsets()
            out = self._out
            r = Request(self.owner, self.namespace,
                        None if out is None else out[a:int(self._offsets[i + 1])],
                        self._evict_out[ev_off[i]:ev_off[i + 1]], self.priority, st)
            r.epoch = self.epoch
            r._batch = (self, i)
            r._addr = self._base + i * _ROW_BYTES
            self._members[i] = r
        return r

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def _staged_for(self, i, steps):
        staged = self._staged
        if staged is None or staged[0][i] != steps:
            return None
        return steps, (staged[1], i)

    def _evict_offsets(self):
        off = self._evicts
        if off is None:  # R_FREED is written by begin only
            off = np.zeros(len(self) + 1, np.int64)
            np.cumsum(self._states[:, R_FREED], out=off[1:])
            self._evicts = off
        return off

    def _begun_values(self, rows):
        """The begun values of ``rows`` (a list of row numbers), read from
        their locked paths: a list of arrays."""
        owner = self.owner
        lengths = self._states[rows, R_BEGUN]
        off = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(lengths, out=off[1:])
        out = np.empty(int(off[-1]), np.int64)
        addrs = np.asarray(rows, np.int64) * _ROW_BYTES + self._base
        with owner._lock:
            if self.epoch is not owner._epoch:
                status = -1
            else:
                s = owner._s
                status = batch_kernels.begun_values(s.directory, s.like, _NO_STATES, addrs, out,
                                                    off)
        if status != DONE:
            raise ValueError(f"request {rows[-1 - status] if status < 0 else rows[0]} of the "
                             "batch is closed (or lost its lock): the values its begin matched "
                             "are read from the cache while it is open; pass begin_batch(out=) "
                             "to keep them")
        return [out[off[j]:off[j + 1]] for j in range(len(rows))]

    @property
    def cached(self) -> np.ndarray:
        """Leading tokens cached per request (grows with ``checkpoint``)."""
        return self._states[:, R_CACHED].copy()

    @property
    def reserved(self) -> np.ndarray:
        """Tokens each request holds in flight (``count_inflight``)."""
        return self._states[:, R_RESERVED].copy()

    @property
    def open(self) -> np.ndarray:
        """Per request, True between begin and finish/abort (and no reset)."""
        if self.owner._epoch is not self.epoch:
            return np.zeros(len(self), bool)
        return self._states[:, R_PHASE] == OPEN

    @property
    def nodes(self) -> np.ndarray:
        """Handles of the nodes the requests' cached prefixes end at (uint64)."""
        return self.owner._handles(self._states[:, R_NODE], self._states[:, R_GEN])

    @property
    def values(self) -> Optional[Batch]:
        """The values of the prefix each begin found cached (None without
        values); without ``begin_batch(out=)``, read from the cache, so only
        while every request is open."""
        if not self.owner.has_values:
            return None
        lengths = self._states[:, R_BEGUN]
        off = np.zeros(len(self) + 1, np.int64)
        np.cumsum(lengths, out=off[1:])
        if self._out is None:  # read from the locked paths
            parts = self._begun_values(list(range(len(self))))
            return _batch_of(np.concatenate(parts) if parts else _NO_VALUES, off)
        pos = np.repeat(self._offsets[:-1] - off[:-1], lengths) + np.arange(int(off[-1]))
        return _batch_of(self._out[pos], off)

    @property
    def evicted(self) -> Optional[Batch]:
        """Per request, the values its begin evicted (None without values)."""
        if not self.owner.has_values:
            return None
        off = self._evict_offsets()
        return _batch_of(self._evict_out[:int(off[-1])], off)

    def __repr__(self):
        return f"RequestBatch({len(self)} requests, {int(self.open.sum())} open)"


class BatchLifecycleMixin:
    """``begin_batch``, ``checkpoint_batch`` and ``finish_batch`` of ``PrefixCache``."""

    _s: Any
    _writing: Any
    _lock: Any
    _page: int
    _cap: int
    _count_inflight: bool
    _requests: Dict[int, Any]
    _roots: Dict[Union[int, str], int]
    _epoch: object
    _events: Optional["EventLog"]

    if TYPE_CHECKING:
        def _writable(self) -> None: ...
        def _root(self, namespace: Namespace, create: bool = True) -> Any: ...
        def _roots_in_sync(self) -> None: ...
        def _handle(self, v: Any, gen: Any) -> int: ...
        def _handles(self, v: Any, gen: Any) -> np.ndarray: ...
        def _check_priority(self, priority: int) -> None: ...
        def _check_open(self, request: Any) -> None: ...
        def _transition_error(self, status: int, request: Any) -> Exception: ...
        @property
        def has_values(self) -> bool: ...
        @property
        def total_tokens(self) -> int: ...
        @property
        def locked_tokens(self) -> int: ...
        @property
        def inflight_tokens(self) -> int: ...

    def begin_batch(self, batch: BatchLike, *, namespace: Namespace = None,
                    reserve: Union[None, int, Sequence[int], np.ndarray] = None,
                    priority: int = 0, out: Optional[np.ndarray] = None) -> BatchBegin:
        """``begin`` of every sequence of ``batch`` (anything ``pack``
        takes: lists, a 2-D array, Arrow, a ``(flat, offsets)`` pair), in
        order, in one call: ``BatchBegin(requests, cached)``. ``reserve``:
        None (each request's uncached tokens), one int for all, or one per
        request. All or nothing: a request that cannot be admitted
        (``CacheFullError``, ``OverflowError``) raises and no request of the
        batch is begun; nothing changed.

        The matched values (``requests.values``, ``requests[i].values``) are
        read from the cache when asked for, while the requests are open
        (their locks hold them), so a begin copies nothing. ``out``: a
        writable int64 array at least as long as the batch's tokens, e.g. a
        scheduler's token-to-slot table, that receives each request's
        matched values at its sequence's offset, in the same call.

        >>> from radix_soa import PrefixCache
        >>> pc = PrefixCache(); _ = pc.insert([1, 2, 3], values=[7, 8, 9])
        >>> rb, cached = pc.begin_batch([[1, 2, 5], [4]])
        >>> cached.tolist(), rb[0].values.tolist(), pc.locked_tokens
        ([2, 0], [7, 8], 2)
        """
        if self._s.readonly:
            self._writable()
        flat, offsets, k = self._batch_tokens(batch)
        reserves = self._batch_reserves(reserve, k)
        if type(priority) is not int or priority:
            self._check_priority(priority)
        if namespace is None:
            namespace = 0
        if out is not None:
            self._check_begin_out(out, flat.shape[0])
        else:
            out = _NO_VALUES
        count = self._count_inflight
        kernel = batch_kernels.req_begin_batch
        with self._writing:
            s = self._s  # under the lock: a reset() may have replaced it
            root = self._roots.get(namespace, -1) if type(namespace) is int else -1
            if root < 0:
                root, _ = self._root(namespace, create=False)
            known = root >= 0
            if not known:  # an unknown namespace: misses, and nothing is created
                root = s.root
            capacity = self._cap if count else -1
            evict_out = _NO_VALUES
            need = 0
            if capacity >= 0:
                lengths = offsets[1:] - offsets[:-1]
                need = int(np.where(reserves < 0, lengths, reserves).sum())
                if s.has_values:
                    evict_out = self._batch_evict_out(capacity, need, k)
            states = np.zeros((k, REQUEST_SIZE), np.int64)
            rb = RequestBatch(self, namespace, priority, states,
                              out if out.shape[0] else None, offsets, evict_out)
            # listed before its kernel runs, as begin's request
            self._requests[id(rb)] = rb
            info = np.zeros(1, np.int64)
            ev = None
            if self._events is not None:
                ev = self._events.ev(self, begin_log_size(self, capacity, need) + 8 * k)

            def call(live, B, saved):
                return kernel(s.directory, s.like, root, known, flat, offsets, self._page, out,
                              count, capacity, reserves, evict_out, states, _NO_ROWS, live, B,
                              saved, info, ev)

            status = s.run(lambda: call(True, s.directory, _NO_STATES))
            if status == batch_kernels.UNSURE:  # room is there now: one more call, undone if refused
                status = call(False, *self._backup(k))
            if status != DONE:
                del self._requests[id(rb)]
                i = int(info[0])
                if status == LIMIT:
                    raise OverflowError(f"request {i} of the batch: a path holds at most "
                                        f"{LOCK_LIMIT} locks at once (int32 counts); no request "
                                        "of the batch was begun")
                raise CacheFullError(
                    f"request {i} of the batch: no room to reserve its tokens: capacity "
                    f"{self._cap}, {self.total_tokens} cached ({self.locked_tokens} locked), "
                    f"{self.inflight_tokens} in flight; no request of the batch was begun")
        return _new(BatchBegin, (rb, states[:, R_BEGUN].copy()))

    def checkpoint_batch(self, requests: Union[RequestBatch, Sequence[Request]],
                         batch: BatchLike, values: BatchLike = None) -> Optional[Batch]:
        """``checkpoint`` of request ``i`` with sequence ``i`` of ``batch``
        and its values (one per token, or for the whole pages only), in
        order, in one call. Returns a ``Batch``: per request the slots to
        free now (duplicates, then what making room evicted); None without
        values. All or nothing: on any error (``ValueError`` for a closed
        request or tokens that leave its cached prefix, ``CacheFullError``,
        ``OverflowError``) no request is checkpointed."""
        return self._cache_batch(requests, batch, values, False)

    def finish_batch(self, requests: Union[RequestBatch, Sequence[Request]], batch: BatchLike,
                     values: BatchLike = None) -> BatchFinished:
        """``finish`` of request ``i`` with sequence ``i`` of ``batch`` and
        its values, in order, in one call: ``BatchFinished(cached, nodes,
        free, evicted)``, per request what ``finish`` returns (``free`` and
        ``evicted`` as ``Batch`` es: free both). All or nothing, as
        ``checkpoint_batch``.

        >>> from radix_soa import PrefixCache
        >>> pc = PrefixCache(page_size=2)
        >>> rb, _ = pc.begin_batch([[1, 2], [1, 2]])
        >>> f = pc.finish_batch(rb, [[1, 2, 3], [1, 2, 4]], [[10, 11, 12], [20, 21, 22]])
        >>> f.cached.tolist(), [x.tolist() for x in f.free], pc.total_tokens
        ([0, 2], [[12], [20, 21, 22]], 2)
        """
        return self._cache_batch(requests, batch, values, True)

    # ------------------------------------------------------------ internals
    def _batch_tokens(self, batch):
        """``(flat, offsets, k)`` of a batch of token sequences, checked."""
        b = pack(batch)
        flat = b.flat if b.flat.dtype == _INT64 else b.flat.astype(np.int64)
        s = self._s
        if s.narrow:
            check_fits(flat, s.dtype)
        k = len(b)
        if flat.shape[0] > MAX_SEQUENCE_TOKENS:
            check_length(int((b.offsets[1:] - b.offsets[:-1]).max()), "a sequence of the batch")
        return np.ascontiguousarray(flat), b.offsets, k

    def _check_begin_out(self, out, n):
        self._check_evict_out(out)  # the same array rules
        if out.shape[0] < n:
            raise ValueError(f"out has room for {out.shape[0]} values; the batch has {n} tokens")

    @staticmethod
    def _batch_reserves(reserve, k):
        if reserve is None:
            return np.full(k, -1, np.int64)
        if isinstance(reserve, (int, np.integer)) and not isinstance(reserve, bool):
            return np.full(k, check_int("reserve", reserve, minimum=0, maximum=MAX_SEQUENCE_TOKENS),
                           np.int64)
        arr = np.asarray(reserve)
        if arr.shape != (k,) or arr.dtype.kind not in "iu":
            raise ValueError(f"reserve must be None, an int, or {k} ints (one per request)")
        if k and int(arr.min()) < 0:
            raise ValueError("reserve must be >= 0")
        if k and int(arr.max()) > MAX_SEQUENCE_TOKENS:  # before a uint64 could wrap to "default"
            raise OverflowError(f"reserve must be <= {MAX_SEQUENCE_TOKENS} (a sequence's most "
                                f"tokens); got {int(arr.max())}")
        return arr.astype(np.int64)

    def _batch_evict_out(self, capacity, need, k):
        """Room for every value a batch of begins may evict: what the
        batch reserves plus the excess over the capacity and a page per
        request (rounding), at most the unlocked tokens."""
        meta = self._s.meta
        excess = max(0, int(meta[M_TOKENS] + meta[M_INFLIGHT]) - capacity)
        bound = min(excess + need + k * self._page, int(meta[M_TOKENS] - meta[M_LOCKED_TOKENS]))
        return np.empty(max(bound, 0), np.int64)

    def _backup(self, k):
        """``(B, saved)`` for the run of an ``UNSURE`` batch: the directory
        of a copy of every array of the tree but the tokens and values, and
        room for ``k`` request states (``_kernels.lifecycle_batch._undo``)."""
        s = self._s
        t = s.tree
        copies = {name: getattr(t, name).copy() for name in s.per_node_arrays}
        copies.update(term=t.term.copy(), table=t.table.copy(), meta=t.meta.copy())
        backup = t._replace(**copies)
        B = directory_of(backup) if isinstance(s.directory, np.ndarray) else tuple(backup)
        return B, np.empty((k, REQUEST_SIZE), np.int64)

    def _cache_batch(self, requests, batch, values, finishing):
        if self._s.readonly:
            self._writable()
        flat, offsets, k = self._batch_tokens(batch)
        page = self._page
        lengths = offsets[1:] - offsets[:-1]
        ns_ = lengths - lengths % page if page > 1 else lengths
        s = self._s
        if s.has_values:
            if values is None:
                raise ValueError("values: this cache keeps a value per token (its KV slot); "
                                 "pass values=, or make it with PrefixCache(values=False)")
            vb = pack(values)
            if len(vb) != k:
                raise ValueError(f"values has {len(vb)} sequences for {k} requests")
            vlen = vb.offsets[1:] - vb.offsets[:-1]
            bad = np.flatnonzero((vlen != lengths) & (vlen != ns_))
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"values of request {i} has {int(vlen[i])} entries for "
                                 f"{int(lengths[i])} tokens; pass {int(lengths[i])} or "
                                 f"{int(ns_[i])} (the whole pages)")
            vflat = np.ascontiguousarray(vb.flat, np.int64)
            voffsets = vb.offsets
            size = vflat.shape[0] + (int(ns_.sum()) if self._cap >= 0 else 0)
            out = np.empty(size, np.int64)
            evout = np.empty(int(ns_.sum()) if finishing and self._cap >= 0 else 0, np.int64)
        else:
            if values is not None:
                raise ValueError("this cache keeps no values (values=False); pass values=None")
            vflat = voffsets = out = evout = _NO_VALUES
        with self._writing:
            s = self._s
            states, rows, members = self._batch_states(requests, k)
            roots = np.empty(k, np.int64)
            nss = np.zeros(k, np.int64)
            if type(requests) is RequestBatch:
                root, ns = self._root(requests.namespace)
                roots[:] = root
                nss[:] = ns
            else:
                for j, r in enumerate(members):
                    roots[j], nss[j] = self._root(r.namespace)
            seg = np.empty(k + 1, np.int64)
            res = np.empty(k + 1, np.int64)
            evres = np.empty(k + 1, np.int64)
            priorities = (np.full(k, requests.priority, np.int64) if type(requests) is RequestBatch
                          else np.array([r.priority for r in members], np.int64))
            info = np.zeros(1, np.int64)
            ev = None
            if self._events is not None:
                ev = self._events.ev(self, log_size(int(ns_.sum()), page, k))
            stage = _Stage(self, finishing, out, res, evout, evres)
            self._stage_batch(requests, members, states, stage)
            kernel = batch_kernels.req_cache_batch

            def call(live, B, saved):
                return kernel(s.directory, s.like, roots, nss, flat, offsets, ns_, vflat,
                              voffsets, page, self._cap, self._count_inflight, out, seg, res,
                              evout, evres, priorities, states, rows, finishing, live, B, saved,
                              info, ev)

            status = s.run(lambda: call(True, s.directory, _NO_STATES))
            if status == batch_kernels.UNSURE:  # room is there now: one more call, undone if refused
                status = call(False, *self._backup(k))
            if (roots < 0).any() or len(self._roots) != s.count("roots"):
                self._roots_in_sync()
            if status != DONE:
                request = requests[int(info[0])] if type(requests) is RequestBatch \
                    else members[int(info[0])]
                if status == batch_kernels.STALE:
                    self._check_open(request)  # a closed request's own error
                raise self._transition_error(status, request)
            if finishing:
                if type(requests) is RequestBatch:
                    self._requests.pop(id(requests), None)
                else:
                    for r in members:
                        self._requests.pop(id(r), None)
        if finishing:
            if rows.shape[0]:
                states = np.empty((k, REQUEST_SIZE), np.int64)
                batch_kernels.gather_rows(states, rows)
            handles = self._handles(states[:, R_LAST_NODE], states[:, R_LAST_GEN])
            cached = states[:, R_LAST_CACHED].copy()
            if not s.has_values:
                return _new(BatchFinished, (cached, handles, None, None))
            return _new(BatchFinished, (cached, handles, _batch_of(out[:int(res[k])], res),
                                        _batch_of(evout[:int(evres[k])], evres)))
        return _batch_of(out[:int(res[k])], res) if s.has_values else None

    def _batch_states(self, requests, k):
        """``(states, rows, members)`` the kernel takes: a ``RequestBatch``'s
        own block (rows empty), or the addresses of a list of requests'
        state rows (each checked: a request of this cache, listed once)."""
        if type(requests) is RequestBatch:
            if requests.owner is not self:
                raise ValueError("this request batch belongs to another cache")
            if requests.epoch is not self._epoch:
                raise ValueError("this request batch was begun before a reset() of the cache "
                                 "(or on a copy of it before it was pickled or loaded)")
            if len(requests) != k:
                raise ValueError(f"{len(requests)} requests for a batch of {k} sequences")
            return requests._states, _NO_ROWS, None
        if not batch_kernels.HAS_DIRECTORY:  # pragma: no cover - a Numba without the internals
            raise NotImplementedError("a list of requests needs Numba's array internals "
                                      "(radix_soa._kernels.directory); pass a RequestBatch")
        members = list(requests)
        if len(members) != k:
            raise ValueError(f"{len(members)} requests for a batch of {k} sequences")
        rows = np.empty(k, np.int64)
        for j, r in enumerate(members):
            if type(r) is not Request or r.owner is not self or r.epoch is not self._epoch:
                self._check_open(r)  # raises
            addr = getattr(r, "_addr", -1)
            if addr < 0:
                addr = r._addr = r._st.ctypes.data
            rows[j] = addr
        if len(set(rows.tolist())) != k:
            raise ValueError("a request is listed twice in the batch")
        return np.empty((0, REQUEST_SIZE), np.int64), rows, members

    @staticmethod
    def _stage_batch(requests, members, states, stage):
        """Record ``stage`` for the step each request is about to reach, so
        ``Request.result`` finds it even after an interrupted call."""
        if members is None:
            requests._staged = (states[:, R_STEPS] + 1, stage)
            return
        for j, r in enumerate(members):
            step = int(r._st[R_STEPS]) + 1
            r._inputs[step & 1] = (step, (stage, j))
