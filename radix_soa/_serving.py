"""What a serving loop needs from ``PrefixCache`` beyond match/insert/lock:
the request lifecycle (``begin`` / ``checkpoint`` / ``finish`` / ``abort``,
SGLang's ``cache_unfinished_req`` / ``cache_finished_req``), read-only
``peek``, ``touch``, a lock context manager, ``reset``, ``reset_stats``,
dropping a namespace, a text view of the tree and the list of cached values.

A mixin of ``PrefixCache`` (which provides ``_s``, ``_lock``, ``_root``,
``match``, ``insert``, ``lock``, ``unlock``, ``evict`` and the handle
encoding); kept apart so each module has one job.
"""

import contextlib
import secrets
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from ._events.event_log import begin_log_size, drop_subtree, log_size
from ._kernels import lifecycle as lifecycle_kernels
from ._kernels import prefix as prefix_kernels
from ._kernels.layout import (ABORTED, DONE, FINISHED, FULL, LIMIT, MISMATCH, ROOM, LOCK_LIMIT, M_INFLIGHT,
                              M_LOCKED_TOKENS, M_POLICY, M_TOKENS, OPEN, R_BEGUN, R_CACHED,
                              R_FREED, R_GEN, R_LAST_CACHED, R_LAST_FREED, R_LAST_FROM, R_LAST_GEN,
                              R_LAST_N, R_LAST_NODE, R_LAST_PARTIAL, R_NODE, R_PHASE, R_RESERVED,
                              R_STEPS,
                              REQUEST_SIZE, STAT_SLOTS)
from ._tree.results import (NO_VALUES_MATCHED, NOTHING_EVICTED, CacheFullError, EvictResult,
                       Finished, InvariantError, Match)
from ._input.sequence import as_tokens
from ._tree.storage import roots_and_depths, span_positions
from ._input.types import Namespace, TokenSequence
from ._input.validate import MAX_SEQUENCE_TOKENS, check_int

if TYPE_CHECKING:
    from ._events.event_log import EventLog

_NO_VALUES = np.empty(0, np.int64)  # ``out`` of a call that writes no values
_new = tuple.__new__  # a named tuple without its Python-level constructor
_STATE_ROWS = 64  # request state arrays allocated at a time (``_state_row``)


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


