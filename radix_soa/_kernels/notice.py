"""One line on a terminal before the first kernel compiles: "compiling
kernels, once". A cold start compiles for seconds (a minute for
``radix-soa warmup``) and a silent pause reads as a hang; later processes
load the kernels from Numba's on-disk cache, which compiles nothing and
prints nothing.

It listens to Numba's compile events (``numba.core.event``, documented as
Numba's event API), only when this Numba has them; without them nothing is
printed and nothing else changes (``install`` returns False).

Call graph (callers after their callees): the one line printed before the
first kernel compiles
"""

import os
import sys

MESSAGE = ("radix-soa: compiling kernels, once (Numba caches them on disk; "
           "`radix-soa warmup` compiles them all now) ...")


def _on_terminal(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def install(stream=None, event_module=None):
    """Print ``MESSAGE`` to ``stream`` (default: stderr, only if it is a
    terminal and ``RADIX_SOA_QUIET`` is unset) when the first kernel of
    radix_soa starts compiling in this process. Returns True if installed.

    >>> import io, types
    >>> install(io.StringIO(), event_module=types.SimpleNamespace())  # no event API
    False
    """
    if event_module is None:
        try:
            from numba.core import event as event_module
        except ImportError:
            return False
    register = getattr(event_module, "register", None)
    listener_base = getattr(event_module, "Listener", None)
    if register is None or listener_base is None:
        return False

    class FirstCompile(listener_base):
        said = False

        def on_start(self, ev):
            if self.said:
                return
            func = getattr(ev.data.get("dispatcher"), "py_func", None)
            if not getattr(func, "__module__", "").startswith("radix_soa."):
                return
            self.said = True  # (unregistering here would change the list Numba iterates)
            out = sys.stderr if stream is None else stream
            if stream is not None or (_on_terminal(out) and not os.environ.get("RADIX_SOA_QUIET")):
                print(MESSAGE, file=out, flush=True)

        def on_end(self, ev):
            pass

    try:
        register("numba:compile", FirstCompile())
    except (TypeError, ValueError):  # an event kind this Numba does not know
        return False
    return True
