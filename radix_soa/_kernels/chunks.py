"""Batch kernels over the chunks of a chunked Arrow column, read in place.

A chunked column (a Parquet file read with pyarrow: one chunk per row
group) arrives as many small ``(offsets, values)`` buffer pairs. Instead of
one kernel call per chunk, or a copy joining them, one call takes a table
of the chunks' buffer addresses (``radix_soa._input.chunked``) and views
each chunk's buffers where they lie: ``view_at(address, n, like)`` is an
n-element array of ``like``'s dtype at ``address`` (Numba's ``carray`` over
a pointer made by the intrinsic ``pointer_like``). The caller keeps the
chunks alive during the call and has checked every address and bound
(``chunks_scan`` reads the offsets once: in bounds, non-decreasing).

A chunk's offsets (int32 for a ``list``, int64 for a ``large_list``) are
read into an int64 scratch rebased to 0, one chunk at a time (about a
hundred integers), so the batch kernels (``descend_lanes``,
``radix_insert_batch``) run unchanged on ``(values view, scratch)``.

Call graph (callers after their callees): pointer_like -> view_at ->
chunk_offsets -> chunks_scan, chunks_range; descend_lanes ->
descend_chunks(_parallel); radix_insert_batch -> insert_chunks
"""

import numpy as np
from numba import carray, prange, types
from numba.extending import intrinsic

from .config import kernel_inner_alloc, kernel_parallel, kernel_scratch
from .descent import descend_lanes
from .layout import DONE
from .mutation import radix_insert_batch


@intrinsic
def pointer_like(typingctx, address, like):
    """The int64 ``address`` as a pointer to ``like``'s dtype."""
    if not isinstance(address, types.Integer) or not isinstance(like, types.Array):
        return None
    ptr = types.CPointer(like.dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))

    return ptr(address, like), codegen


@kernel_inner_alloc
def view_at(address, n, like):
    """``n`` elements of ``like``'s dtype at ``address`` (a view, no copy)."""
    return carray(pointer_like(address, like), n)


@kernel_inner_alloc
def chunk_offsets(offsets_addr, wide, k, j, m, out):
    """Chunk ``k``'s offsets ``j .. j + m`` into ``out[:m + 1]`` (int64),
    rebased to 0; returns offset ``j`` (where row ``j``'s values start)."""
    if wide:
        o = view_at(offsets_addr[k] + 8 * j, m + 1, np.empty(0, np.int64))
        first = o[0]
        for i in range(m + 1):
            out[i] = o[i] - first
    else:
        o32 = view_at(offsets_addr[k] + 4 * j, m + 1, np.empty(0, np.int32))
        first = np.int64(o32[0])
        for i in range(m + 1):
            out[i] = np.int64(o32[i]) - first
    return first


@kernel_scratch
def chunks_scan(offsets_addr, wide, row0, n_values, G):
    """Check every chunk's offsets (first >= 0, non-decreasing, last <= the
    chunk's ``n_values``) and write the column's offsets as one run into
    ``G`` (int64, rows + 1, from 0). Returns -1, or the first chunk whose
    offsets fail (``G`` then partly written)."""
    G[0] = 0
    scratch = np.empty(1, np.int64)
    for k in range(row0.shape[0] - 1):
        n = row0[k + 1] - row0[k]
        if scratch.shape[0] < n + 1:
            scratch = np.empty(2 * n + 1, np.int64)
        first = chunk_offsets(offsets_addr, wide, k, 0, n, scratch)
        if first < 0 or first + scratch[n] > n_values[k]:
            return k
        base = G[row0[k]]
        for j in range(n):
            if scratch[j + 1] < scratch[j]:
                return k
            G[row0[k] + j + 1] = base + scratch[j + 1]
    return -1


@kernel_inner_alloc
def _descend_rows(tokens, start, length, parent, term, table, root, values_addr, offsets_addr,
                  wide, row0, k, a, b, base, like, page, exists, out_b, out_i):
    """``descend_lanes`` over the global rows ``a..b``, all in chunk ``k``;
    answers go to ``out_*[row - base]``."""
    m = b - a
    offs = np.empty(m + 1, np.int64)
    first = chunk_offsets(offsets_addr, wide, k, a - row0[k], m, offs)
    flat = view_at(values_addr[k] + first * like.itemsize, offs[m], like)
    if exists:
        descend_lanes(tokens, start, length, parent, term, table, root, flat, offs, 0, m,
                      page, True, out_b[a - base:b - base], out_i)
    else:
        descend_lanes(tokens, start, length, parent, term, table, root, flat, offs, 0, m,
                      page, False, out_b, out_i[a - base:b - base])


