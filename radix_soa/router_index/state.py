"""``RouterIndex``'s state as plain values and NumPy arrays, out and back
in (``export_state`` / ``RouterIndex.from_state``): what the router's
checkpoint saves, so a change of the index's storage stays in this
package. Bound as methods by ``core.RouterIndex`` (``from_state`` as a
classmethod).
"""

import copy

import numpy as np

from .._kernels import router as router_kernels
from .workers import worker_id

_KINDS = ("fast64", "sha256_cbor")
_SKIP = ("_seen",)  # scratch, not state
# field -> its type; the arrays' shapes are checked against each other below
_EXPECT = {"_page": int, "_event_hash": str, "_strict": bool, "_cols": dict,
           "_col_ids": list, "_order": list, "_status": dict, "_seq": dict,
           "_words": int, "_keys": np.ndarray, "_pkeys": np.ndarray, "_flags": np.ndarray,
           "_masks": np.ndarray, "_meta": np.ndarray, "_table": np.ndarray,
           "_live": np.ndarray}


def export_state(self):
    """A copy of the index's state at one instant, as a dict of plain
    values (ints, strs, bools, floats, None, bytes, and lists, tuples and
    dicts of them) and NumPy arrays, copied under the index's lock: what
    ``RouterIndex.from_state`` takes back (the router's checkpoint saves it).

    >>> import radix_soa as rs
    >>> ix = rs.RouterIndex(page_size=2, workers=["a"])
    >>> ix.apply("a", [rs.BlockStored([7], None, [1, 2], 2)])
    >>> rs.RouterIndex.from_state(ix.export_state()).overlap_scores([1, 2])
    {'a': 2}
    """
    with self._lock:
        state = self.__getstate__()
        return {k: (v.copy() if isinstance(v, np.ndarray) else copy.deepcopy(v))
                for k, v in state.items() if k not in _SKIP}


