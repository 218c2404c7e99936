"""The types of a scheduler step (``PrefixCache.begin_batch`` and the
batch calls after it): ``RequestBatch``, the requests one ``begin_batch``
began with their states in one block, and the results ``BatchBegin`` and
``BatchFinished``."""

from typing import Any, List, NamedTuple, Optional

import numpy as np

from .._input.batch import Batch
from .._input.types import Namespace
from .._kernels import lifecycle_batch as batch_kernels
from .._kernels.layout import (DONE, OPEN, R_BEGUN, R_CACHED, R_FREED, R_GEN, R_LAST_CACHED,
                               R_LAST_FREED, R_LAST_GEN, R_LAST_NODE, R_NODE, R_PHASE,
                               R_RESERVED, REQUEST_SIZE)
from .._tree.results import NOTHING_EVICTED, EvictResult, Finished
from .._tree.status import BEGUN_VALUES, status_error
from .requests import Request

NO_VALUES = np.empty(0, np.int64)
NO_ROWS = np.empty(0, np.int64)
NO_STATES = np.empty((0, REQUEST_SIZE), np.int64)
_ROW_BYTES = 8 * REQUEST_SIZE
_new = tuple.__new__


def batch_of(flat, offsets):
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


class Stage:
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
    path) or any list of requests.

    Parameters
    ----------
    owner : PrefixCache
        The cache that began it (``begin_batch`` makes it; a user does not).
    namespace : int or str
        Where its requests matched and cache.
    priority : int
        Of their inserts.
    states : int64 array
        One state row per request.
    out : int64 array or None
        ``begin_batch(out=)``, or None.
    offsets : int64 array
        Each request's offset in the batch's tokens.
    evict_out : int64 array
        The values the begins evicted.
    """

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
        self._staged: Any = None  # (steps each row reaches, Stage) of the last batch call
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
                status = batch_kernels.begun_values(s.directory, s.like, NO_STATES, addrs, out,
                                                    off)
        if status != DONE:
            raise status_error(BEGUN_VALUES, status, owner, rows)
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
            return batch_of(np.concatenate(parts) if parts else NO_VALUES, off)
        pos = np.repeat(self._offsets[:-1] - off[:-1], lengths) + np.arange(int(off[-1]))
        return batch_of(self._out[pos], off)

    @property
    def evicted(self) -> Optional[Batch]:
        """Per request, the values its begin evicted (None without values)."""
        if not self.owner.has_values:
            return None
        off = self._evict_offsets()
        return batch_of(self._evict_out[:int(off[-1])], off)

    def __repr__(self):
        return f"RequestBatch({len(self)} requests, {int(self.open.sum())} open)"

