"""Scans of input arrays that NumPy would need several passes for.

Call graph (callers after their callees): count_zero_one (input checks)
"""

from .config import kernel


@kernel
def count_zero_one(a):
    """How many elements of int64 array ``a`` are 0 or 1 (the values a bool
    becomes when packed; the input layer checks those positions' types)."""
    n = 0
    for i in range(a.shape[0]):
        if a[i] == 0 or a[i] == 1:
            n += 1
    return n
