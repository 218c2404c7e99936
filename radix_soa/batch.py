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
import struct
from itertools import chain
from typing import Iterator, overload

import numpy as np
from numpy.typing import ArrayLike

from ._arrow import arrow_csr, arrow_data, objects_csr
from ._sequence import as_tokens, has_bool
from ._typing import BatchLike

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
    """Pack sequences into a ``Batch``.

    ``seqs`` may be a list or tuple of lists / tuples / ranges / 1-D integer
    arrays (mixed freely), a 1-D NumPy object array of such sequences (what
    ``datasets``' numpy format and pandas object columns hold), a 2-D
    integer array (one sequence per row), Arrow data (see ``as_batches``;
    chunks are concatenated) or a ``Batch`` (returned as is). One rule
    everywhere: a 2-tuple of NumPy arrays is a CSR pair ``(flat, offsets)``
    (``csr(flat, offsets)`` says so explicitly); pass two sequences as a
    list. Errors name the offending sequence.

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
    if isinstance(seqs, np.ndarray) and seqs.ndim == 1 and seqs.dtype == object:
        read = objects_csr(seqs)
        if read is not None:
            flat, offsets = read
            return Batch(_flat_array(flat).astype(_INT64, copy=False), offsets)  # uint64 checked
        seqs = seqs.tolist()  # its elements, each a sequence
    elif isinstance(seqs, np.ndarray):
        if seqs.ndim != 2:
            raise ValueError("pack takes a sequence of sequences, a 2-D array or a 1-D object "
                             f"array of sequences; got a {seqs.ndim}-D {seqs.dtype} array")
        flat = _flat_array(np.ascontiguousarray(seqs).reshape(-1))
        n, m = seqs.shape
        return Batch(flat, np.arange(n + 1, dtype=_INT64) * m)
    elif not isinstance(seqs, (list, tuple)):
        foreign = _foreign_batches(seqs)
        if foreign is not None:
            return _concatenate(foreign)
    if isinstance(seqs, (str, bytes, bytearray)) or not hasattr(seqs, "__iter__"):
        raise TypeError(f"pack takes a sequence of sequences; got {type(seqs).__name__}")
    items = seqs if isinstance(seqs, (list, tuple)) else list(seqs)
    flat = None
    if all(type(x) in (list, tuple) for x in items):
        flat = _pack_python(items)
    elif set(map(type, items)) == {np.ndarray}:
        packed = _pack_arrays(items)
        if packed is not None:
            return packed
    if flat is None:
        arrays = [_item_tokens(i, x) for i, x in enumerate(items)]
        flat = np.concatenate(arrays) if arrays else np.empty(0, _INT64)
        lengths = [a.shape[0] for a in arrays]
    else:
        lengths = [len(x) for x in items]
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


# ---------------------------------------------------------------- threads

# Below this many query tokens a batch runs serially: starting Numba's
# thread pool costs more than the work (measured in asv_bench/bench.py batch).
PARALLEL_MIN_TOKENS = 1 << 18


def use_parallel(parallel, batches):
    """Resolve a ``parallel=`` argument for a call that runs one kernel per
    batch: True/False as given; None (the default) picks threads only when
    Numba has more than one thread (``NUMBA_NUM_THREADS``) and *every*
    batch is large enough to gain from them, since each batch starts the
    pool again (1,000 small chunks of an Arrow column would pay it 1,000
    times). ``run_batches`` decides batch by batch instead.

    >>> small = pack([[0, 0, 0, 0]])
    >>> large = pack([[0] * PARALLEL_MIN_TOKENS])
    >>> use_parallel(None, [small]), use_parallel(True, [small]), use_parallel(False, [large])
    (False, True, False)
    """
    if parallel is not None:
        return bool(parallel)
    return bool(batches) and _threads() > 1 and all(
        b.num_tokens >= PARALLEL_MIN_TOKENS for b in batches)


def _threads():
    import numba

    return numba.get_num_threads()


def map_batches(batches, dtype, fill, progress=False):
    """One result per sequence over several batches: ``fill(batch, out)``
    writes batch's results into ``out`` (zeros of ``dtype``); the parts are
    concatenated (one batch: its array as is). ``progress``: see
    ``progress_reporter`` (the batches are then cut into slices of about
    ``PROGRESS_STEP`` tokens, one report after each)."""
    report = progress_reporter(progress, sum(b.num_tokens for b in batches))
    parts = []
    for b in batches:
        out = np.zeros(len(b), dtype)
        if report is None:
            fill(b, out)
        else:
            for lo, hi in _slices(b):
                fill(b[lo:hi], out[lo:hi])
                report(b.offsets[hi] - b.offsets[lo])
        parts.append(out)
    if report is not None:
        report(None)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def run_batches(batches, dtype, parallel, serial, threaded, progress=False):
    """``map_batches`` for a read with a serial and a threaded kernel:
    ``threaded(batch, out)`` runs for the batches ``use_parallel(parallel,
    [batch])`` picks threads for, ``serial(batch, out)`` for the others, so
    the default never starts the thread pool for a small chunk."""
    if parallel is None and len(batches) > 1 and _threads() > 1:
        return map_batches(batches, dtype, lambda b, out: (
            threaded if b.num_tokens >= PARALLEL_MIN_TOKENS else serial)(b, out), progress)
    return map_batches(batches, dtype, threaded if use_parallel(parallel, batches) else serial,
                       progress)


# ---------------------------------------------------------------- progress

PROGRESS_STEP = 1 << 22  # tokens between two progress reports


def progress_reporter(progress, total):
    """What a batch call's ``progress=`` asks for, as ``report(tokens)``
    (called with the tokens each slice covered, then once with None), or
    None: ``False``/None for nothing, ``True`` for a ``tqdm`` bar on stderr
    (the ``progress`` extra), or a callable ``progress(done, total)`` (in
    tokens) called after each slice.

    >>> seen = []
    >>> report = progress_reporter(lambda done, total: seen.append((done, total)), 10)
    >>> report(4); report(6); report(None); seen
    [(4, 10), (10, 10)]
    """
    if progress is None or progress is False:
        return None
    if progress is True:
        try:
            from tqdm import tqdm
        except ImportError:
            raise ImportError("progress=True needs tqdm: pip install 'radix-soa[progress]' "
                              "(or pass a callable progress(done, total))") from None
        bar = tqdm(total=int(total), unit="tok", unit_scale=True, leave=False)

        def report(tokens):
            if tokens is None:
                bar.close()
            else:
                bar.update(int(tokens))
        return report
    if not callable(progress):
        raise TypeError(f"progress must be True, False or a callable progress(done, total); "
                        f"got {type(progress).__name__}")
    done = [0]

    def call(tokens):
        if tokens is not None:
            done[0] += int(tokens)
            progress(done[0], int(total))
    return call


def _slices(b):
    """``(lo, hi)`` sequence ranges of ``b`` of about ``PROGRESS_STEP``
    tokens each (at least one sequence)."""
    n = len(b)
    if n == 0:
        return [(0, 0)]
    cuts = np.searchsorted(b.offsets, b.offsets[0] + np.arange(1, b.num_tokens // PROGRESS_STEP + 1)
                           * PROGRESS_STEP)
    bounds = np.unique(np.concatenate([[0], np.clip(cuts, 1, n), [n]]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


# ---------------------------------------------------------------- any input

def pack_one(obj):
    """``as_batches(obj)`` as one ``Batch`` (chunks concatenated)."""
    return _concatenate(as_batches(obj))


def _concatenate(parts):
    if len(parts) == 1:
        return parts[0]
    lengths = np.concatenate([p.lengths for p in parts])
    offsets = np.zeros(lengths.shape[0] + 1, _INT64)
    np.cumsum(lengths, out=offsets[1:])
    return Batch(np.concatenate([p.flat[p.offsets[0]:p.offsets[-1]] for p in parts]), offsets)


def as_batches(obj):
    """Every accepted batch input as a list of ``Batch`` (one per chunk of a
    chunked Arrow column, each a zero-copy view where the layout allows).

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
        foreign = _foreign_batches(obj)
        if foreign is not None:
            return foreign
    return [pack(obj)]


def _foreign_batches(obj):
    """Arrow data or a pandas series as batches, or None for anything else."""
    if type(obj).__module__.startswith("pandas") and hasattr(obj, "dtype"):
        if type(obj.dtype).__name__ != "ArrowDtype":  # object lists: no Arrow in them
            return [pack(obj.to_numpy())]
    data = arrow_data(obj)
    if data is None:
        return None
    return [Batch(flat, offsets) for flat, offsets in arrow_csr(data)]
