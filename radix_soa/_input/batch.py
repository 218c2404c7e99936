"""Many sequences as one flat buffer plus offsets (CSR), from lists, NumPy,
Arrow and the containers that speak it (polars, pandas, Hugging Face
``datasets``, DuckDB, nanoarrow).

Flat values + offsets is the ecosystem's ragged-array layout (scipy CSR,
Arrow ``ListArray``); batch kernels loop over it in compiled code.

>>> b = pack([[1, 2, 3], [4], (5, 6)])
>>> b.flat.tolist(), b.offsets.tolist(), len(b)
([1, 2, 3, 4, 5, 6], [0, 3, 4, 6], 3)
>>> b[2].tolist()
[5, 6]
"""

import operator
from array import array
from typing import Iterator, overload

import numpy as np
from numpy.typing import ArrayLike

from .arrow import arrow_csr, arrow_data, objects_csr
from .chunked import chunk_table
from .sequence import as_tokens, has_bool
from .types import BatchLike

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

    flat: np.ndarray
    offsets: np.ndarray

    def __init__(self, flat: ArrayLike, offsets: ArrayLike) -> None:
        view = _flat_array(flat).view()
        view.flags.writeable = False
        self.flat = view
        self.offsets = _offsets_array(offsets, view.shape[0])

    def __len__(self) -> int:
        return self.offsets.shape[0] - 1

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, i: slice) -> "Batch": ...

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

    def __iter__(self) -> Iterator[np.ndarray]:
        off = self.offsets
        for i in range(len(self)):
            yield self.flat[off[i]:off[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per sequence (int64 array)."""
        return np.diff(self.offsets)

    @property
    def num_tokens(self) -> int:
        return int(self.flat.shape[0])

    def __repr__(self):
        return f"Batch(sequences={len(self)}, tokens={self.num_tokens}, dtype={self.flat.dtype.name})"

    def __eq__(self, other):
        return (isinstance(other, Batch) and np.array_equal(self.offsets, other.offsets)
                and np.array_equal(self.flat, other.flat))

    __hash__ = None  # type: ignore[assignment]  # unhashable: equality compares contents


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
    off = off.astype(_INT64)  # a new contiguous array, ours: the caller cannot move it
    off.flags.writeable = False
    # scalar and method forms below: this runs once per chunk of a chunked column
    first, last = off[[0, -1]].tolist()
    if first != 0:
        raise ValueError(f"offsets must start at 0; got {first}")
    if last != n_flat:
        raise ValueError(f"offsets must end at len(flat) = {n_flat}; got {last}")
    if off.shape[0] > 1 and (off[1:] < off[:-1]).any():
        i = int(np.flatnonzero(off[1:] < off[:-1])[0])
        raise ValueError(f"offsets must be non-decreasing; offsets[{i + 1}] < offsets[{i}]")
    return off


def pack(seqs: BatchLike) -> "Batch":
    """Pack sequences into one ``Batch``: ``as_batches(seqs)`` with its
    chunks joined (a ``Batch`` is returned as is).

    ``seqs`` may be a list or tuple of lists / tuples / ranges / 1-D integer
    arrays (mixed freely), a 1-D NumPy object array of such sequences (what
    ``datasets``' numpy format and pandas object columns hold), a 2-D
    integer array (one sequence per row), Arrow data or anything else
    ``as_batches`` takes. One rule everywhere: a 2-tuple of NumPy arrays is
    a CSR pair ``(flat, offsets)`` (``csr(flat, offsets)`` says so
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
    return _concatenate(as_batches(seqs))


def _pack_containers(seqs):
    """A ``Batch`` of Python or NumPy containers of sequences (``pack``'s
    own cases; ``as_batches`` has dispatched everything else)."""
    if isinstance(seqs, np.ndarray) and seqs.ndim == 1 and seqs.dtype == object:
        items = seqs.tolist()  # its elements, each a sequence
        if not set(map(type, items)) <= {list, tuple}:  # arrays: Arrow takes them in one call
            read = objects_csr(seqs)
            if read is not None:
                flat, offsets = read
                return Batch(_flat_array(flat).astype(_INT64, copy=False), offsets)  # uint64 checked
        seqs = items  # lists (a pandas object column's): packed below, faster than Arrow
    elif isinstance(seqs, np.ndarray):
        if seqs.ndim != 2:
            raise ValueError("pack takes a sequence of sequences, a 2-D array or a 1-D object "
                             f"array of sequences; got a {seqs.ndim}-D {seqs.dtype} array")
        flat = _flat_array(np.ascontiguousarray(seqs).reshape(-1))
        n, m = seqs.shape
        return Batch(flat, np.arange(n + 1, dtype=_INT64) * m)
    if isinstance(seqs, (str, bytes, bytearray)) or not hasattr(seqs, "__iter__"):
        raise TypeError(f"pack takes a sequence of sequences; got {type(seqs).__name__}")
    items = seqs if isinstance(seqs, (list, tuple)) else list(seqs)
    kinds = set(map(type, items))
    if kinds <= {list, tuple}:
        packed = _pack_python(items)
        if packed is not None:
            return packed
    elif kinds == {np.ndarray}:
        packed = _pack_arrays(items)
        if packed is not None:
            return packed
    arrays = [_item_tokens(i, x) for i, x in enumerate(items)]
    flat = np.concatenate(arrays) if arrays else np.empty(0, _INT64)
    lengths = [a.shape[0] for a in arrays]
    offsets = np.zeros(len(items) + 1, _INT64)
    np.cumsum(lengths, out=offsets[1:])
    return Batch(flat, offsets)


def csr(flat: ArrayLike, offsets: ArrayLike) -> "Batch":
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
    """A ``Batch`` of lists and tuples of Python ints, or None if an element
    is not an int64 (the slow path then names it). ``array('q').fromlist``
    converts a list in C and refuses what is not an int (a float too) or does
    not fit, 1.3x faster than one ``struct.pack`` of them all; only a bool
    gets through, and ``has_bool`` finds those."""
    flat = array("q")
    try:
        for x in items:
            if type(x) is list:
                flat.fromlist(x)
            else:
                flat.extend(x)
    except (TypeError, OverflowError):
        return None
    lengths = np.fromiter(map(len, items), _INT64, len(items))
    offsets = np.zeros(len(items) + 1, _INT64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.frombuffer(flat, dtype=_INT64) if len(flat) else np.empty(0, _INT64)
    if has_bool(items, tokens, offsets=offsets):
        return None
    return Batch(tokens, offsets)


def _pack_arrays(items):
    """A ``Batch`` of 1-D NumPy integer arrays in one concatenation, or None
    if they are not all that (the slow path then names the first that is
    not) or mix dtypes that would not concatenate to integers."""
    dtypes = set(map(operator.attrgetter("dtype"), items))
    if not all(d.kind in "iu" for d in dtypes) or (len(dtypes) > 1 and any(
            d.kind == "u" and d.itemsize == 8 for d in dtypes)):
        return None  # uint64 with a signed dtype would concatenate to float64
    if set(map(operator.attrgetter("ndim"), items)) != {1}:
        return None
    lengths = np.fromiter(map(len, items), _INT64, len(items))
    offsets = np.zeros(len(items) + 1, _INT64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(items)
    if flat.dtype != _INT64:  # int64 as the per-item path gives (uint64 checked to fit)
        flat = _flat_array(flat).astype(_INT64, copy=False)
    return Batch(flat, offsets)


def _item_tokens(i, x):
    try:
        return as_tokens(x)
    except (TypeError, ValueError, OverflowError) as exc:
        raise type(exc)(f"sequence {i}: {exc}") from None


# ---------------------------------------------------------------- any input

def _concatenate(parts):
    if len(parts) == 1:
        return parts[0]
    lengths = np.concatenate([p.lengths for p in parts])
    offsets = np.zeros(lengths.shape[0] + 1, _INT64)
    np.cumsum(lengths, out=offsets[1:])
    return Batch(np.concatenate([p.flat[p.offsets[0]:p.offsets[-1]] for p in parts]), offsets)


#: Adjacent Arrow chunks holding fewer tokens than this are joined into one
#: batch (a copy of them), so a column of many small chunks runs the kernel
#: a few times, not once a chunk; a larger chunk stays a zero-copy view.
JOIN_TOKENS = 1 << 16


def as_batches(obj, chunks=False):
    """The one dispatcher of batch input: every accepted input as a list of
    ``Batch`` (a chunked Arrow column's large chunks each a zero-copy view
    where the layout allows, runs of small ones joined: ``JOIN_TOKENS``).
    ``chunks=True`` (for a caller with chunk kernels,
    ``radix_soa._kernels.chunks``): a chunked column of int32/int64 lists
    comes as one ``radix_soa._input.chunked.Chunks`` instead, its chunks read
    in place (no join, no copy).

    Accepted: a ``Batch``; a ``(flat, offsets)`` tuple of two NumPy arrays;
    an object whose type has a ``__radix_batch__(self)`` method returning a
    ``Batch`` (a trace); Arrow data of integer lists: a pyarrow
    ``ListArray``/``LargeListArray``/``FixedSizeListArray``/``ChunkedArray``,
    anything with ``__arrow_c_stream__``/``__arrow_c_array__`` (a polars
    ``Series``, a pandas ``ArrowDtype`` series, a DuckDB result, a nanoarrow
    array; a one-column table stands for its column; needs pyarrow, the
    ``arrow`` extra), a Hugging Face ``datasets`` column ``ds["tokens"]`` (read
    from the dataset's Arrow table); a pandas series of lists; or anything
    ``pack`` takes.

    >>> [b.flat.tolist() for b in as_batches(np.array([[1, 2], [3]], dtype=object))]
    [[1, 2, 3]]
    """
    if isinstance(obj, Batch):
        return [obj]
    as_batch = getattr(type(obj), "__radix_batch__", None)
    if as_batch is not None:  # e.g. radix_soa.studies.traces.Trace
        return [as_batch(obj)]
    if _is_csr_pair(obj):
        return [csr(*obj)]
    if not isinstance(obj, (list, tuple, np.ndarray)):
        foreign = _foreign_batches(obj, chunks)
        if foreign is not None:
            return foreign
    return [_pack_containers(obj)]


def _foreign_batches(obj, chunks=False):
    """Arrow data or a pandas series as batches, or None for anything else."""
    if type(obj).__module__.startswith("pandas") and hasattr(obj, "dtype"):
        if type(obj.dtype).__name__ != "ArrowDtype":  # object lists: no Arrow in them
            return [_pack_containers(obj.to_numpy())]
    data = arrow_data(obj)
    if data is None:
        return None
    if chunks:
        table = chunk_table(data)
        if table is not None:
            return [table]
    return _joined([Batch(flat, offsets) for flat, offsets in arrow_csr(data)])


def _joined(batches):
    """``batches`` with every run of adjacent ones under ``JOIN_TOKENS``
    tokens (together) joined into one."""
    out, run, tokens = [], [], 0
    for b in batches:
        if b.num_tokens >= JOIN_TOKENS:
            if run:
                out.append(_concatenate(run))
                run, tokens = [], 0
            out.append(b)
            continue
        run.append(b)
        tokens += b.num_tokens
        if tokens >= JOIN_TOKENS:
            out.append(_concatenate(run))
            run, tokens = [], 0
    if run:
        out.append(_concatenate(run))
    return out
