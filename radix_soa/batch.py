"""Many sequences as one flat buffer plus offsets (CSR), from lists, NumPy
or Arrow.

Flat values + offsets is the ecosystem's ragged-array layout (scipy CSR,
Arrow ``ListArray``); batch kernels loop over it in compiled code.

>>> b = pack([[1, 2, 3], [4], (5, 6)])
>>> b.flat.tolist(), b.offsets.tolist(), len(b)
([1, 2, 3, 4, 5, 6], [0, 3, 4, 6], 3)
>>> b[2].tolist()
[5, 6]
"""

import struct
from itertools import chain

import numpy as np

from ._arrow import arrow_csr
from ._sequence import as_tokens, has_bool

_INT64 = np.dtype(np.int64)
_INT32 = np.dtype(np.int32)
_I64_MAX = np.iinfo(np.int64).max


class Batch:
    """Sequences ``flat[offsets[i]:offsets[i+1]]`` for ``i < len(batch)``.

    ``flat`` is a 1-D int64 array (int32 is kept as is, so an Arrow or
    Hugging Face int32 column is read without a copy; other integer dtypes
    are converted); ``offsets`` is 1-D int64 of length n + 1, starting at 0,
    non-decreasing and ending at ``len(flat)``. Both are validated here, and
    the batch keeps read-only views: ``offsets`` is copied (n + 1 integers),
    so changing the caller's array later cannot make a kernel read out of
    bounds; ``flat`` is a view (changing its values changes only what is
    looked up).

    >>> b = Batch(np.array([7, 8, 9]), np.array([0, 2, 3]))
    >>> [s.tolist() for s in b]
    [[7, 8], [9]]
    >>> Batch(np.array([7, 8, 9]), np.array([0, 5]))
    Traceback (most recent call last):
    ...
    ValueError: offsets must end at len(flat) = 3; got 5
    """

    __slots__ = ("flat", "offsets")

    def __init__(self, flat, offsets):
        flat = _flat_array(flat).view()
        flat.flags.writeable = False
        self.flat = flat
        self.offsets = _offsets_array(offsets, flat.shape[0])

    def __len__(self):
        return self.offsets.shape[0] - 1

    def __getitem__(self, i):
        """Sequence ``i`` (a view), or for a slice with step 1 a ``Batch`` of
        those sequences over the same buffer.

        >>> b = pack([[1], [2, 3], [4, 5, 6]])
        >>> b[1].tolist(), [s.tolist() for s in b[1:]]
        ([2, 3], [[2, 3], [4, 5, 6]])
        """
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self))
            if step != 1:
                raise ValueError("a Batch slice must be contiguous (step 1)")
            hi = max(lo, hi)
            off = self.offsets[lo:hi + 1]
            return Batch(self.flat[off[0]:off[-1]], off - off[0])
        return self.flat[self.offsets[i]:self.offsets[i + 1]]

    def __iter__(self):
        off = self.offsets
        for i in range(len(self)):
            yield self.flat[off[i]:off[i + 1]]

    @property
    def lengths(self):
        """Tokens per sequence (int64 array)."""
        return np.diff(self.offsets)

    @property
    def num_tokens(self):
        return int(self.flat.shape[0])

    def __repr__(self):
        return f"Batch(sequences={len(self)}, tokens={self.num_tokens}, dtype={self.flat.dtype.name})"

    def __eq__(self, other):
        return (isinstance(other, Batch) and np.array_equal(self.offsets, other.offsets)
                and np.array_equal(self.flat, other.flat))

    __hash__ = None


def _flat_array(flat):
    if not isinstance(flat, np.ndarray):
        raise TypeError(f"flat must be a NumPy integer array; got {type(flat).__name__}")
    if flat.ndim != 1:
        raise ValueError(f"flat must be 1-D; got shape {flat.shape}")
    if flat.dtype in (_INT64, _INT32):
        return np.ascontiguousarray(flat)
    if flat.dtype.kind == "u" and flat.dtype.itemsize == 8 and flat.size and int(flat.max()) > _I64_MAX:
        raise OverflowError(f"token {int(flat.max())} does not fit in a signed 64-bit integer")
    if flat.dtype.kind not in "iu":
        raise TypeError(f"flat must hold integers; got dtype {flat.dtype}")
    return flat.astype(_INT64)


def _offsets_array(offsets, n_flat):
    off = np.asarray(offsets)
    if off.ndim != 1 or off.shape[0] < 1:
        raise ValueError(f"offsets must be 1-D with at least one entry; got shape {off.shape}")
    if off.dtype.kind not in "iu":
        raise TypeError(f"offsets must be integers; got dtype {off.dtype}")
    off = np.array(off, dtype=_INT64, order="C", copy=True)  # ours: the caller cannot move it
    off.flags.writeable = False
    if off[0] != 0:
        raise ValueError(f"offsets must start at 0; got {int(off[0])}")
    if off[-1] != n_flat:
        raise ValueError(f"offsets must end at len(flat) = {n_flat}; got {int(off[-1])}")
    if off.shape[0] > 1 and np.any(off[1:] < off[:-1]):
        i = int(np.flatnonzero(off[1:] < off[:-1])[0])
        raise ValueError(f"offsets must be non-decreasing; offsets[{i + 1}] < offsets[{i}]")
    return off