@kernel_scratch
def descend_chunks(tokens, start, length, parent, term, table, root, values_addr, offsets_addr,
                   wide, row0, lo, hi, like, page, exists, out_b, out_i):
    """``exists_batch`` (``exists``: into ``out_b``) or ``match_batch``
    (into ``out_i``) over the global rows ``lo..hi`` of a chunk table,
    ``out_*[row - lo]``. The table: ``values_addr``, ``offsets_addr`` (per
    chunk), ``wide`` (int64 offsets, else int32), ``row0`` (each chunk's
    first row, then the row count), ``like`` (an empty array of the values'
    dtype)."""
    k = np.searchsorted(row0, lo, side="right") - 1
    while k < row0.shape[0] - 1 and row0[k] < hi:
        a = max(lo, row0[k])
        b = min(hi, row0[k + 1])
        if a < b:
            _descend_rows(tokens, start, length, parent, term, table, root, values_addr,
                          offsets_addr, wide, row0, k, a, b, lo, like, page, exists, out_b, out_i)
        k += 1


@kernel_parallel
def descend_chunks_parallel(tokens, start, length, parent, term, table, root, values_addr,
                            offsets_addr, wide, row0, item_k, item_a, item_b, lo, like, page,
                            exists, out_b, out_i):
    """``descend_chunks`` on Numba's threads, one task per item: the global
    rows ``item_a[t]..item_b[t]`` of chunk ``item_k[t]``."""
    for t in prange(item_k.shape[0]):
        _descend_rows(tokens, start, length, parent, term, table, root, values_addr,
                      offsets_addr, wide, row0, item_k[t], item_a[t], item_b[t], lo, like, page,
                      exists, out_b, out_i)


@kernel_scratch
def insert_chunks(T, root, values_addr, offsets_addr, wide, row0, lo, hi, like, cursor, new):
    """``radix_insert_batch`` over the global rows ``lo..hi`` of a chunk
    table (see ``descend_chunks``), from row ``lo + cursor[0]``; ``new[row -
    lo]``. Returns ``DONE``, or ``ROOM`` with ``cursor[0]`` at the first row
    (relative to ``lo``) not inserted."""
    i = lo + cursor[0]
    k = np.searchsorted(row0, i, side="right") - 1
    local = np.zeros(1, np.int64)
    while i < hi:
        b = min(hi, row0[k + 1])
        if i < b:
            m = b - i
            offs = np.empty(m + 1, np.int64)
            first = chunk_offsets(offsets_addr, wide, k, i - row0[k], m, offs)
            flat = view_at(values_addr[k] + first * like.itemsize, offs[m], like)
            local[0] = 0
            status = radix_insert_batch(T, root, flat, offs, local, new[i - lo:b - lo])
            if status != DONE:
                cursor[0] = i + local[0] - lo
                return status
            i = b
        k += 1
    cursor[0] = hi - lo
    return DONE


@kernel_scratch
def chunks_range(values_addr, offsets_addr, wide, row0, G, like):
    """``(min, max)`` of every token of a chunk table (``G``: its offsets
    as one run, from ``chunks_scan``), as int64; ``(0, 0)`` for no tokens."""
    lo = np.int64(0)
    hi = np.int64(0)
    seen = False
    one = np.empty(1, np.int64)
    for k in range(row0.shape[0] - 1):
        n = G[row0[k + 1]] - G[row0[k]]
        if n == 0:
            continue
        first = chunk_offsets(offsets_addr, wide, k, 0, 0, one)
        flat = view_at(values_addr[k] + first * like.itemsize, n, like)
        for j in range(n):
            x = np.int64(flat[j])
            if not seen:
                lo = x
                hi = x
                seen = True
            elif x < lo:
                lo = x
            elif x > hi:
                hi = x
    return lo, hi
