"""A scheduler step in one call: ``begin_batch`` / ``checkpoint_batch`` /
``finish_batch`` of ``PrefixCache``, each one ``lifecycle_batch`` kernel
call over the whole batch, request for request what a loop of ``begin`` /
``checkpoint`` / ``finish`` does, and all or nothing: a batch that a
request of it cannot go through changes nothing.

How it stays all or nothing (``_kernels/lifecycle_batch``): room for the
whole batch is reserved before the kernel changes anything, every request
is checked on its own first, and a batch whose requests could be refused
because of one another (under a capacity that evicting might not satisfy,
or lock counts near their limit) is run with a copy of the tree's node
arrays, child table and counters beside it (``_backup``; tokens and values
are append-only), from which the same kernel call restores the tree, the
request states and the event log if a request is refused. A capacity that
needs evicting in a checkpoint or finish batch therefore costs a copy of
the node arrays per call. The requests' types are in ``request_batch``.
"""

from typing import TYPE_CHECKING, Optional, Sequence, Union

import numpy as np

from .._input.batch import Batch, pack
from .._input.sequence import check_fits
from .._input.types import BatchLike, Namespace
from .._input.validate import MAX_SEQUENCE_TOKENS, check_int, check_length
from .._kernels import lifecycle_batch as batch_kernels
from .._kernels.directory import directory_of
from .._kernels.layout import (DONE, M_INFLIGHT, M_LOCKED_TOKENS, M_TOKENS, R_BEGUN,
                               R_LAST_CACHED, R_LAST_GEN, R_LAST_NODE, R_STEPS, REQUEST_SIZE)
from .._tree.status import BEGIN_BATCH, TRANSITION, status_error
from .events import begin_log_size, log_size
from .request_batch import (NO_ROWS, NO_STATES, NO_VALUES, BatchBegin, BatchFinished,
                            RequestBatch, Stage, batch_of)
from .requests import Request

if TYPE_CHECKING:
    from .core import PrefixCache


_INT64 = np.dtype(np.int64)
_new = tuple.__new__


def begin_batch(self: "PrefixCache", batch: BatchLike, *, namespace: Namespace = None,
                reserve: Union[None, int, Sequence[int], np.ndarray] = None,
                priority: int = 0, out: Optional[np.ndarray] = None) -> BatchBegin:
    """``begin`` of every sequence of ``batch`` (anything ``pack``
    takes: lists, a 2-D array, Arrow, a ``(flat, offsets)`` pair), in
    order, in one call: ``BatchBegin(requests, cached)``. All or nothing:
    a request that cannot be admitted (``CacheFullError``,
    ``OverflowError``) raises and no request of the batch is begun;
    nothing changed.

    The matched values (``requests.values``, ``requests[i].values``) are
    read from the cache when asked for, while the requests are open
    (their locks hold them), so a begin copies nothing. ``out``: a
    writable int64 array at least as long as the batch's tokens, e.g. a
    scheduler's token-to-slot table, that receives each request's
    matched values at its sequence's offset, in the same call.

    Parameters
    ----------
    batch : batch of token sequences
        The requests' tokens, one sequence per request.
    namespace : int, str or None
        Where every request matches (None: the default namespace).
    reserve : None, int or sequence of int
        Tokens each request holds in flight with ``count_inflight=True``:
        None (each request's uncached tokens), one int for all, or one per
        request.
    priority : int
        Of the requests' inserts (see ``insert``).
    out : int64 array or None
        Receives each request's matched values at its sequence's offset.

    >>> from radix_soa import PrefixCache
    >>> pc = PrefixCache(); _ = pc.insert([1, 2, 3], values=[7, 8, 9])
    >>> rb, cached = pc.begin_batch([[1, 2, 5], [4]])
    >>> cached.tolist(), rb[0].values.tolist(), pc.locked_tokens
    ([2, 0], [7, 8], 2)
    """
    if self._s.readonly:
        self._writable()
    flat, offsets, k, reserves, out = self._begin_batch_input(batch, reserve, priority, out)
    namespace = 0 if namespace is None else namespace  # None: the default namespace
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
        need, evict_out = self._batch_need(capacity, offsets, reserves, k)
        states = np.zeros((k, REQUEST_SIZE), np.int64)
        rb = RequestBatch(self, namespace, priority, states,
                          out if out.shape[0] else None, offsets, evict_out)
        self._requests[id(rb)] = rb  # listed before its kernel runs, as begin's request
        info = np.zeros(1, np.int64)
        ev = None if self._events is None else self._events.ev(
            s, self._ns_keys, begin_log_size(self, capacity, need) + 8 * k)

        def call(live, B, saved):
            return kernel(s.directory, s.like, root, known, flat, offsets, self._page, out,
                          count, capacity, reserves, evict_out, states, NO_ROWS, live, B,
                          saved, info, ev)

        status = s.run(lambda: call(True, s.directory, NO_STATES))
        if status == batch_kernels.UNSURE:  # room is there now: one more call, undone if refused
            status = call(False, *self._backup(k))
        if status != DONE:
            del self._requests[id(rb)]
            raise status_error(BEGIN_BATCH, status, self, int(info[0]))
    return _new(BatchBegin, (rb, states[:, R_BEGUN].copy()))


def checkpoint_batch(self: "PrefixCache", requests: Union[RequestBatch, Sequence[Request]],
                     batch: BatchLike, values: BatchLike = None) -> Optional[Batch]:
    """``checkpoint`` of request ``i`` with sequence ``i`` of ``batch``
    and its values (one per token, or for the whole pages only), in
    order, in one call. Returns a ``Batch``: per request the slots to
    free now (duplicates, then what making room evicted); None without
    values. All or nothing: on any error (``ValueError`` for a closed
    request or tokens that leave its cached prefix, ``CacheFullError``,
    ``OverflowError``) no request is checkpointed."""
    return self._cache_batch(requests, batch, values, False)


