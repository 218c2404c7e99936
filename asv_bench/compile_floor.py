"""The floor under first-use compile time: what any Numba kernel graph costs
before a line of this project's kernel code is typed.

Each row runs in a fresh process with a fresh, empty Numba cache (as
``first_use.py`` does) and prints its CPU seconds (user + sys):

- ``python`` alone, ``import numpy``, ``import numba``, ``import radix_soa``;
- numba's first trivial ``njit`` compile (``cache=True``), the import included;
- a call graph of N trivial dispatchers (a chain ``f_N -> ... -> f_1``, each
  adding one to its argument, called once from Python at ``f_N``), decorated
  as this project's kernels are (``_nrt=False, cache=True``, each with its
  CPython and cfunc wrappers), as internal callees without those wrappers
  (``no_cpython_wrapper=True, no_cfunc_wrapper=True``), without the cache
  entry, and inlined into one body (``inline='always'``).

The cost per dispatcher is (graph - trivial) / (N - 1).

    python asv_bench/compile_floor.py            # N = 30, best of 3
    python asv_bench/compile_floor.py --n 60 --repeat 5

A measurement script, not a test: nothing here asserts a time.
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_TIMER = r"""
import resource, subprocess, sys
rc = subprocess.call(sys.argv[1:])
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{rc} {ru.ru_utime + ru.ru_stime:.3f}")
"""

TRIVIAL = """
from numba import njit
@njit(cache=True)
def f(x):
    return x + 1
f(1)
"""


def chain(n, options, callee_options=None):
    """Code of a chain of ``n`` dispatchers; the top one has ``options``,
    the others ``callee_options`` (default: the same)."""
    callee_options = options if callee_options is None else callee_options
    lines = ["from numba import njit", "import numpy as np"]
    for i in range(1, n + 1):
        opts = options if i == n else callee_options
        lines.append(f"@njit({opts})")
        body = "x + 1" if i == 1 else f"f{i - 1}(x) + 1"
        lines.append(f"def f{i}(x):\n    return {body}")
    lines.append(f"assert f{n}(np.int64(0)) == {n}")
    return "\n".join(lines)


KERNEL = "cache=True, _nrt=False"
INNER = "cache=True, _nrt=False, no_cpython_wrapper=True, no_cfunc_wrapper=True"
INNER_NOCACHE = "_nrt=False, no_cpython_wrapper=True, no_cfunc_wrapper=True"


def rows(n):
    """``(name, code)``: each code runs as a script file (Numba caches only
    functions defined in a file)."""
    return [
        ("python (empty)", "pass"),
        ("import numpy", "import numpy"),
        ("import numba", "import numba"),
        ("import radix_soa", "import radix_soa"),
        ("first trivial njit (cache=True)", TRIVIAL),
        (f"chain of {n}: kernel (wrappers, cache)", chain(n, KERNEL)),
        (f"chain of {n}: callees no wrappers, cache", chain(n, KERNEL, INNER)),
        (f"chain of {n}: callees no wrappers, no cache", chain(n, KERNEL, INNER_NOCACHE)),
        (f"chain of {n}: callees inline='always'", chain(n, KERNEL, "inline='always'")),
    ]


def measure(code, checkout):
    with tempfile.TemporaryDirectory(prefix="compile-floor-") as tmp:
        script = Path(tmp) / "snippet.py"
        script.write_text(code)
        argv = [sys.executable, str(script)]
        env = dict(os.environ)
        env["NUMBA_CACHE_DIR"] = str(Path(tmp) / "numba-cache")
        env["PYTHONPATH"] = os.pathsep.join(
            [str(checkout)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        done = subprocess.run([sys.executable, "-c", _TIMER, *argv], cwd=tmp, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        status, cpu = done.stdout.split()[-2:]
        if status != "0":
            sys.stderr.write(done.stderr[-2000:])
        return float(cpu)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=30, help="dispatchers in the chain")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    args = parser.parse_args(argv)
    checkout = Path(__file__).resolve().parents[1]
    todo = rows(args.n)
    best = {name: float("inf") for name, _ in todo}
    for _ in range(args.repeat):  # interleaved: each round measures every row once
        for name, cmd in todo:
            best[name] = min(best[name], measure(cmd, checkout))
    print(f"# best of {args.repeat}, fresh Numba cache per run, CPU s (user + sys)")
    for name, _ in todo:
        print(f"{name:<48} {best[name]:7.2f}")
    trivial = best["first trivial njit (cache=True)"]
    for name, _ in todo[5:]:
        print(f"{'  per dispatcher: ' + name.split(': ')[1]:<48} "
              f"{(best[name] - trivial) / (args.n - 1) * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
