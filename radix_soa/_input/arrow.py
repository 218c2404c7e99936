"""Arrow data as CSR ``(flat, offsets)`` views (pyarrow is optional and
imported only when Arrow data arrives).

Arrow data is a pyarrow array, anything that speaks the Arrow PyCapsule
interface (``__arrow_c_stream__`` / ``__arrow_c_array__``: polars, pandas,
DuckDB results, nanoarrow ...) or a Hugging Face ``datasets`` column; a
one-column table stands for its column. The list offsets and the integer
child values are read in place: the values are a zero-copy NumPy view when
they are integers without nulls; the offsets (n + 1 small integers) are
rebased to start at 0 for a sliced array.
"""

import operator

import numpy as np

_INSTALL = "pip install 'radix-soa[arrow]'"
_INT64 = np.dtype(np.int64)
_DTYPE = operator.attrgetter("dtype")


def arrow_data(obj):
    """``obj`` as a pyarrow Array or ChunkedArray if it is Arrow data, else
    None. Raises ``ImportError`` (saying how to install pyarrow) for Arrow
    data when pyarrow is missing."""
    kind = type(obj)
    if kind.__module__.startswith("pyarrow"):
        pa = _pyarrow(obj)
        if isinstance(obj, (pa.Array, pa.ChunkedArray, pa.Table, pa.RecordBatch)):
            return _one_column(obj, pa)
    if kind.__module__.startswith("datasets") and hasattr(obj, "column_name"):
        return _datasets_column(obj)
    if hasattr(kind, "__arrow_c_stream__"):
        pa = _pyarrow(obj)
        return _one_column(pa.chunked_array(obj), pa)
    if hasattr(kind, "__arrow_c_array__"):
        pa = _pyarrow(obj)
        return _one_column(pa.array(obj), pa)
    return None


def _pyarrow(obj):
    try:
        import pyarrow
    except ImportError:
        raise ImportError(f"a {type(obj).__name__} is Arrow data; reading it as a batch needs "
                          f"pyarrow: {_INSTALL}") from None
    return pyarrow


def _one_column(data, pa):
    """A table or struct array of exactly one column as that column."""
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        if data.num_columns != 1:
            raise ValueError(f"a batch is one column of sequences; got a table of "
                             f"{data.num_columns} columns {data.column_names}: pass one")
        return data.column(0)
    if pa.types.is_struct(data.type):
        names = [data.type.field(i).name for i in range(data.type.num_fields)]
        if len(names) != 1:
            raise ValueError(f"a batch is one column of sequences; got a table of "
                             f"{len(names)} columns {names}: pass one")
        if data.null_count:
            raise ValueError(f"Arrow table has {data.null_count} null rows; a batch needs a "
                             "sequence in every row")
        if isinstance(data, pa.ChunkedArray):
            return pa.chunked_array([c.flatten()[0] for c in data.chunks], data.type.field(0).type)
        return data.flatten()[0]
    return data


def _datasets_column(col):
    """A Hugging Face ``datasets`` column (``ds["tokens"]``) as the dataset's
    own Arrow column: zero-copy unless the dataset holds an indices mapping
    (after ``select``, ``shuffle``, ``filter``), which is applied with one take."""
    source = col.source
    if not hasattr(source, "data") or not hasattr(source, "_indices"):  # a nested column
        raise TypeError(f"a nested datasets column ({col.column_name!r} of a column) is not "
                        "a batch; pass ds[name] of a top-level column")
    data = source.data.column(col.column_name)  # a pyarrow ChunkedArray over the table
    if source._indices is not None:
        data = data.take(source._indices.column(0))
    return data


def objects_csr(arr):
    """A 1-D NumPy object array of integer sequences as one ``(values,
    offsets)`` pair through ``pyarrow.array``, or None when pyarrow is
    missing or the elements are not all lists, tuples or 1-D arrays of
    integers without nulls (the caller's own path then names the first that
    is not).

    Plain int64 arrays (what ``datasets``' numpy format and pyarrow's
    ``to_numpy`` give) are converted with the type given, which skips
    pyarrow's inference: with the check that they are all int64 arrays,
    about 0.7x the inferring conversion and 0.6x one ``np.concatenate`` of
    them (200,000 arrays of 4-40 tokens, best of 21 on a quiet core). Anything
    else is inferred, and the inferred type is the check. Lists of ints gain
    nothing from a given type: pyarrow then casts floats and bools, and
    checking every token's type costs what inference does.

    >>> flat, offsets = objects_csr(np.array([np.arange(3), np.arange(2)], dtype=object))
    >>> flat.tolist(), offsets.tolist()
    ([0, 1, 2, 0, 1], [0, 3, 5])
    """
    try:
        import pyarrow as pa
    except ImportError:
        return None
    items = arr.tolist()
    try:
        if _int64_arrays(items):
            # given a type, pyarrow casts whatever it gets (floats, bools), so
            # only for what is int64 already; a 2-D array is still refused
            data = pa.array(items, type=pa.large_list(pa.int64()))  # int64 offsets
        else:
            data = pa.array(arr)  # refuses bools among ints, ints past 64 bits, 2-D arrays
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None
    if isinstance(data, pa.LargeListArray):
        return arrow_csr(data)[0]
    if (not isinstance(data, pa.ListArray) or data.null_count
            or not pa.types.is_integer(data.type.value_type) or data.values.null_count):
        return None
    return arrow_csr(data)[0]


def _int64_arrays(items):
    """True if every item is a plain ``np.ndarray`` of dtype int64: two
    passes in C (``countOf`` compares by identity first, and int64 arrays
    mostly share one dtype object), after a look at the first item so that
    other inputs (lists) pay nothing."""
    n = len(items)
    if n == 0 or type(items[0]) is not np.ndarray or items[0].dtype != _INT64:
        return False
    return (operator.countOf(map(type, items), np.ndarray) == n
            and operator.countOf(map(_DTYPE, items), _INT64) == n)


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
    raise TypeError("Arrow input must be a List, LargeList or FixedSizeList array (or a "
                    f"chunked one) of integers; got {type(arr).__name__} of type {arr.type}")


def _values_array(values):
    import pyarrow.types as pat

    if not pat.is_integer(values.type):
        raise TypeError(f"Arrow list values must be integers; got {values.type}")
    if values.null_count:
        raise ValueError(f"Arrow list values hold {values.null_count} nulls")
    return values.to_numpy(zero_copy_only=True)
