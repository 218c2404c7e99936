"""The request lifecycle of ``PrefixCache`` (SGLang's
``cache_unfinished_req`` / ``cache_finished_req``): ``begin`` /
``checkpoint`` / ``finish`` / ``abort`` and ``open_requests``.

Each transition is one kernel call (``_kernels/lifecycle``) that changes
the tree, the in-flight count and the request's state together.
"""

from typing import TYPE_CHECKING, Any, Dict, List, Optional

import numpy as np

from .._input.sequence import as_tokens
from .._input.types import Namespace, TokenSequence
from .._input.validate import MAX_SEQUENCE_TOKENS, check_int
from .._kernels import lifecycle as lifecycle_kernels
from .._kernels.layout import (DONE, M_INFLIGHT, M_LOCKED_TOKENS, M_TOKENS, R_CACHED, R_RESERVED,
                               REQUEST_SIZE, ROOM)
from .._tree.results import Finished
from .._tree.status import BEGIN, TRANSITION, status_error
from .events import begin_log_size, log_size
from .requests import Request

if TYPE_CHECKING:
    from .core import PrefixCache

_NO_VALUES = np.empty(0, np.int64)  # ``out`` of a call that writes no values
_STATE_ROWS = 64  # request state arrays allocated at a time (``_state_row``)


def begin(self: "PrefixCache", tokens: TokenSequence, namespace: Namespace = None,
          reserve: Optional[int] = None, priority: int = 0) -> Request:
    """A request arrives: match ``tokens`` and lock the cached prefix.

    With ``count_inflight=True`` the request also reserves ``reserve``
    tokens (default: its uncached tokens) against the capacity, evicting
    what it must (``Request.evicted``: free those slots) or raising
    ``CacheFullError`` when locked and reserved tokens leave no room
    (nothing changed: no split, no lock, no statistics). Returns a
    ``Request`` for ``checkpoint``/``finish``/``abort``; until then it
    is listed by ``open_requests()`` (listed before its kernel runs, so a
    ``begin`` interrupted after the kernel is found there too).

    Parameters
    ----------
    tokens : sequence of int
        The request's tokens (its prompt).
    namespace : int, str or None
        Where to match (None: the default namespace); an unknown namespace
        is a miss and creates nothing.
    reserve : int or None
        Tokens to hold in flight with ``count_inflight=True`` (None: the
        uncached tokens).
    priority : int
        Of the request's inserts (see ``insert``).

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
    namespace = 0 if namespace is None else namespace  # None: the default namespace
    count = self._count_inflight
    with self._lock:
        if self._readers:
            self._drain_readers()
        s = self._s  # under the lock: a reset() may have replaced it
        root = self._roots.get(namespace, -1) if type(namespace) is int else -1
        if root < 0:
            root, _ = self._root(namespace, create=False)
        known = root >= 0
        if not known:  # an unknown namespace: a miss, and nothing is created
            root = s.root
        out = np.empty(q.shape[0], np.int64) if s.has_values else _NO_VALUES
        capacity = self._cap if count else -1  # what a reservation counts against
        need = q.shape[0] if reserve < 0 else reserve
        evict_out = _NO_VALUES if capacity < 0 else self._begin_evict_out(capacity, need)
        request = Request(self, namespace, out, evict_out, priority, self._state_row())
        self._requests[id(request)] = request  # listed before its kernel runs (see above)
        st = request._st
        ev = None if self._events is None else self._events.ev(
            s, self._ns_keys, begin_log_size(self, capacity, need))
        status = lifecycle_kernels.req_begin(s.directory, s.like, root, known, q, self._page, out,
                                             count, capacity, reserve, evict_out, st, ev)
        if status == ROOM:
            status = s.run(lambda: lifecycle_kernels.req_begin(
                s.directory, s.like, root, known, q, self._page, out, count, capacity, reserve,
                evict_out, st, ev))
        if status != DONE:
            del self._requests[id(request)]
            raise status_error(BEGIN, status, self, reserve)
    return request


def _state_row(self: "PrefixCache"):
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


def _begin_evict_out(self: "PrefixCache", capacity, need):
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


def checkpoint(self: "PrefixCache", request: Request, tokens: TokenSequence,
               values: Optional[TokenSequence]) -> Optional[np.ndarray]:
    """Chunked prefill: cache what ``request`` has computed so far
    (``tokens`` with their ``values``) and move its lock to the new
    node. Returns the slots the caller must free now: values of tokens
    someone else cached first (duplicates), then what making room
    evicted. The partial last page stays the request's."""
    return self._transition(lifecycle_kernels.req_checkpoint, request, tokens, values)


def finish(self: "PrefixCache", request: Request, tokens: TokenSequence,
           values: Optional[TokenSequence]) -> Finished:
    """A request is done: cache ``tokens`` (prompt + output, whole pages)
    with their ``values`` (one per token, or for the whole pages only),
    release its lock and its in-flight reservation. Returns
    ``Finished(cached, node, free, evicted)``: ``free`` holds the slots the caller must free (duplicates of tokens
    already cached, and the partial last page), ``evicted`` what making
    room freed (free those too). Interrupted, it either happened or did
    not: ``request.steps`` tells, and ``request.result`` is its result."""
    return self._transition(lifecycle_kernels.req_finish, request, tokens, values)


def abort(self: "PrefixCache", request: Request) -> None:
    """Release ``request``'s lock and reservation without caching it."""
    with self._lock:
        if self._readers:
            self._drain_readers()
        self._check_open(request)
        request._stage(None)  # an abort has no result
        status = lifecycle_kernels.req_abort(self._s.directory, self._s.like, request._st)
        if status != DONE:
            raise status_error(TRANSITION, status, self, request)
        self._requests.pop(id(request), None)


def _transition(self: "PrefixCache", kernel, request, tokens, values):
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
        ev = None if self._events is None else self._events.ev(
            s, self._ns_keys, log_size(n, self._page))
        status = kernel(s.directory, s.like, root, ns, q, n, vals, self._page, cap, out, priority,
                        st, ev)
        if status == ROOM:
            status = s.run(lambda: kernel(s.directory, s.like, root, ns, q, n, vals, self._page,
                                          cap, out, priority, st, ev))
        if root < 0:
            self._roots_in_sync()
        if status != DONE:
            self._check_open(request)  # a closed request's own error first
            raise status_error(TRANSITION, status, self, request)
        if finishing:
            self._requests.pop(id(request), None)
        return request._result(st.tolist(), out)


def _check_open(self: "PrefixCache", request):
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


def _check_reserve(reserve):
    # a request holds at most a sequence's tokens: the sums of many stay in int64
    return check_int("reserve", reserve, minimum=0, maximum=MAX_SEQUENCE_TOKENS)


def open_requests(self: "PrefixCache") -> List[Request]:
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
