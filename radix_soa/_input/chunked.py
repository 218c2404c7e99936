"""A chunked Arrow column of integer lists as one table of its chunks'
buffers, read in place by the chunk kernels (``radix_soa._kernels.chunks``):
no join, no copy of the values, one kernel call for all the chunks.

A Parquet column read with pyarrow is a ``ChunkedArray``, a chunk per row
group. ``chunk_table`` takes it when every chunk is a ``list`` or
``large_list`` of int32 or int64 without nulls (what Parquet token columns
are); anything else goes the per-chunk way (``arrow.arrow_csr``), which
also says what is wrong with it. The table holds the chunks, so their
buffers live as long as it does.
"""

import numpy as np

_VALUES = {"int64": np.dtype(np.int64), "int32": np.dtype(np.int32)}
_NO_TERM = np.empty(0, np.uint8)
#: Rows per task of the threaded chunk kernel (a chunk larger than this is
#: cut, so one large chunk among small ones does not hold a thread alone).
TASK_ROWS = 4096


class Chunks:
    """Rows ``lo..hi`` of a chunk table, shaped like a ``Batch`` for the
    batch loop (``len``, ``num_tokens``, ``offsets``, ``lengths``, slicing):
    ``offsets`` are the rows' offsets as one run (int64, from the table's
    scan), the tokens stay in the chunks.

    ``args`` is what the chunk kernels take after the tree:
    ``(values_addr, offsets_addr, wide, row0)``; ``like`` an empty array of
    the values' dtype.
    """

    __slots__ = ("values_addr", "offsets_addr", "wide", "row0", "like", "dtype", "G", "lo", "hi",
                 "keep")

    def __init__(self, values_addr, offsets_addr, wide, row0, like, G, lo, hi, keep):
        self.values_addr, self.offsets_addr, self.wide, self.row0 = (
            values_addr, offsets_addr, wide, row0)
        self.like, self.dtype, self.G, self.lo, self.hi, self.keep = (
            like, like.dtype, G, lo, hi, keep)

    def __len__(self):
        return self.hi - self.lo

    @property
    def offsets(self):
        return self.G[self.lo:self.hi + 1]

    @property
    def lengths(self):
        return np.diff(self.offsets)

    @property
    def num_tokens(self):
        return int(self.G[self.hi] - self.G[self.lo])

    @property
    def args(self):
        return self.values_addr, self.offsets_addr, self.wide, self.row0

    def __getitem__(self, i):
        """Rows ``i.start .. i.stop`` (a slice of step 1) as ``Chunks``."""
        lo, hi, step = i.indices(len(self))
        if step != 1:
            raise ValueError("a Chunks slice must be contiguous (step 1)")
        return Chunks(self.values_addr, self.offsets_addr, self.wide, self.row0, self.like,
                      self.G, self.lo + lo, self.lo + max(lo, hi), self.keep)

    def tasks(self, rows=TASK_ROWS):
        """``(chunk, first row, end row)`` arrays of the threaded kernel's
        tasks: the rows ``lo..hi`` cut at every chunk boundary and every
        ``rows`` rows."""
        cuts = np.concatenate([np.clip(self.row0, self.lo, self.hi),
                               np.arange(self.lo, self.hi, rows, dtype=np.int64), [self.hi]])
        cuts = np.unique(cuts)
        a, b = cuts[:-1], cuts[1:]
        return np.searchsorted(self.row0, a, side="right") - 1, a, b

    def __repr__(self):
        return (f"Chunks(chunks={self.row0.shape[0] - 1}, sequences={len(self)}, "
                f"tokens={self.num_tokens}, dtype={self.dtype.name})")


def chunk_table(data):
    """``data`` (a pyarrow ``ChunkedArray`` of two or more chunks) as one
    ``Chunks``, or None when it is not a clean int32/int64 ``list`` /
    ``large_list`` column (nulls, other types, offsets that fail the
    scan): the per-chunk path then reads it and names what is wrong."""
    import pyarrow as pa

    from .._kernels.chunks import chunks_scan

    if not isinstance(data, pa.ChunkedArray) or data.num_chunks < 2 or data.null_count:
        return None
    t = data.type
    if pa.types.is_list(t):
        wide, width = False, 4
    elif pa.types.is_large_list(t):
        wide, width = True, 8
    else:
        return None
    dtype = _VALUES.get(str(t.value_type))
    if dtype is None:
        return None
    size = dtype.itemsize
    chunks = [c for c in data.chunks if len(c)]
    values_addr, offsets_addr, n_values, rows = [], [], [], []
    for c in chunks:
        _, off_buf, valid, val_buf = c.buffers()
        values = c.values
        if valid is not None and values.null_count:
            return None
        if off_buf is None or val_buf is None or not (off_buf.is_cpu and val_buf.is_cpu):
            return None
        n = len(c)
        if (c.offset + n + 1) * width > off_buf.size:
            return None
        offsets_addr.append(off_buf.address + c.offset * width)
        values_addr.append(val_buf.address + values.offset * size)
        n_values.append(val_buf.size // size - values.offset)
        rows.append(n)
    if not chunks:
        return None
    row0 = np.zeros(len(chunks) + 1, np.int64)
    np.cumsum(rows, out=row0[1:])
    offsets_addr = np.array(offsets_addr, np.int64)
    G = np.empty(int(row0[-1]) + 1, np.int64)
    if chunks_scan(offsets_addr, wide, row0, np.array(n_values, np.int64), G) >= 0:
        return None
    G.flags.writeable = False
    return Chunks(np.array(values_addr, np.int64), offsets_addr, wide, row0,
                  np.empty(0, dtype), G, 0, int(row0[-1]), chunks)



def descend(args, root, b, page, exists, out_b, out_i, threaded=False):
    """The chunk kernels' ``exists_batch`` / ``match_batch`` of the
    ``Chunks`` ``b`` (``args``: the tree's ``exists_args`` or
    ``match_args``); ``threaded``: one task per ``tasks()`` item."""
    from .._kernels import chunks as K

    if not exists:  # match_args: no terminal bitmap
        args = (*args[:4], _NO_TERM, args[4])
    if threaded:
        k, a, z = b.tasks()
        K.descend_chunks_parallel(*args, root, *b.args, k, a, z, b.lo, b.like, page, exists,
                                  out_b, out_i)
    else:
        K.descend_chunks(*args, root, *b.args, b.lo, b.hi, b.like, page, exists, out_b, out_i)


def check_chunks_fit(b, dtype):
    """``check_fits`` for the tokens of a whole chunk table."""
    from .._kernels.chunks import chunks_range
    from .sequence import check_fits

    if dtype == np.int64 or b.num_tokens == 0:
        return
    lo, hi = chunks_range(b.values_addr, b.offsets_addr, b.wide, b.row0, b.G, b.like)
    check_fits(np.array([lo, hi], np.int64), dtype)
