"""``percall.py``'s hot single calls for two checkouts, interleaved in one
process, so that the load of a shared machine falls on both alike::

    python asv_bench/percall_ab.py /work/main /path/to/branch [rounds]

Each checkout's ``radix_soa`` is copied under its own name
(``radix_soa_a``, ``radix_soa_b`` in ``<tmp>/radix_soa-percall_ab``; the
package imports itself relatively) and both are imported side by side. Each round times every row
on both sides (20,000 calls a block, CPU time, the side going first
alternating by round); printed per row: the best block of each side in µs
per call, and the ratio b / a of the bests and of the medians.
"""

import importlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# the copies live at the same place from run to run, and Numba's cache
# beside them (set before Numba is imported), so a second run compiles
# only what changed
HOME = Path(tempfile.gettempdir()) / "radix_soa-percall_ab"
os.environ.setdefault("NUMBA_CACHE_DIR", str(HOME / "numba-cache"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from percall import rows  # noqa: E402

N = 20_000


def block(fn, n=N):
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t0) / n * 1e6


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__.split("::")[1].strip().splitlines()[0], file=sys.stderr)
        return 2
    rounds = int(argv[2]) if len(argv) == 3 else 9
    sides = {}
    for name, checkout in zip(("radix_soa_a", "radix_soa_b"), argv[:2]):
        shutil.rmtree(HOME / name, ignore_errors=True)
        shutil.copytree(Path(checkout) / "radix_soa", HOME / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(HOME))
    for name in ("radix_soa_a", "radix_soa_b"):
        sides[name] = rows(importlib.import_module(name))
        for _, fn in sides[name]:
            fn()  # compiled (or loaded from Numba's cache) before any timing
    times = {name: [[] for _ in rows_] for name, rows_ in sides.items()}
    for r in range(rounds):
        order = ("radix_soa_a", "radix_soa_b") if r % 2 == 0 else ("radix_soa_b", "radix_soa_a")
        for i in range(len(sides["radix_soa_a"])):
            for name in order:
                times[name][i].append(block(sides[name][i][1]))
    print(f"{'row (µs per call, CPU time; a, b)':<48} {'a':>7} {'b':>7} {'b/a best':>8} "
          f"{'median':>6}")
    for i, (label, _) in enumerate(sides["radix_soa_a"]):
        a, b = times["radix_soa_a"][i], times["radix_soa_b"][i]
        print(f"{label:<48} {min(a):7.3f} {min(b):7.3f} {min(b) / min(a):8.3f} "
              f"{statistics.median(b) / statistics.median(a):6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
