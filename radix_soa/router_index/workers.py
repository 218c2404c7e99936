"""``RouterIndex``'s workers: their ids, registration and removal, and
their status (``exact`` or ``degraded`` with the first problem). Bound as
methods by ``core.RouterIndex``.
"""

import operator

import numpy as np

__all__ = ["worker_id"]


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
        self._hmaps.pop(col, None)
        self._col_ids[col] = None
        self._order.remove(worker)
        self._status.pop(worker, None)
        self._seq.pop(worker, None)
        self._syncing.pop(worker, None)
        self._live[w] &= ~bit
        self._columns_changed()


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

def degraded(self):
    """The degraded workers, in registration order: a dict from worker
    id to the first problem since it was last exact (``in``, ``len``
    and iteration read it as the set of them)."""
    with self._lock:
        return {w: self._status[w] for w in self._order if w in self._status}