def _check(state):
    """``ValueError`` (``TypeError`` for a wrong type) naming what in
    ``state`` is not an index's state; the arrays checked against each
    other before any kernel reads them."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict; got {type(state).__name__}")
    for k, t in _EXPECT.items():
        if not isinstance(state.get(k), t):
            raise ValueError(f"the index state's {k} is missing or not a {t.__name__}")
    if state["_event_hash"] not in _KINDS or state["_page"] < 1:
        raise ValueError("the index state's page size or event hash is not valid")
    keys, table = state["_keys"], state["_table"]
    n, words, slots = keys.shape[0], state["_words"], table.shape[0]
    ehash = state.get("_ehash", np.zeros(0, np.uint64))
    etable = state.get("_etable", np.zeros(0, np.int32))
    if (keys.dtype != np.uint64 or keys.ndim != 1
            or state["_pkeys"].shape not in ((n,), (0,)) or state["_pkeys"].dtype != np.uint64
            or state["_flags"].shape != (n,) or state["_flags"].dtype != np.int8
            or state["_masks"].shape != (n, words) or state["_masks"].dtype != np.int64
            or state["_live"].shape != (words,) or table.dtype != np.int32 or slots < 1 or slots & (slots - 1)
            or not isinstance(ehash, np.ndarray) or not isinstance(etable, np.ndarray)
            or ehash.dtype != np.uint64 or etable.dtype != np.int32
            or (ehash.shape, etable.shape) != (((n,), (slots,)) if state.get("_eh_on")
                                               else ((0,), (0,)))):
        raise ValueError("the index state's arrays do not fit together")
    try:
        order = [worker_id(w) for w in state["_order"]]
        if sorted(map(repr, order)) != sorted(repr(w) for w in state["_col_ids"]
                                              if w is not None) or \
                any(state["_cols"].get(w) is None or not 0 <= state["_cols"][w] < 64 * words
                    for w in order):
            raise ValueError("the workers and their columns disagree")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the index state's workers are not valid ({exc})") from None
    _check_contents(state)


def _check_contents(state):
    """The values the kernels index by, checked (a node id past the arrays,
    a full map a probe would loop in): the high-water mark, the flags, the
    bookkeeping words, the stamps and the handle maps. The free list and
    the tables are not trusted at all: ``from_state`` rebuilds them."""
    keys, flags, meta = state["_keys"], state["_flags"], state["_meta"]
    n, words = keys.shape[0], state["_words"]
    if meta.dtype != np.int64 or meta.shape != (router_kernels.X_SIZE,):
        raise ValueError("the index state's meta is not an index's")
    end = int(meta[router_kernels.X_END])
    if not 0 <= end <= n or ((flags != -1) & (flags != 0) & (flags != 1)).any() \
            or (flags[end:] != -1).any():
        raise ValueError("the index state's node flags or high-water mark are not valid")
    live = int(np.count_nonzero(flags >= 0))
    if 4 * live > 3 * state["_table"].shape[0]:
        raise ValueError("the index state's table is too small for its nodes")
    forgot = state.get("_forgot")
    if not isinstance(forgot, np.ndarray) or forgot.dtype != np.int64 \
            or forgot.shape != (64 * words,) or state["_live"].dtype != np.int64:
        raise ValueError("the index state's per-worker counts do not fit its workers")
    stamps = state.get("_stamps")
    budget = state.get("_max_bytes")
    if not isinstance(stamps, np.ndarray) or stamps.dtype != np.int64 or \
            stamps.shape != ((0,) if budget is None else (n + 1,)):
        raise ValueError("the index state's stamps do not fit its nodes and budget")
    maps = state.get("_hmaps")
    cols = set(state["_cols"].values())
    if not isinstance(maps, dict) or not cols <= set(maps) or \
            any(not isinstance(c, int) or not 0 <= c < 64 * words for c in maps):
        raise ValueError("the index state's handle maps do not fit its columns")
    for c, m in maps.items():
        ok = isinstance(m, list) and len(m) == 3 and all(
            isinstance(a, np.ndarray) and a.dtype == np.uint64 and a.ndim == 1 for a in m[:2])
        if ok:
            hk, hv, count = m
            size = hk.shape[0]
            used = int(np.count_nonzero(hk))
            ok = (hv.shape == hk.shape and (size == 0 or size >= 8 and not size & (size - 1))
                  and isinstance(count, int) and count == used and 4 * used <= 3 * size)
        if not ok:
            raise ValueError(f"the index state's handle map of column {c} is not valid")


def _rebuild(index):
    """The derived parts of a checked state made afresh: the free list
    (through the free nodes' keys), the live count, both tables, the
    budget's cache and the result columns."""
    meta, flags, keys = index._meta, index._flags, index._keys
    end = int(meta[router_kernels.X_END])
    free = np.flatnonzero(flags[:end] < 0)
    if free.shape[0]:
        keys[free[:-1]] = free[1:].astype(np.uint64)
        keys[free[-1]] = np.uint64(0xFFFFFFFFFFFFFFFF)  # -1: the end of the list
    meta[router_kernels.X_FREE] = int(free[0]) if free.shape[0] else -1
    meta[router_kernels.X_LIVE] = end - free.shape[0]
    index._table[:] = -1
    index._etable[:] = -1
    router_kernels.rx_table_rebuild(index._table, keys, flags, end, index._etable, index._ehash)
    index._budget_words, index._budget_nodes = None, 0
    index._columns_changed()


def from_state(cls, state):
    """The index whose state ``export_state`` gave, its fields checked
    first (``ValueError`` / ``TypeError`` saying what does not fit); the
    arrays are taken, not copied.

    >>> import radix_soa as rs
    >>> rs.RouterIndex.from_state({"_page": "16"})
    Traceback (most recent call last):
    ...
    ValueError: the index state's _page is missing or not a int
    """
    _check(state)
    index = cls.__new__(cls)
    index.__setstate__(dict(state))
    _rebuild(index)
    return index