def finish_batch(self: "PrefixCache", requests: Union[RequestBatch, Sequence[Request]],
                 batch: BatchLike, values: BatchLike = None) -> BatchFinished:
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


def _begin_batch_input(self: "PrefixCache", batch, reserve, priority, out):
    """``(flat, offsets, k, reserves, out)`` of ``begin_batch``'s
    arguments, each checked before anything changes (``out``: empty when
    None)."""
    flat, offsets, k = self._batch_tokens(batch)
    reserves = self._batch_reserves(reserve, k)
    if type(priority) is not int or priority:
        self._check_priority(priority)
    if out is not None:
        self._check_begin_out(out, flat.shape[0])
    else:
        out = NO_VALUES
    return flat, offsets, k, reserves, out


def _batch_need(self: "PrefixCache", capacity, offsets, reserves, k):
    """``(need, evict_out)`` of a batch of begins: the tokens it reserves
    against ``capacity`` (0 when it counts none, ``capacity < 0``) and the
    room for what making that room may evict."""
    if capacity < 0:
        return 0, NO_VALUES
    lengths = offsets[1:] - offsets[:-1]
    need = int(np.where(reserves < 0, lengths, reserves).sum())
    return need, self._batch_evict_out(capacity, need, k) if self._s.has_values else NO_VALUES


def _batch_tokens(self: "PrefixCache", batch):
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


def _check_begin_out(self: "PrefixCache", out, n):
    self._check_evict_out(out)  # the same array rules
    if out.shape[0] < n:
        raise ValueError(f"out has room for {out.shape[0]} values; the batch has {n} tokens")


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


def _batch_evict_out(self: "PrefixCache", capacity, need, k):
    """Room for every value a batch of begins may evict: what the
    batch reserves plus the excess over the capacity and a page per
    request (rounding), at most the unlocked tokens."""
    meta = self._s.meta
    excess = max(0, int(meta[M_TOKENS] + meta[M_INFLIGHT]) - capacity)
    bound = min(excess + need + k * self._page, int(meta[M_TOKENS] - meta[M_LOCKED_TOKENS]))
    return np.empty(max(bound, 0), np.int64)


def _backup(self: "PrefixCache", k):
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


def _cache_batch(self: "PrefixCache", requests, batch, values, finishing):
    if self._s.readonly:
        self._writable()
    flat, offsets, k = self._batch_tokens(batch)
    page = self._page
    lengths = offsets[1:] - offsets[:-1]
    ns_ = lengths - lengths % page if page > 1 else lengths
    vflat, voffsets, out, evout = self._cache_batch_values(values, k, lengths, ns_, finishing)
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
        ev = None if self._events is None else self._events.ev(
            s, self._ns_keys, log_size(int(ns_.sum()), page, k))
        stage = Stage(self, finishing, out, res, evout, evres)
        self._stage_batch(requests, members, states, stage)
        kernel = batch_kernels.req_cache_batch

        def call(live, B, saved):
            return kernel(s.directory, s.like, roots, nss, flat, offsets, ns_, vflat,
                          voffsets, page, self._cap, self._count_inflight, out, seg, res,
                          evout, evres, priorities, states, rows, finishing, live, B, saved,
                          info, ev)

        status = s.run(lambda: call(True, s.directory, NO_STATES))
        if status == batch_kernels.UNSURE:  # room is there now: one more call, undone if refused
            status = call(False, *self._backup(k))
        if (roots < 0).any() or len(self._roots) != s.count("roots"):
            self._roots_in_sync()
        if status != DONE:
            request = requests[int(info[0])] if type(requests) is RequestBatch \
                else members[int(info[0])]
            if status == batch_kernels.STALE:
                self._check_open(request)  # a closed request's own error
            raise status_error(TRANSITION, status, self, request)
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
        return _new(BatchFinished, (cached, handles, batch_of(out[:int(res[k])], res),
                                    batch_of(evout[:int(evres[k])], evres)))
    return batch_of(out[:int(res[k])], res) if s.has_values else None


def _cache_batch_values(self: "PrefixCache", values, k, lengths, ns_, finishing):
    """``(vflat, voffsets, out, evout)`` of a checkpoint or finish batch:
    its values checked (one per token, or for the whole pages ``ns_``
    only, of each of the ``k`` sequences of ``lengths`` tokens), and the
    arrays the kernel hands back in (empty without values)."""
    if not self._s.has_values:
        if values is not None:
            raise ValueError("this cache keeps no values (values=False); pass values=None")
        return NO_VALUES, NO_VALUES, NO_VALUES, NO_VALUES
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
    size = vflat.shape[0] + (int(ns_.sum()) if self._cap >= 0 else 0)
    evout = np.empty(int(ns_.sum()) if finishing and self._cap >= 0 else 0, np.int64)
    return vflat, vb.offsets, np.empty(size, np.int64), evout


def _batch_states(self: "PrefixCache", requests, k):
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
        return requests._states, NO_ROWS, None
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


def _stage_batch(requests, members, states, stage):
    """Record ``stage`` for the step each request is about to reach, so
    ``Request.result`` finds it even after an interrupted call."""
    if members is None:
        requests._staged = (states[:, R_STEPS] + 1, stage)
        return
    for j, r in enumerate(members):
        step = int(r._st[R_STEPS]) + 1
        r._inputs[step & 1] = (step, (stage, j))