class ServingMixin:
    """The serving-loop methods of ``PrefixCache`` (see the module docstring)."""

    # What the methods below use of ``PrefixCache`` and ``TreeCache``,
    # declared for type checkers only: a bare annotation makes no class
    # attribute, and the stubs exist only under TYPE_CHECKING, so at run time
    # every lookup finds what it found before.
    _s: Any  # the TreeStorage
    _lock: Any  # a threading.RLock
    _writing: Any  # opens a writer's block (``_tree.base._Writing``)
    _readers: int
    _page: int
    _cap: int
    _capacity: Optional[int]
    _count_inflight: bool
    _requests: Dict[int, Any]  # a Request, or a RequestBatch (``_serving_batch``)
    _roots: Dict[Union[int, str], int]
    _epoch: object
    _events: Optional["EventLog"]
    _salt: int

    if TYPE_CHECKING:
        @property
        def total_tokens(self) -> int: ...
        @property
        def locked_tokens(self) -> int: ...

        def _drain_readers(self) -> None: ...
        def _writable(self) -> None: ...
        def _root(self, namespace: Namespace, create: bool = True) -> Tuple[int, int]: ...
        def _roots_in_sync(self) -> None: ...
        def _handle(self, v: Any, gen: Any) -> int: ...
        def _handle_of(self, v: Any) -> int: ...
        def _split_handle(self, node: Any) -> Tuple[int, int]: ...
        def _evicted(self, freed: int, out: np.ndarray) -> EvictResult: ...
        def _kernel_cap(self, own: int = 0) -> int: ...
        def _tokens_and_values(self, tokens: TokenSequence, values: Any
                               ) -> Tuple[np.ndarray, int, np.ndarray]: ...
        def _check_priority(self, priority: int) -> None: ...
        def _full(self, n: int) -> CacheFullError: ...
        @staticmethod
        def _new_storage(dtype: Any, values: bool, page_size: int, policy: int) -> Any: ...
        def lock(self, node: int) -> int: ...
        def unlock(self, node: int) -> int: ...

    # ------------------------------------------------------------ read-only
    def peek(self, tokens: TokenSequence, namespace: Namespace = None) -> Match:
        """``match`` without side effects: no split, no recency refresh, no
        statistics; an unknown namespace matches nothing and creates nothing.
        ``node`` is the node the match ends in (locking it protects at least
        the matched prefix).

        >>> from radix_soa import PrefixCache
        >>> pc = PrefixCache(); _ = pc.insert([1, 2, 3, 4], values=[5, 6, 7, 8])
        >>> m = pc.peek([1, 2, 9]); m.length, m.values.tolist(), pc.num_nodes
        (2, [5, 6], 1)
        """
        q = as_tokens(tokens)
        s = self._s
        with self._lock:
            root, _ = self._root(namespace, create=False)
            out: Any = np.empty(q.shape[0], np.int64) if s.has_values else None
            if root < 0:
                return Match(0, self._handle_of(s.root), NO_VALUES_MATCHED if s.has_values else None)
            length, v, gen = prefix_kernels.pc_peek(s.directory, s.like, root, q, self._page,
                                       out if s.has_values else s.like.astype(np.int64))
        return Match(int(length), self._handle(v, gen), out[:length] if s.has_values else None)

    def touch(self, node: int) -> None:
        """Refresh the recency of the path root..``node`` (as a ``match``
        ending there would, without the statistics)."""
        self._writable()
        v, gen = self._split_handle(node)
        with self._writing:
            status = prefix_kernels.pc_touch(self._s.directory, self._s.like, v, gen)
        if status != DONE:
            raise ValueError(f"node handle {node} does not refer to a live node of this cache")

    @contextlib.contextmanager
    def locked(self, node: int) -> Iterator[int]:
        """``lock(node)`` for the ``with`` block, ``unlock`` after it (also
        on an exception).

        >>> from radix_soa import PrefixCache
        >>> pc = PrefixCache(); h = pc.insert([1, 2], values=[3, 4]).node
        >>> with pc.locked(h):
        ...     pc.evict(10).num_tokens
        0
        >>> pc.evict(10).num_tokens
        2
        """
        self.lock(node)
        try:
            yield node
        finally:
            self.unlock(node)

    # ------------------------------------------------------------ lifecycle
    # Each transition is one kernel call (``_kernels/lifecycle``) that changes
    # the tree, the in-flight count and the request's state together.
    def begin(self, tokens: TokenSequence, namespace: Namespace = None,
              reserve: Optional[int] = None, priority: int = 0) -> Request:
        """A request arrives: match ``tokens`` and lock the cached prefix.

        With ``count_inflight=True`` the request also reserves ``reserve``
        tokens (default: its uncached tokens) against the capacity, evicting
        what it must (``Request.evicted``: free those slots) or raising
        ``CacheFullError`` when locked and reserved tokens leave no room
        (nothing changed: no split, no lock, no statistics). Returns a
        ``Request`` for ``checkpoint``/``finish``/``abort``; until then it
        is listed by ``open_requests()``. ``priority``: of the request's
        inserts (see ``insert``).

        >>> from radix_soa import PrefixCache
        >>> pc = PrefixCache(); _ = pc.insert([1, 2, 3, 4], values=[5, 6, 7, 8])
        >>> r = pc.begin([1, 2, 3, 9])
        >>> r.cached, r.values.tolist(), pc.locked_tokens
        (3, [5, 6, 7], 3)
        >>> f = pc.finish(r, [1, 2, 3, 9, 10], [5, 6, 7, 20, 21])
        >>> f.cached, f.free.tolist(), pc.locked_tokens
        (3, [], 0)
        """
        if self._s.readonly:
            self._writable()
        q = as_tokens(tokens)
        reserve = -1 if reserve is None else self._check_reserve(reserve)
        if type(priority) is not int or priority:
            self._check_priority(priority)
        if namespace is None:
            namespace = 0
        count = self._count_inflight
        with self._lock:
            if self._readers:
                self._drain_readers()
            s = self._s  # under the lock: a reset() may have replaced it
            key = 0 if namespace is None else namespace  # None: the default namespace
            root = self._roots.get(key, -1) if type(key) is int else -1
            if root < 0:
                root, _ = self._root(namespace, create=False)
            known = root >= 0
            if not known:  # an unknown namespace: a miss, and nothing is created
                root = s.root
            out = np.empty(q.shape[0], np.int64) if s.has_values else _NO_VALUES
            capacity = self._cap if count else -1  # what a reservation counts against
            evict_out = _NO_VALUES if capacity < 0 else self._begin_evict_out(
                capacity, q.shape[0] if reserve < 0 else reserve)
            request = Request(self, namespace, out, evict_out, priority, self._state_row())
            # listed before its kernel runs: a begin interrupted after it is
            # still found by open_requests() (and the listing skips the others)
            self._requests[id(request)] = request
            st = request._st
            if self._events is not None:
                ev = self._events.ev(self, begin_log_size(self, capacity, q.shape[0] if reserve < 0
                                                          else reserve))
                status = s.run(
                    lambda: lifecycle_kernels.req_begin(
                        s.directory,
                        s.like,
                        root,
                        known,
                        q,
                        self._page,
                        out,
                        count,
                        capacity,
                        reserve,
                        evict_out,
                        st,
                        ev,
                    )
                )
            else:
                status = lifecycle_kernels.req_begin(
                    s.directory,
                    s.like,
                    root,
                    known,
                    q,
                    self._page,
                    out,
                    count,
                    capacity,
                    reserve,
                    evict_out,
                    st,
                )
            if status == ROOM:
                status = s.run(
                    lambda: lifecycle_kernels.req_begin(
                        s.directory,
                        s.like,
                        root,
                        known,
                        q,
                        self._page,
                        out,
                        count,
                        capacity,
                        reserve,
                        evict_out,
                        st,
                    )
                )
            if status != DONE:
                del self._requests[id(request)]
                if status == LIMIT:
                    raise OverflowError(f"a path holds at most {LOCK_LIMIT} locks at once "
                                        "(int32 counts)")
                raise CacheFullError(
                    f"no room to reserve {'the uncached' if reserve < 0 else reserve} tokens: "
                    f"capacity {self._capacity}, {self.total_tokens} cached "
                    f"({self.locked_tokens} locked), {self.inflight_tokens} in flight")
        return request

    def _state_row(self):
        """A zeroed state array for a new request: a row of a block shared by
        the next requests (a view costs a third of a fresh small array).
        Called under the lock; a row is never handed out twice."""
        rows = self._state_rows
        if rows is None or self._next_row == _STATE_ROWS:
            rows = self._state_rows = np.zeros((_STATE_ROWS, REQUEST_SIZE), np.int64)
            self._next_row = 0
        row = rows[self._next_row]
        self._next_row += 1
        return row

    _state_rows = None  # the block ``_state_row`` hands rows from
    _next_row = 0

    def _begin_evict_out(self, capacity, need):
        """``out`` for the values ``begin`` may evict: at most its
        reservation plus any excess over the capacity, in whole pages."""
        s = self._s
        if not s.has_values:
            return _NO_VALUES
        meta = s.meta
        excess = max(0, int(meta[M_TOKENS] + meta[M_INFLIGHT]) - capacity)
        bound = min(-(-(need + excess) // self._page) * self._page,
                    int(meta[M_TOKENS] - meta[M_LOCKED_TOKENS]))
        return np.empty(max(bound, 0), np.int64)

    def checkpoint(self, request: Request, tokens: TokenSequence,
                   values: Optional[TokenSequence]) -> Optional[np.ndarray]:
        """Chunked prefill: cache what ``request`` has computed so far
        (``tokens`` with their ``values``) and move its lock to the new
        node. Returns the slots the caller must free now: values of tokens
        someone else cached first (duplicates), then what making room
        evicted. The partial last page stays the request's."""
        return self._transition(lifecycle_kernels.req_checkpoint, request, tokens, values)

    def finish(self, request: Request, tokens: TokenSequence,
               values: Optional[TokenSequence]) -> Finished:
        """A request is done: cache ``tokens`` (prompt + output, whole pages)
        with their ``values`` (one per token, or for the whole pages only),
        release its lock and its in-flight reservation. Returns
        ``Finished(cached, node, free, evicted)``: ``free`` holds the slots the caller must free (duplicates of tokens
        already cached, and the partial last page), ``evicted`` what making
        room freed (free those too). Interrupted, it either happened or did
        not: ``request.steps`` tells, and ``request.result`` is its result."""
        return self._transition(lifecycle_kernels.req_finish, request, tokens, values)

    def abort(self, request: Request) -> None:
        """Release ``request``'s lock and reservation without caching it."""
        with self._lock:
            if self._readers:
                self._drain_readers()
            self._check_open(request)
            request._stage(None)  # an abort has no result
            status = lifecycle_kernels.req_abort(self._s.directory, self._s.like, request._st)
            if status != DONE:
                raise self._transition_error(status, request)
            self._requests.pop(id(request), None)

    def _transition(self, kernel, request, tokens, values):
        """Run ``checkpoint``'s or ``finish``'s kernel: validate the inputs,
        then one kernel call (resumed after growth), which also refuses a
        closed request (``STALE``, its error then given here); returns the
        result, whose arrays are views of the one ``out`` the kernel filled
        (``request.result`` gives the same views again)."""
        if self._s.readonly:
            self._writable()
        q, n, vals = self._tokens_and_values(tokens, values)
        finishing = kernel is lifecycle_kernels.req_finish
        with self._lock:
            if self._readers:
                self._drain_readers()
            s = self._s  # under the lock: a reset() may have replaced it
            if type(request) is not Request or request.owner is not self \
                    or request.epoch is not self._epoch:
                self._check_open(request)  # raises
            namespace = request.namespace
            key = 0 if namespace is None else namespace  # None: the default namespace
            root = self._roots.get(key, -1) if type(key) is int else -1
            ns = 0
            if root < 0:
                root, ns = self._root(namespace)
            st = request._st
            # the request's own reservation becomes cached tokens
            cap = self._cap
            if self._count_inflight:
                cap = self._kernel_cap(own=int(st[R_RESERVED]))
            out = _NO_VALUES
            if s.has_values:  # what it hands back (``_kernels.lifecycle.free_layout``)
                nvals = vals.shape[0]
                end = n - min(int(st[R_CACHED]), n) + (nvals - n if finishing else 0)
                out = np.empty(end + n if cap >= 0 else end, np.int64)
            request._stage(out)
            priority = request.priority
            if self._events is not None:
                ev = self._events.ev(self, log_size(n, self._page))
                status = s.run(lambda: kernel(s.directory, s.like, root, ns, q, n, vals, self._page, cap,
                                              out, priority, st, ev))
            else:
                status = kernel(s.directory, s.like, root, ns, q, n, vals, self._page, cap, out,
                                priority, st)
            if status == ROOM:
                status = s.run(lambda: kernel(s.directory, s.like, root, ns, q, n, vals, self._page, cap,
                                              out, priority, st))
            if root < 0:
                self._roots_in_sync()
            if status != DONE:
                self._check_open(request)  # a closed request's own error first
                raise self._transition_error(status, request)
            if finishing:
                self._requests.pop(id(request), None)
            return request._result(st.tolist(), out)

    def _transition_error(self, status, request):
        if status == FULL:
            return self._full(request.cached)
        if status == MISMATCH:
            return ValueError(f"tokens must start with the request's {request.cached} cached "
                              "tokens (its locked prefix)")
        if status == LIMIT:
            return OverflowError(f"a path holds at most {LOCK_LIMIT} locks at once (int32 counts)")
        return ValueError("the request no longer holds its lock (an unlock() of its node "
                          "released it); abort() the request")

    def _check_open(self, request):
        if not isinstance(request, Request):
            raise TypeError(f"request must be a Request from begin(); got {type(request).__name__}")
        if request.owner is not self:
            raise ValueError("this request belongs to another cache")
        if request.epoch is not self._epoch:
            raise ValueError("this request was begun before a reset() of the cache (or on "
                             "a copy of it before it was pickled or loaded)")
        if not request.open:
            raise ValueError("this request was finished or aborted already (its result is "
                             "request.result)")

    @staticmethod
    def _check_reserve(reserve):
        # a request holds at most a sequence's tokens: the sums of many stay in int64
        return check_int("reserve", reserve, minimum=0, maximum=MAX_SEQUENCE_TOKENS)

    @property
    def inflight_tokens(self) -> int:
        """Tokens reserved by open requests (``count_inflight=True``)."""
        return int(self._s.meta[M_INFLIGHT])

    def open_requests(self) -> List[Request]:
        """The requests begun and not yet finished or aborted, oldest first
        (to find one whose ``begin`` was interrupted, or audit a slot pool).

        >>> from radix_soa import PrefixCache
        >>> pc = PrefixCache(); r = pc.begin([1, 2])
        >>> pc.open_requests() == [r], pc.abort(r), pc.open_requests()
        (True, None, [])
        """
        with self._lock:
            live: Dict[int, Any] = {}
            out: List[Request] = []
            for key, r in self._requests.items():
                if type(r) is Request:
                    if r.open:
                        live[key] = r
                        out.append(r)
                    continue
                opened = np.flatnonzero(r.open)  # a RequestBatch: its open requests
                if opened.size:
                    live[key] = r
                    out.extend(r[int(i)] for i in opened)
            self._requests = live
            return out

    # ------------------------------------------------------------ whole-cache
    def reset(self) -> None:
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

    def reset_stats(self) -> None:
        """Zero the counters ``stats`` reports."""
        self._writable()
        with self._writing:
            for slot in STAT_SLOTS.values():
                self._s.meta[slot] = 0

    def drop_namespace(self, namespace: Namespace) -> EvictResult:
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

    def _subtree_deepest_first(self, root, roots_depths=None):
        """Non-root node ids under ``root``, deepest first (int64);
        ``roots_depths``: ``_storage.roots_and_depths`` of the tree, when the
        caller has it already."""
        s = self._s
        end = s.node_end
        live = s.length[:end] > 0
        up, depth = roots_depths or roots_and_depths(s.parent[:end].astype(np.int64), live)
        mine = np.flatnonzero(live & (up == root))
        return mine[np.argsort(-depth[mine], kind="stable")]

    # ------------------------------------------------------------ inspection
    def _check_requests(self):
        """Invariant of the open requests (``check_invariants``): the
        in-flight count is their reservations' sum."""
        open_now = self.open_requests()
        if self.inflight_tokens != sum(r.reserved for r in open_now):
            raise InvariantError("in-flight tokens == the open requests' reservations")

    def cached_values(self) -> np.ndarray:
        """Every value the cache holds (one per cached token, all
        namespaces), in node order: to audit a slot pool for leaks."""
        with self._lock:
            s = self._s
            if not s.has_values:
                raise ValueError("this cache keeps no values (values=False)")
            end = s.node_end
            live = np.flatnonzero(s.length[:end] > 0)
            return s.values[span_positions(s.start[live], s.length[live])]

    def to_text(self, tokens_shown: int = 6, max_lines: int = 200) -> str:
        """The tree as text, one node per line indented by depth: its first
        tokens, span length, lock count and (leaves) eviction key (``stamp``:
        the last access tick under lru; see ``layout`` for the others).

        >>> from radix_soa import PrefixCache
        >>> pc = PrefixCache(); _ = pc.insert([1, 2, 3], values=[0, 0, 0])
        >>> _ = pc.insert([1, 2, 9], values=[0, 0, 0])
        >>> print(pc.to_text())
        namespace 0 (3 nodes, 4 tokens)
          [1, 2] len=2
            [3] len=1 stamp=1
            [9] len=1 stamp=2
        """
        with self._lock:
            s = self._s
            end = s.node_end
            parent = s.parent[:end]
            live = np.flatnonzero(s.length[:end] > 0)
            kids: Dict[int, List[int]] = {}
            for v in live.tolist():
                kids.setdefault(int(parent[v]), []).append(v)
            first = {v: int(s.tokens[s.start[v]]) for v in live.tolist()}
            every = roots_and_depths(parent.astype(np.int64), s.length[:end] > 0)
            lines = []
            for key, root in self._roots.items():
                sub = self._subtree_deepest_first(root, every)
                lines.append(f"namespace {key!r} ({sub.size} nodes, "
                             f"{int(s.length[sub].astype(np.int64).sum())} tokens)")
                stack = [(c, 1) for c in sorted(kids.get(root, []), key=first.__getitem__, reverse=True)]
                while stack and len(lines) < max_lines:
                    v, depth = stack.pop()
                    L = int(s.length[v])
                    a = int(s.start[v])
                    shown = ", ".join(str(int(t)) for t in s.tokens[a:a + min(L, tokens_shown)])
                    more = f", ... +{L - tokens_shown}" if L > tokens_shown else ""
                    line = f"{'  ' * depth}[{shown}{more}] len={L}"
                    if int(s.lock[v]):
                        line += f" lock={int(s.lock[v])}"
                    if v not in kids:
                        line += f" stamp={int(s.stamp[v])}"
                    lines.append(line)
                    stack.extend((c, depth + 1)
                                 for c in sorted(kids.get(v, []), key=first.__getitem__, reverse=True))
            if len(lines) >= max_lines:
                lines.append("...")
        return "\n".join(lines)

    def pretty_print(self, **kwargs: int) -> None:
        """Print ``to_text()``."""
        print(self.to_text(**kwargs))
