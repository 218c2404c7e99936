"""The one place kernels get their Numba options.

``kernel`` is the decorator of every kernel that does not allocate: it runs
without Numba's reference counting (NRT), because with it each array
argument costs two atomic updates per call, which made an insert of a short
leaf ten times slower. ``_nrt`` is a private Numba option, so it is used only
when this Numba version has it (``HAS_NRT_FLAG``); otherwise kernels fall
back to plain ``njit(cache=True)``, which is correct, only slower per call.

``kernel_alloc`` is for the few kernels that build new arrays, ``kernel_parallel``
for ``prange`` loops, ``kernel_nogil`` for the replay (sweeps run replays on
threads), ``kernel_scratch`` for GIL-free loops that allocate scratch of their
own (the grouped batch descents).
"""

from typing import Any

from numba import typeof
from numba.core import types, typing
from numba.core.registry import CPUDispatcher

from . import notice

notice.install()  # "compiling kernels, once" on a terminal, before the first compiles


def nrt_flag_supported():
    """True if this Numba accepts the private ``_nrt`` target option."""
    try:
        from numba.core.cpu import CPUTargetOptions
    except ImportError:
        return False
    return getattr(CPUTargetOptions, "_nrt", None) is not None


HAS_NRT_FLAG = nrt_flag_supported()


def kernel_options(nrt_flag=HAS_NRT_FLAG, **extra):
    """Options for a non-allocating kernel (``nrt_flag``: use ``_nrt=False``)."""
    options = {"cache": True, **extra}
    if nrt_flag:
        options["_nrt"] = False
    return options


def plain_type(t):
    """The type a kernel called from another kernel is compiled for: a
    constant's plain type (``Literal[int](1)`` -> ``int64``), a left-out
    argument's default's (``omitted(default=None)`` -> ``none``)."""
    if isinstance(t, types.Omitted):
        t = typeof(t.value)
    return types.unliteral(t)


class KernelDispatcher(CPUDispatcher):
    """A dispatcher that compiles one specialization per argument types for
    its callers in compiled code, not one per constant they pass or
    argument they leave out (Numba's default: ``descend(..., 1)`` and
    ``descend(..., page)`` compiled ``descend`` twice, ``f(x)`` and
    ``f(x, None)`` too). The caller's machine code still sees the constant:
    Numba links the callee into the caller, and LLVM inlines and folds it
    there."""

    def get_call_template(self, args, kws):
        # Numba's own, with the folded argument types made plain
        pysig, args = self._compiler.fold_argument_types(args, kws)
        args = tuple(plain_type(a) for a in args)
        if self._can_compile:
            self.compile(args)
        name = self.py_func.__name__
        template = typing.make_concrete_template(f"CallTemplate({name})", key=name,
                                                 signatures=self.nopython_signatures)
        return template, pysig, args, {}


def _njit(cache=True, **options):
    """``njit(cache=cache, **options)``, making ``KernelDispatcher``s."""
    options["nopython"] = True
    options.setdefault("boundscheck", None)

    def wrap(func):
        disp = KernelDispatcher(py_func=func, locals={}, targetoptions=options)
        if cache:
            disp.enable_caching()
        return disp
    return wrap


# Any: a Numba dispatcher takes whatever its compiled signatures do
kernel: Any = _njit(**kernel_options())
kernel_nogil: Any = _njit(**kernel_options(nogil=True))
kernel_alloc: Any = _njit(cache=True)
kernel_scratch: Any = _njit(cache=True, nogil=True)
kernel_parallel: Any = _njit(cache=True, parallel=True)
