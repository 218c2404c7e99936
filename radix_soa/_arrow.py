"""Arrow list arrays as CSR ``(flat, offsets)`` views (pyarrow is optional
and imported only when an Arrow array arrives).

Reads the list offsets and the integer child values in place: the values
are a zero-copy NumPy view when they are int64 or int32 without nulls; the
offsets (n + 1 small integers) are rebased to start at 0 for a sliced array.
"""

import numpy as np


def arrow_csr(arr):
    """A list of ``(values, offsets)`` NumPy pairs, one per chunk."""
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        out = []
        for chunk in arr.chunks:
            out.extend(arrow_csr(chunk))
        return out or [(np.empty(0, np.int64), np.zeros(1, np.int64))]
    if isinstance(arr, (pa.ListArray, pa.LargeListArray)):
        if arr.null_count:
            raise ValueError(f"Arrow list array has {arr.null_count} null lists; a batch "
                             "needs a sequence in every row")
        offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        lo, hi = int(offsets[0]), int(offsets[-1])
        values = arr.values.slice(lo, hi - lo)
        return [(_values_array(values), offsets - lo)]
    if isinstance(arr, pa.FixedSizeListArray):
        if arr.null_count:
            raise ValueError(f"Arrow list array has {arr.null_count} null lists; a batch "
                             "needs a sequence in every row")
        size = arr.type.list_size
        values = arr.flatten()
        return [(_values_array(values), np.arange(len(arr) + 1, dtype=np.int64) * size)]
    raise TypeError("Arrow input must be a ListArray, LargeListArray, FixedSizeListArray or "
                    f"ChunkedArray of integer lists; got {type(arr).__name__}")


def _values_array(values):
    import pyarrow.types as pat

    if not pat.is_integer(values.type):
        raise TypeError(f"Arrow list values must be integers; got {values.type}")
    if values.null_count:
        raise ValueError(f"Arrow list values hold {values.null_count} nulls")
    return values.to_numpy(zero_copy_only=True)
