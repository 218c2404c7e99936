"""Turning one user sequence into a contiguous int64 NumPy array, or a clear error.

Kernels compare int64 queries against a token buffer of any supported dtype,
so every query becomes int64; a value that does not fit the tree's dtype is
checked only where it would be stored.
"""

import functools
import operator
import re
import struct
from collections.abc import Sequence

import numpy as np

from .._kernels.scan import count_zero_one
from .validate import MAX_SEQUENCE_TOKENS

_INT64 = np.dtype(np.int64)
_I64_MAX = np.iinfo(np.int64).max


def as_tokens(seq):
    """``seq`` as a 1-D C-contiguous int64 array (no copy for such arrays).

    Accepts lists, tuples and ranges of ints and 1-D NumPy integer arrays.
    Raises ``TypeError`` for non-integer elements or containers,
    ``ValueError`` for arrays that are not 1-D and ``OverflowError`` for
    values outside the signed 64-bit range.

    >>> as_tokens([1, 2, 3])
    array([1, 2, 3])
    """
    if type(seq) is np.ndarray:
        if seq.dtype == _INT64 and seq.ndim == 1 and seq.flags.c_contiguous:
            return seq
        return _array_tokens(seq)
    if isinstance(seq, (list, tuple)):
        return _list_tokens(seq)
    if isinstance(seq, range):
        return _range_tokens(seq)
    if isinstance(seq, np.ma.MaskedArray):
        raise TypeError("a masked array is not a token sequence; fill or compress it first")
    if isinstance(seq, (str, bytes, bytearray, memoryview)):
        raise _container_error(seq)
    if hasattr(seq, "__array__") or hasattr(seq, "__array_interface__"):
        return _array_tokens(np.asarray(seq))
    if isinstance(seq, Sequence):
        return _list_tokens(list(seq))
    raise _container_error(seq)


def as_values(seq):
    """``as_tokens`` for per-token values: the same checks, with errors that
    say "value".

    >>> as_values([1, 2.5])
    Traceback (most recent call last):
    ...
    TypeError: values must be integers; element 1 is float 2.5
    """
    try:
        return as_tokens(seq)
    except (TypeError, ValueError, OverflowError) as exc:
        message = re.sub(r"\btoken(s?)\b", r"value\1", str(exc))
        message = message.replace("a sequence must", "values must")
        raise type(exc)(message) from None


def _container_error(seq):
    return TypeError("a sequence must be a list, tuple or range of ints or a 1-D NumPy "
                     f"integer array; got {type(seq).__name__}")


def _array_tokens(arr):
    if arr.ndim != 1:
        raise ValueError(f"a sequence must be 1-D; got an array of shape {arr.shape}")
    if arr.shape[0] > MAX_SEQUENCE_TOKENS:  # before a conversion could copy it
        raise OverflowError(f"a sequence of {arr.shape[0]} tokens is longer than the "
                            f"{MAX_SEQUENCE_TOKENS} a tree can hold")
    kind = arr.dtype.kind
    if kind == "i":
        return np.ascontiguousarray(arr, dtype=_INT64)
    if kind == "u":
        if arr.dtype.itemsize == 8 and arr.size and int(arr.max()) > _I64_MAX:
            raise OverflowError(
                f"token {int(arr.max())} does not fit in a signed 64-bit integer")
        return np.ascontiguousarray(arr, dtype=_INT64)
    if kind == "O":
        return _list_tokens(arr.tolist())
    raise TypeError(f"a sequence must hold integers; got an array of dtype {arr.dtype}")


def _range_tokens(r):
    """A range in O(1) checks: its length and both ends must fit."""
    try:
        n = len(r)
    except OverflowError:
        n = MAX_SEQUENCE_TOKENS + 1
    if n > MAX_SEQUENCE_TOKENS:
        raise OverflowError(f"a range of more than {MAX_SEQUENCE_TOKENS} tokens is not a "
                            "sequence a tree can hold")
    if n and not (-_I64_MAX - 1 <= min(r[0], r[-1]) and max(r[0], r[-1]) <= _I64_MAX):
        raise OverflowError(f"token {r[0] if abs(r[0]) > _I64_MAX else r[-1]} does not fit in a "
                            "signed 64-bit integer")
    if n == 0:
        return np.empty(0, _INT64)
    return np.arange(r[0], r[-1] + (1 if r.step > 0 else -1), r.step, dtype=_INT64)[:n]


@functools.lru_cache(maxsize=8192)
def _packer(n):
    return struct.Struct(f"{n}q")


def _list_tokens(seq):
    # struct packing is the fastest way from Python ints to int64 (about 3x
    # np.fromiter), and it rejects non-integers and out-of-range values.
    # The result is read-only (backed by bytes); kernels only read queries.
    try:
        tokens = np.frombuffer(_packer(len(seq)).pack(*seq), dtype=_INT64)
    except (struct.error, TypeError, OverflowError) as exc:
        raise _element_error(seq) from exc
    # struct packs True/False as 1/0; only those positions can hold a bool,
    # so only they are type-checked (a BOS token of 1 costs one check).
    found = has_bool(seq, tokens)
    if found:
        i = found - 1
        raise TypeError(f"tokens must be integers; element {i} is bool {seq[i]!r} "
                        "(bools are not tokens)")
    return tokens


_BOOLS = (bool, np.bool_)


def has_bool(items, tokens, offsets=None):
    """1 + the position of the first bool of list ``items`` (packed as
    ``tokens``; with ``offsets``, ``items`` is a list of sequences packed one
    after another, at those offsets), or 0: only the positions packed as 0
    or 1 are looked at (one kernel pass finds whether there are any)."""
    if not count_zero_one(tokens):
        return 0
    for i in np.flatnonzero(tokens.view(np.uint64) <= 1).tolist():
        if offsets is None:
            x = items[i]
        else:
            row = int(np.searchsorted(offsets, i, side="right")) - 1
            x = items[row][i - int(offsets[row])]
        if isinstance(x, _BOOLS):
            return i + 1
    return 0


def _element_error(seq):
    """The error for the first element of ``seq`` that is not an int64."""
    for i, x in enumerate(seq):
        try:
            v = operator.index(x)
        except TypeError:
            if isinstance(x, (list, tuple, np.ndarray)):
                return TypeError(f"nested sequences are not tokens (element {i} is a "
                                 f"{type(x).__name__})")
            return TypeError(f"tokens must be integers; element {i} is "
                             f"{type(x).__name__} {x!r}")
        if not -_I64_MAX - 1 <= v <= _I64_MAX:
            return OverflowError(f"token {v} at position {i} does not fit in a signed "
                                 "64-bit integer")
    return TypeError("tokens must be integers")


def check_fits(tokens, dtype):
    """Raise ``OverflowError`` unless every int64 in ``tokens`` fits ``dtype``."""
    if dtype == _INT64 or tokens.size == 0:
        return
    info = np.iinfo(dtype)
    lo = int(tokens.min())
    hi = int(tokens.max())
    if lo < info.min or hi > info.max:
        bad = lo if lo < info.min else hi
        raise OverflowError(
            f"token {bad} does not fit the tree's dtype {dtype.name} "
            f"[{info.min}, {info.max}]")
