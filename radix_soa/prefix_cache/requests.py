"""``Request``: one request of ``PrefixCache.begin`` until its ``finish``
or ``abort``, its state in a small array the lifecycle kernels write."""

from typing import Any, Optional, Union

import numpy as np

from .._kernels.layout import (ABORTED, FINISHED, OPEN, R_BEGUN, R_CACHED, R_FREED, R_GEN,
                               R_LAST_CACHED, R_LAST_FREED, R_LAST_FROM, R_LAST_GEN, R_LAST_N,
                               R_LAST_NODE, R_LAST_PARTIAL, R_NODE, R_PHASE, R_RESERVED, R_STEPS,
                               REQUEST_SIZE)
from .._tree.results import NOTHING_EVICTED, EvictResult, Finished

_new = tuple.__new__  # a named tuple without its Python-level constructor

class Request:
    """A request between ``begin`` and ``finish``/``abort``: the cached
    prefix it found (``cached`` tokens, their ``values``), the locked
    ``node`` protecting it, its ``namespace``, the ``reserved`` tokens it
    holds in flight (counted against the capacity when the cache has
    ``count_inflight=True``) and what making that room ``evicted``.

    Its state lives in a small array the cache's kernels write in the same
    call that changes the tree, so a request is always either before or
    after a transition. ``steps`` counts the transitions committed (begin,
    each checkpoint, finish/abort) and ``result`` is what the last
    checkpoint or finish returned: after an interrupted call, compare
    ``steps`` with its value before the call to know whether it happened,
    and take its result from ``result``.

    Parameters
    ----------
    owner : PrefixCache
        The cache that began it (``begin`` makes requests; a user does not).
    namespace : int or str
        Where it matched and caches.
    out : int64 array or None
        The values ``begin`` matched (None: a request of ``begin_batch``,
        which reads them from the cache).
    evict_out : int64 array
        The values ``begin`` evicted.
    priority : int
        Of its inserts.
    state : int64 array or None
        Its state row (None: a new one).
    """

    __slots__ = ("_st", "owner", "epoch", "namespace", "priority", "_out", "_evict_out",
                 "_inputs", "_batch", "_addr")
    _batch: Any  # bare annotations: no class attribute beside the slot
    _addr: int

    def __init__(self, owner, namespace, out, evict_out, priority=0, state=None):
        self._st = np.zeros(REQUEST_SIZE, np.int64) if state is None else state
        self.owner = owner  # the cache, and its reset count at begin
        self.epoch = owner._epoch
        self.namespace = namespace
        self.priority = priority     # of its inserts (eviction_policy="priority")
        self._out = out              # the values begin matched
        self._evict_out = evict_out  # the values begin evicted
        # (step, out) of the last two checkpoint/finish/abort calls, at index
        # step % 2: ``out`` holds what the call handed back (None: an abort)
        self._inputs = [None, None]
        # left unset (read with getattr) so a begin pays nothing for them:
        # _batch, (RequestBatch, row) of a request begun by begin_batch, and
        # _addr, the address of its state row once the batch kernels needed it

    @property
    def open(self) -> bool:
        """True between ``begin`` and ``finish``/``abort`` (and no ``reset``)."""
        return int(self._st[R_PHASE]) == OPEN and self.owner._epoch is self.epoch

    @property
    def node(self) -> int:
        """Handle of the node the request's cached prefix ends at."""
        return self.owner._handle(self._st[R_NODE], self._st[R_GEN])

    @property
    def cached(self) -> int:
        """Leading tokens cached for the request (grows with ``checkpoint``)."""
        return int(self._st[R_CACHED])

    @property
    def values(self) -> Optional[np.ndarray]:
        """The values of the prefix ``begin`` found cached (None without
        values). A request of ``begin_batch`` without ``out=`` reads them
        from its locked path, so only while it is open (else ``ValueError``)."""
        if not self.owner.has_values:
            return None
        if self._out is None:  # begun by begin_batch: read from the cache
            batch, i = self._batch
            return batch._begun_values([i])[0]
        return self._out[:int(self._st[R_BEGUN])]

    @property
    def reserved(self) -> int:
        """Tokens the request holds in flight (``count_inflight``)."""
        return int(self._st[R_RESERVED])

    @property
    def evicted(self) -> EvictResult:
        """``EvictResult`` of what ``begin`` evicted to make the reservation's room."""
        return self.owner._evicted(int(self._st[R_FREED]), self._evict_out)

    @property
    def steps(self) -> int:
        """Transitions committed so far (0 until ``begin`` succeeds)."""
        return int(self._st[R_STEPS])

    @property
    def result(self) -> Union[np.ndarray, Finished, None]:
        """What the last committed ``checkpoint`` (the array of slots to
        free) or ``finish`` (``Finished``) returned; None before either."""
        st = self._st.tolist()
        staged = self._inputs[st[R_STEPS] & 1]
        if staged is None or staged[0] != st[R_STEPS]:
            member = getattr(self, "_batch", None)  # staged for the batch it was begun in
            staged = None if member is None else member[0]._staged_for(member[1], st[R_STEPS])
            if staged is None:
                return None
        if staged[1] is None:
            return None  # an abort
        if type(staged[1]) is tuple:  # (stage of a batch call, row in that call)
            return staged[1][0].result(staged[1][1], st)
        return self._result(st, staged[1])

    def _result(self, st, out):
        """The result of the call recorded in ``st`` (a list) that handed
        back ``out`` (``_kernels.lifecycle.free_layout``: the duplicates,
        for a finish the partial page, then what making room evicted)."""
        owner = self.owner
        has_values = owner._s.has_values
        cached, freed = st[R_LAST_CACHED], st[R_LAST_FREED]
        if has_values:
            partial = st[R_LAST_PARTIAL]
            end = st[R_LAST_N] - st[R_LAST_FROM] + partial
            start = end - partial - (cached - st[R_LAST_FROM])
        if st[R_PHASE] != FINISHED:  # a checkpoint: duplicates, then evicted slots
            return out[start:end + freed] if has_values else None
        evicted = NOTHING_EVICTED[has_values] if not freed else _new(
            EvictResult, (freed, out[end:end + freed] if has_values else None))
        return _new(Finished, (cached, owner._handle(st[R_LAST_NODE], st[R_LAST_GEN]),
                               out[start:end] if has_values else None, evicted))

    def _stage(self, out):
        """Record the ``out`` of the transition about to run (one store, at
        the step it will be), so ``result`` can be rebuilt after it."""
        step = int(self._st[R_STEPS]) + 1
        self._inputs[step & 1] = (step, out)

    def __repr__(self):
        state = {OPEN: "open", FINISHED: "finished", ABORTED: "aborted"}.get(
            int(self._st[R_PHASE]), "not begun")
        if state == "open" and not self.open:
            state = "void (reset)"
        return (f"Request(cached={self.cached}, node={self.node}, reserved={self.reserved}, "
                f"{state})")

