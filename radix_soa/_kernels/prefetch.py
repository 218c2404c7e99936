"""A cache hint for kernels: ``prefetch(arr, i)`` asks the CPU to start
loading ``arr[i]`` and goes on at once.

A batch kernel that walks several independent queries at a time issues the
loads of each query's next step (a table slot, a node, its first tokens)
before it touches any of them, so their cache misses overlap instead of
following one another (group prefetching). The hint is LLVM's
``llvm.prefetch`` (read, high locality, data cache); it never faults and
changes no result. Numba's public ``intrinsic`` API builds it; where the
internals it needs are missing (``HAS_PREFETCH`` False) ``prefetch`` is a
kernel that does nothing, so kernels stay correct, only slower on trees
past the cache.

Call graph (callers after their callees): prefetch (a cache hint; an
intrinsic)
"""

from .config import kernel

try:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic
except ImportError:  # pragma: no cover - a Numba without these internals
    HAS_PREFETCH = False
else:
    HAS_PREFETCH = True

if HAS_PREFETCH:
    @intrinsic
    def prefetch(typingctx, arr, i):
        """Hint that ``arr[i]`` (1-D array, integer index) is read soon."""
        if not isinstance(arr, types.Array) or not isinstance(i, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]],
                                           wraparound=False, boundscheck=False)
            i8p = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
            # read (0), keep in every cache level (3), data cache (1)
            builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
            return context.get_dummy_value()

        return types.void(arr, types.intp), codegen
else:  # pragma: no cover
    @kernel
    def prefetch(arr, i):
        """No hint on this Numba."""
        return None
