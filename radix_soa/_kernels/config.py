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

``kernel_inner`` (and ``kernel_inner_alloc``, with NRT) is for internal
callees, kernels only other kernels call: Numba compiles them without the
CPython and cfunc wrappers, which cost about 30 ms of first-use compile time
per specialization (``asv_bench/compile_floor.py``) and are never used by a
call from compiled code. The machine code callers link in is the same. A call
from Python (the tests do) goes through a small compiled trampoline, made on
the first such call, instead of crashing as a wrapper-less Numba function
would.

``kernel_helper`` is ``kernel_inner`` for small helpers that LLVM inlines
into their callers: it compiles one specialization per plain argument types
(a literal constant as its type, a signed integer below 64 bits as int64),
not a twin per constant a caller passes or per node-id width (an int32 read
from a node array, an int64 from a counter); inlined, the caller's constant
folds again. Larger callees keep their literal specializations: there the
folded flags are worth their compile time (``insert_batch`` ran 1.1-1.6x
slower when every callee was typed on plain types).

Call graph (callers after their callees): the decorators (kernel,
kernel_alloc, kernel_parallel, kernel_nogil, kernel_scratch, kernel_inner,
kernel_inner_alloc, kernel_helper)
"""

import os
from typing import Any

from numba import config as numba_config
from numba import njit
from numba.core import registry, types

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


_NO_WRAPPERS = {"no_cpython_wrapper": True, "no_cfunc_wrapper": True}


def _inner_dispatcher_type():
    # built here, not at module level: the kernel modules' attributes that
    # have ``signatures`` are their kernels (tests list them so), and a
    # dispatcher class has that attribute too
    class InnerDispatcher(registry.CPUDispatcher):
        """A dispatcher compiled without the CPython and cfunc wrappers; a
        call from Python goes through a compiled trampoline (made once, not
        cached)."""

        def __call__(self, *args):
            trampoline = self.__dict__.get("_trampoline")
            if trampoline is None:
                callee = self

                def trampoline(*a):
                    return callee(*a)
                options = {k: v for k, v in self.targetoptions.items()
                           if k not in _NO_WRAPPERS and k != "cache"}
                trampoline = self.__dict__["_trampoline"] = njit(**options)(trampoline)
            return trampoline(*args)

    return InnerDispatcher


def _plain(t):
    """``t`` without its literal value, a signed integer below 64 bits as int64."""
    t = types.unliteral(t)
    if isinstance(t, types.Integer) and t.signed and t.bitwidth < 64:
        return types.int64
    return t


def _helper_dispatcher_type(base):
    class HelperDispatcher(base):
        """An internal callee typed on plain argument types (see ``_plain``)."""

        def get_call_template(self, args, kws):
            return super().get_call_template(tuple(_plain(a) for a in args),
                                             {k: _plain(v) for k, v in kws.items()})

    return HelperDispatcher


def inner_supported():
    """True if this Numba has the private pieces ``inner`` builds on: the
    ``no_cpython_wrapper``/``no_cfunc_wrapper`` target options and a
    ``CPUDispatcher`` with ``get_call_template`` and ``enable_caching``.
    Without them (or with ``RADIX_SOA_PLAIN_KERNELS=1``) internal callees are
    plain ``njit`` dispatchers: the same machine code, more compile time.
    (Set it with a ``NUMBA_CACHE_DIR`` of its own: Numba's cache does not
    key a compile by its wrappers.)"""
    if os.environ.get("RADIX_SOA_PLAIN_KERNELS", "") not in ("", "0"):
        return False
    try:
        from numba.core.cpu import CPUTargetOptions
    except ImportError:
        return False
    base = getattr(registry, "CPUDispatcher", None)
    return (all(getattr(CPUTargetOptions, k, None) is not None for k in _NO_WRAPPERS)
            and base is not None and callable(getattr(base, "get_call_template", None))
            and callable(getattr(base, "enable_caching", None)))


def inner(options, plain=False, supported=None):
    """A decorator for internal callees with Numba ``options`` (``plain``:
    typed on plain argument types, as ``kernel_helper``; ``supported``:
    ``inner_supported()`` unless given)."""
    def decorate(func):
        ok = HAS_INNER if supported is None else supported
        if numba_config.DISABLE_JIT or not ok:
            return njit(**options)(func)
        targetoptions = {k: v for k, v in options.items() if k != "cache"}
        targetoptions.update(_NO_WRAPPERS)
        dispatcher_type = inner.helper_type if plain else inner.dispatcher_type
        dispatcher = dispatcher_type(py_func=func, locals={}, targetoptions=targetoptions)
        if options.get("cache"):
            dispatcher.enable_caching()
        return dispatcher
    return decorate


HAS_INNER = inner_supported()
inner.dispatcher_type = _inner_dispatcher_type()  # type: ignore[attr-defined]
inner.helper_type = _helper_dispatcher_type(inner.dispatcher_type)  # type: ignore[attr-defined]
kernel_inner: Any = inner(kernel_options())
kernel_inner_alloc: Any = inner({"cache": True})
kernel_helper: Any = inner(kernel_options(), plain=True)
