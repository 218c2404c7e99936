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

from numba import njit

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


# Any: a Numba dispatcher takes whatever its compiled signatures do
kernel: Any = njit(**kernel_options())
kernel_nogil: Any = njit(**kernel_options(nogil=True))
kernel_alloc: Any = njit(cache=True)
kernel_scratch: Any = njit(cache=True, nogil=True)
kernel_parallel: Any = njit(cache=True, parallel=True)
