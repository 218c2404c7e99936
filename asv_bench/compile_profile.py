"""Where Numba compile time goes: per kernel and per specialization.

Runs a Python snippet, a module (``-m``) or ``radix-soa warmup`` (the
default) with a fresh Numba cache and Numba's ``numba:compile`` events
recorded, then prints, per compiled specialization, its inclusive seconds
(typing its callees included) and its exclusive seconds (its own typing,
lowering and LLVM), and per kernel the number of specializations compiled.

    python asv_bench/compile_profile.py                        # radix-soa warmup
    python asv_bench/compile_profile.py -c "import radix_soa as rs; rs.RadixCache().insert([1])"
    python asv_bench/compile_profile.py --top 40 --sigs        # show argument types

The snippet runs in this process, so the numbers are wall seconds of the
compiler; on a busy machine compare rows, not runs.
"""

import argparse
import os
import runpy
import sys
import tempfile
import time
from collections import defaultdict


def install():
    """Record every ``numba:compile`` event; returns the list they go to:
    ``(qualname, module, args, inclusive s, exclusive s, depth)``."""
    from numba.core import event

    records = []
    stack = []

    class Listener(event.Listener):
        def on_start(self, ev):
            stack.append([time.process_time(), 0.0])

        def on_end(self, ev):
            t0, nested = stack.pop()
            dt = time.process_time() - t0
            if stack:
                stack[-1][1] += dt
            disp = ev.data["dispatcher"]
            py = disp.py_func
            records.append((py.__qualname__, py.__module__, ev.data["args"], dt, dt - nested,
                            len(stack)))

    event.register("numba:compile", Listener())
    return records


def short(args):
    """Argument types in a short form: ``i8[:]`` a writable int64 array,
    ``i8[:]ro`` a read-only one, ``T17`` the tree tuple of 17 arrays."""
    from numba.core import types

    def one(t):
        if isinstance(t, types.Array):
            return f"{t.dtype}[{':' * 1}{',:' * (t.ndim - 1)}]" + ("" if t.mutable else "ro")
        if isinstance(t, types.BaseTuple) and len(t) > 4:
            return f"T{len(t)}" + ("ro" if any(isinstance(x, types.Array) and not x.mutable
                                              for x in t) else "")
        if isinstance(t, types.Literal):
            return f"L{t.literal_value!r}"
        return str(t)
    return "(" + ", ".join(one(t) for t in args) + ")"


def report(records, top, sigs, out=sys.stdout):
    per_kernel = defaultdict(lambda: [0, 0.0])
    for name, module, args, incl, excl, depth in records:
        k = per_kernel[(module, name)]
        k[0] += 1
        k[1] += excl
    total = sum(r[4] for r in records)
    out.write(f"# {len(records)} specializations of {len(per_kernel)} kernels compiled, "
              f"{total:.1f} s exclusive in all\n")
    out.write(f"{'kernel':<56} {'specs':>5} {'excl s':>7}\n")
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1][1])
    for (module, name), (n, excl) in ranked[:top]:
        out.write(f"{module.replace('radix_soa.', '') + '.' + name:<56} {n:>5} {excl:7.2f}\n")
    if sigs:
        out.write(f"\n{'specialization':<56} {'incl s':>7} {'excl s':>7}\n")
        for name, module, args, incl, excl, depth in sorted(records, key=lambda r: -r[4])[:top]:
            out.write(f"{name:<56} {incl:7.2f} {excl:7.2f}\n    {short(args)}\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", dest="code", help="Python code to run")
    parser.add_argument("-m", dest="module", help="module to run as __main__")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--sigs", action="store_true", help="list specializations too")
    parser.add_argument("--keep-cache", action="store_true",
                        help="use NUMBA_CACHE_DIR as set (default: a fresh one)")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if not args.keep_cache:
        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile-profile-")
    records = install()
    t0 = time.process_time()
    try:
        if args.code is not None:
            exec(compile(args.code, "<snippet>", "exec"), {"__name__": "__main__"})
        elif args.module is not None:
            sys.argv = [args.module] + args.rest
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        else:
            from radix_soa import warmup
            warmup()
    except SystemExit:
        pass
    finally:
        sys.stdout.write(f"# CPU s of this process: {time.process_time() - t0:.1f}\n")
        report(records, args.top, args.sigs)


if __name__ == "__main__":
    main()