def pack(seqs):
    """Pack sequences into a ``Batch``.

    ``seqs`` may be a list or tuple of lists / tuples / ranges / 1-D integer
    arrays (mixed freely), a 2-D integer array (one sequence per row) or
    a ``Batch`` (returned as is). One rule everywhere: a 2-tuple of NumPy
    arrays is a CSR pair ``(flat, offsets)`` (``csr(flat, offsets)`` says so
    explicitly); pass two sequences as a list. Errors name the offending
    sequence.

    >>> pack([np.array([1, 2]), [3]]).offsets.tolist()
    [0, 2, 3]
    >>> pack([[1, 2], [3.5]])
    Traceback (most recent call last):
    ...
    TypeError: sequence 1: tokens must be integers; element 0 is float 3.5
    """
    if isinstance(seqs, Batch):
        return seqs
    if _is_csr_pair(seqs):
        return csr(*seqs)
    if isinstance(seqs, np.ndarray):
        if seqs.ndim != 2:
            raise ValueError("pack takes a sequence of sequences or a 2-D array; got a "
                             f"{seqs.ndim}-D array")
        flat = _flat_array(np.ascontiguousarray(seqs).reshape(-1))
        n, m = seqs.shape
        return Batch(flat, np.arange(n + 1, dtype=_INT64) * m)
    if isinstance(seqs, (str, bytes, bytearray)) or not hasattr(seqs, "__iter__"):
        raise TypeError(f"pack takes a sequence of sequences; got {type(seqs).__name__}")
    items = seqs if isinstance(seqs, (list, tuple)) else list(seqs)
    if all(type(x) in (list, tuple) for x in items):
        flat = _pack_python(items)
    else:
        flat = None
    if flat is None:
        arrays = [_item_tokens(i, x) for i, x in enumerate(items)]
        flat = np.concatenate(arrays) if arrays else np.empty(0, _INT64)
        lengths = [a.shape[0] for a in arrays]
    else:
        lengths = [len(x) for x in items]
    offsets = np.zeros(len(items) + 1, _INT64)
    np.cumsum(lengths, out=offsets[1:])
    return Batch(flat, offsets)


def csr(flat, offsets):
    """The CSR pair ``(flat, offsets)`` as a ``Batch``; a 2-tuple of arrays
    means the same wherever a batch is taken.

    >>> csr(np.array([5, 6, 7]), np.array([0, 3])).lengths.tolist()
    [3]
    >>> csr(np.array([5, 6, 7]), np.array([0, 5]))
    Traceback (most recent call last):
    ...
    ValueError: offsets must end at len(flat) = 3; got 5 (a 2-tuple of NumPy arrays is read as (flat, offsets); pass several sequences as a list)
    """
    try:
        return Batch(flat, offsets)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{exc} (a 2-tuple of NumPy arrays is read as (flat, offsets); pass "
                        "several sequences as a list)") from None


def _is_csr_pair(obj):
    return (isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], np.ndarray)
            and isinstance(obj[1], np.ndarray))


def _pack_python(items):
    """Flat int64 array of lists of Python ints, or None if an element is not
    an int64 (the slow path then names it)."""
    total = sum(len(x) for x in items)
    try:
        raw = struct.Struct(f"{total}q").pack(*chain.from_iterable(items))
    except (struct.error, TypeError, OverflowError):
        return None
    flat = np.frombuffer(bytearray(raw), dtype=_INT64)
    if has_bool(items, flat, nested=True):
        return None
    return flat


def _item_tokens(i, x):
    try:
        return as_tokens(x)
    except (TypeError, ValueError, OverflowError) as exc:
        raise type(exc)(f"sequence {i}: {exc}") from None


# ---------------------------------------------------------------- threads

# Below this many query tokens a batch runs serially: starting Numba's
# thread pool costs more than the work (measured in asv_bench/bench.py batch).
PARALLEL_MIN_TOKENS = 1 << 18


def use_parallel(parallel, batches):
    """Resolve a ``parallel=`` argument: True/False as given; None (the
    default) picks threads only for batches large enough to gain from them
    and when Numba has more than one thread (``NUMBA_NUM_THREADS``)."""
    if parallel is not None:
        return bool(parallel)
    import numba

    return (numba.get_num_threads() > 1
            and sum(b.num_tokens for b in batches) >= PARALLEL_MIN_TOKENS)


def map_batches(batches, dtype, fill):
    """One result per sequence over several batches: ``fill(batch, out)``
    writes batch's results into ``out`` (zeros of ``dtype``); the parts are
    concatenated (one batch: its array as is)."""
    parts = []
    for b in batches:
        out = np.zeros(len(b), dtype)
        fill(b, out)
        parts.append(out)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


# ---------------------------------------------------------------- any input

def pack_one(obj):
    """``as_batches(obj)`` as one ``Batch`` (chunks concatenated)."""
    parts = as_batches(obj)
    if len(parts) == 1:
        return parts[0]
    lengths = np.concatenate([p.lengths for p in parts])
    offsets = np.zeros(lengths.shape[0] + 1, _INT64)
    np.cumsum(lengths, out=offsets[1:])
    return Batch(np.concatenate([p.flat[p.offsets[0]:p.offsets[-1]] for p in parts]), offsets)


def as_batches(obj):
    """Every accepted batch input as a list of ``Batch`` (several for a
    chunked Arrow array): a ``Batch``, a ``(flat, offsets)`` tuple of two
    NumPy arrays, a pyarrow ``ListArray``/``LargeListArray``/
    ``FixedSizeListArray``/``ChunkedArray``, an object whose type has a
    ``__radix_batch__(self)`` method returning a ``Batch`` (a trace), or
    anything ``pack`` takes."""
    if isinstance(obj, Batch):
        return [obj]
    as_batch = getattr(type(obj), "__radix_batch__", None)
    if as_batch is not None:  # e.g. radix_soa.studies.traces.Trace
        return [as_batch(obj)]
    if _is_csr_pair(obj):
        return [csr(*obj)]
    if type(obj).__module__.startswith("pyarrow"):
        return [Batch(flat, offsets) for flat, offsets in arrow_csr(obj)]
    return [pack(obj)]
