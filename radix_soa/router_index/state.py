"""``RouterIndex``'s state as plain values and NumPy arrays, out and back
in (``export_state`` / ``RouterIndex.from_state``): what the router's
checkpoint saves, so a change of the index's storage stays in this
package. Bound as methods by ``core.RouterIndex``.
"""

import copy

import numpy as np

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


@classmethod
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
    return index
