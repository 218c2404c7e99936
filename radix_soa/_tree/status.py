"""The one map from a kernel's status to the exception its caller raises.

A kernel never raises: it returns a status (``_kernels.layout``: ``DONE``,
``FULL``, ``LIMIT``, ``STALE``, ``MISMATCH``, ...). The product turns every
status but ``DONE`` into an exception here, in one line at the call site::

    if status != DONE:
        raise status_error(LOCK, status, self, node, delta, s.lock)

``status_error(op, status, cache, *facts)`` looks up the message of
``(op, status)``: ``op`` names the kind of call (one constant per kind,
below), ``cache`` is read through its public properties only (``capacity``,
``total_tokens``, ``locked_tokens``, ``inflight_tokens``) and ``facts`` are
what the message names (a handle, a request, a row of a batch). It is only
ever called on the error path, so it costs a successful call nothing.
"""

from typing import Any, Callable, Dict

from .._kernels.layout import FULL, LIMIT, LOCK_LIMIT, MISMATCH, STALE
from .results import CacheFullError

__all__ = ["status_error", "INSERT", "LOCK", "TOUCH", "BEGIN", "TRANSITION", "BEGIN_BATCH",
           "BEGUN_VALUES"]

INSERT = "insert"              # facts: the tokens asked for (FULL only)
LOCK = "lock"                  # facts: the handle, +1/-1, the lock counts (``TreeStorage.lock``)
TOUCH = "touch"                # facts: the handle
BEGIN = "begin"                # facts: the reservation asked for (-1: the uncached tokens)
TRANSITION = "transition"      # facts: the ``Request`` (checkpoint, finish, abort, their batches)
BEGIN_BATCH = "begin_batch"    # facts: the row of the batch refused
BEGUN_VALUES = "begun_values"  # facts: the rows asked for (a list)

_LOCKS = f"a path holds at most {LOCK_LIMIT} locks at once (int32 counts)"
_ID_MASK = (1 << 32) - 1  # a handle's node id (``prefix_cache.handles``)


def _full(cache: Any, n: int) -> Exception:
    return CacheFullError(
        f"no room to insert {n} tokens: capacity {cache.capacity}, "
        f"{cache.total_tokens} cached of which {cache.locked_tokens} locked, and the "
        "request's own path is never evicted")


def _stale(node: Any) -> Exception:
    return ValueError(f"node handle {node} does not refer to a live node of this cache")


def _lock(status: int, cache: Any, node: Any, delta: int, lock: Any) -> Exception:
    if status == STALE:
        return _stale(node)
    if delta > 0:
        return OverflowError(f"node handle {node}: a path holds at most {LOCK_LIMIT} locks "
                             "at once (int32 counts)")
    return ValueError(f"node handle {node} holds no lock of its own" if lock[node & _ID_MASK]
                      else f"node handle {node} is not locked")


def _begin(status: int, cache: Any, reserve: int) -> Exception:
    if status == LIMIT:
        return OverflowError(_LOCKS)
    return CacheFullError(
        f"no room to reserve {'the uncached' if reserve < 0 else reserve} tokens: "
        f"capacity {cache.capacity}, {cache.total_tokens} cached "
        f"({cache.locked_tokens} locked), {cache.inflight_tokens} in flight")


def _transition(status: int, cache: Any, request: Any) -> Exception:
    if status == FULL:
        return _full(cache, request.cached)
    if status == MISMATCH:
        return ValueError(f"tokens must start with the request's {request.cached} cached "
                          "tokens (its locked prefix)")
    if status == LIMIT:
        return OverflowError(_LOCKS)
    return ValueError("the request no longer holds its lock (an unlock() of its node "
                      "released it); abort() the request")


def _begin_batch(status: int, cache: Any, i: int) -> Exception:
    if status == LIMIT:
        return OverflowError(f"request {i} of the batch: {_LOCKS}; no request of the batch "
                             "was begun")
    return CacheFullError(
        f"request {i} of the batch: no room to reserve its tokens: capacity "
        f"{cache.capacity}, {cache.total_tokens} cached ({cache.locked_tokens} locked), "
        f"{cache.inflight_tokens} in flight; no request of the batch was begun")


def _begun_values(status: int, cache: Any, rows: Any) -> Exception:
    return ValueError(f"request {rows[-1 - status] if status < 0 else rows[0]} of the "
                      "batch is closed (or lost its lock): the values its begin matched "
                      "are read from the cache while it is open; pass begin_batch(out=) "
                      "to keep them")


_MAP: Dict[str, Callable[..., Exception]] = {
    INSERT: lambda status, cache, n: _full(cache, n),
    LOCK: _lock,
    TOUCH: lambda status, cache, node: _stale(node),
    BEGIN: _begin,
    TRANSITION: _transition,
    BEGIN_BATCH: _begin_batch,
    BEGUN_VALUES: _begun_values,
}


def status_error(op: str, status: int, cache: Any, *facts: Any) -> Exception:
    """The exception to raise for kernel ``status`` (not ``DONE``) returned
    to a call of kind ``op`` on ``cache``; ``facts``: what its message
    names (see each kind's constant).

    >>> from radix_soa._kernels.layout import STALE
    >>> status_error(TOUCH, STALE, None, 7)
    ValueError('node handle 7 does not refer to a live node of this cache')
    """
    return _MAP[op](status, cache, *facts)
