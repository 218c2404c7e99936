"""The tree's arrays as one kernel argument: a directory of addresses.

Numba unboxes every array argument of every call (about 0.08 µs each), so an
entry kernel taking the arrays of ``T`` (16 when measured) spends about
1.5 µs before it does any work, more than a whole match of 1,000 cached
tokens. The per-call entry kernels therefore take ``D``: an int64 array of
``(address, length)`` pairs, one per ``TREE_FIELDS`` entry, and ``like``,
any array of the token dtype (it only carries the dtype; every array, the
tokens too, comes from ``D``).
``tree_at(D, like)`` rebuilds ``T`` inside the kernel at no cost. The
storage builds ``D`` at every publish, with references to its arrays, so
they live as long as ``D`` does (see ``radix_soa._tree.storage``).

Building an array from an address uses Numba's intrinsic API and
``numba.np.arrayobj.populate_array``, which is not a documented API: it is
used only when ``HAS_DIRECTORY`` (it imports), and otherwise the storage
passes the plain tuple ``T`` as ``D`` (``tree_at`` returns a tuple as is),
which is correct, only slower per call.

Call graph (callers after their callees): fill_directory -> directory_of
(the directory of a tree, for the storage); tree_at (``T`` rebuilt inside
an entry kernel, inlined; called by every entry kernel that takes ``D``)
"""

import numpy as np
from numba import literal_unroll, types
from numba.extending import intrinsic, overload

from .config import kernel

from .layout import FIELD_DTYPES, TREE_FIELDS
try:
    from numba.core import cgutils
    from numba.np.arrayobj import populate_array
except ImportError:  # pragma: no cover - a Numba without these internals
    HAS_DIRECTORY = False
else:
    HAS_DIRECTORY = True

SLOTS = 2 * len(TREE_FIELDS)
_DTYPES = [None] + [np.dtype(FIELD_DTYPES[f]) for f in TREE_FIELDS[1:]]


def directory_of(tree):
    """``(D, keep)``: the directory of ``tree``'s arrays and the object that
    must stay referenced while ``D`` is used (``D``'s own buffer does)."""
    import ctypes

    for i, (name, arr) in enumerate(zip(TREE_FIELDS, tree)):
        if not arr.flags.c_contiguous or arr.ndim != 1 or (i and arr.dtype != _DTYPES[i]):
            raise ValueError(f"tree array {name} is not a 1-D contiguous {_DTYPES[i]} array")
    buf = (ctypes.c_int64 * SLOTS)()
    buf.arrays = tuple(tree)  # D = frombuffer(buf) keeps buf, buf keeps the arrays
    D = np.frombuffer(buf, np.int64)
    fill_directory(buf.arrays, D)  # ``.ctypes.data`` in Python costs 2.5 µs per array
    return D


@kernel
def fill_directory(T, D):
    """``D[2i], D[2i+1] = address, length`` of every array of ``T``."""
    i = 0
    for a in literal_unroll(T):
        D[i] = a.ctypes.data
        D[i + 1] = a.shape[0]
        i += 2


if HAS_DIRECTORY:
    @intrinsic
    def view_at(typingctx, address, n, dtype):
        """A 1-D C array of ``n`` ``dtype`` items at ``address`` (no owner:
        whoever made the directory keeps the memory alive)."""
        aryty = types.Array(dtype.instance_type, 1, "C")

        def codegen(context, builder, signature, args):
            address, n, _ = args
            ary = context.make_array(aryty)(context, builder)
            item = context.get_data_type(aryty.dtype)
            itemsize = context.get_constant(types.intp, context.get_abi_sizeof(item))
            populate_array(ary, data=builder.inttoptr(address, item.as_pointer()),
                           shape=cgutils.pack_array(builder, [n]),
                           strides=cgutils.pack_array(builder, [itemsize]),
                           itemsize=itemsize, meminfo=None)
            return ary._getvalue()

        return aryty(address, n, dtype), codegen


def tree_at(D, like):
    """``T`` from directory ``D`` (token dtype of ``like``); ``D`` itself
    when it already is the tuple ``T`` (the fallback)."""
    raise NotImplementedError("tree_at is for kernels only")


@overload(tree_at, inline="always")
def _tree_at(D, like):
    if isinstance(D, types.BaseTuple):
        return lambda D, like: D
    kind = like.dtype

    def from_directory(D, like):
        # one line per TREE_FIELDS entry, dtypes as in layout.FIELD_DTYPES
        return (view_at(D[0], D[1], kind),
                view_at(D[2], D[3], np.int64),     # values
                view_at(D[4], D[5], np.int64),     # start
                view_at(D[6], D[7], np.int32),     # length
                view_at(D[8], D[9], np.int32),     # parent
                view_at(D[10], D[11], np.int32),   # nchild
                view_at(D[12], D[13], np.int32),   # cxor
                view_at(D[14], D[15], np.uint8),   # term
                view_at(D[16], D[17], np.int64),   # table
                view_at(D[18], D[19], np.int32),   # lock
                view_at(D[20], D[21], np.int64),   # stamp
                view_at(D[22], D[23], np.int32),   # hpos
                view_at(D[24], D[25], np.int32),   # heap
                view_at(D[26], D[27], np.int64),   # hkey
                view_at(D[28], D[29], np.uint32),  # gen
                view_at(D[30], D[31], np.int32),   # own
                view_at(D[32], D[33], np.int64))   # meta

    return from_directory
