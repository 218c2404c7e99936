"""First-use cost: CPU seconds (user + sys) of a new user's first steps,
each in a fresh process with a fresh, empty Numba cache, printed as a table.

Rows: ``import radix_soa`` alone (the floor every row pays), the README's
first python block, its prefix-cache serving block (the one with
``PrefixCache(``), ``radix-soa warmup``, and every python block of README.md
and docs/guide/*.md, each run on its own from a scratch working directory
(as ``tests/test_readme.py`` runs them, without its claim checks). Blocks
marked ``<!-- needs: ../shared/data -->`` run when ``../shared/data`` exists
beside the checkout, else they are listed as skipped.

    python asv_bench/first_use.py                    # this checkout
    python asv_bench/first_use.py --checkout ../main # another one, to compare
    python asv_bench/first_use.py --only readme      # rows whose name has "readme"
    python asv_bench/first_use.py --jobs 2           # rows in parallel processes
    python asv_bench/first_use.py --warm             # the second run: kernels loaded from the cache
    python asv_bench/first_use.py --checkout ../main --checkout . --repeat 3 --only readme
                                      # checkouts side by side: interleaved, best of 3

With several ``--checkout`` (or ``--repeat``), every round measures each row
on each checkout in turn, and the table shows each checkout's best CPU
seconds and the ratio of the last to the first.

CPU seconds are measured with ``resource.getrusage(RUSAGE_CHILDREN)``
around each child (one child per row, so rows run in parallel do not mix),
so they hardly move with the machine's load; wall seconds are shown too.
This is a measurement script, not a test: nothing here asserts a time.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
NEEDS_DATA = "<!-- needs: ../shared/data -->"

# a child that runs ``argv`` and prints its own children's CPU seconds
_TIMER = r"""
import resource, subprocess, sys, time
t0 = time.perf_counter()
rc = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{rc} {ru.ru_utime + ru.ru_stime:.3f} {wall:.3f}")
"""


def python_blocks(doc):
    """``(line, code, needs_data)`` of every python block of ``doc``."""
    text = doc.read_text()
    out = []
    for m in FENCE.finditer(text):
        if m.group(1) != "python":
            continue
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        out.append((text.count("\n", 0, m.start(2)) + 1, m.group(2), before == NEEDS_DATA))
    return out


def rows(checkout):
    """``(name, argv or None, needs_data)`` of every measured row."""
    py = sys.executable
    readme = checkout / "README.md"
    docs = [readme] + sorted((checkout / "docs" / "guide").glob("*.md"))
    first = python_blocks(readme)[0]
    serving = next(b for b in python_blocks(readme) if "PrefixCache(" in b[1])
    out = [
        ("import radix_soa", [py, "-c", "import radix_soa"], False),
        (f"README first block (line {first[0]})", [py, "-c", first[1]], False),
        (f"README serving block (line {serving[0]})", [py, "-c", serving[1]], False),
        ("radix-soa warmup", [py, "-m", "radix_soa", "warmup"], False),
    ]
    for doc in docs:
        for line, code, needs in python_blocks(doc):
            name = f"{doc.relative_to(checkout)}:{line}"
            out.append((name, [py, "-c", code], needs))
    return out


def measure(argv, checkout, extra_env=None, warm=False):
    """``(exit status, CPU s, wall s)`` of ``argv`` run with a fresh Numba
    cache from a scratch directory laid out like a checkout's parent;
    ``warm``: run once untimed first, then timed on the cache it filled
    (what a user pays once the kernels are cached, or were shipped)."""
    with tempfile.TemporaryDirectory(prefix="first-use-") as tmp:
        work = Path(tmp) / "radix_soa"
        work.mkdir()
        shared = checkout.parent / "shared"
        if shared.is_dir():
            (Path(tmp) / "shared").symlink_to(shared, target_is_directory=True)
        env = dict(os.environ)
        env.update(extra_env or {})
        env["NUMBA_CACHE_DIR"] = str(Path(tmp) / "numba-cache")
        env["PYTHONPATH"] = os.pathsep.join(
            [str(checkout)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env.setdefault("MPLBACKEND", "Agg")
        if warm:
            subprocess.run(argv, cwd=work, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        done = subprocess.run([sys.executable, "-c", _TIMER, *argv], cwd=work, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        status, cpu, wall = done.stdout.split()
        if status != "0":
            sys.stderr.write(done.stderr[-2000:])
        return int(status), float(cpu), float(wall)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, action="append", default=[],
                        help="a checkout to measure (default: this one); repeat to compare")
    parser.add_argument("--only", action="append", default=[],
                        help="measure rows whose name contains this (repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="rows measured at once")
    parser.add_argument("--warm", action="store_true",
                        help="time a second run on the cache the first filled")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds (each row on each checkout once a round); best is shown")
    args = parser.parse_args(argv)
    checkouts = [c.resolve() for c in args.checkout] or [Path(__file__).resolve().parents[1]]
    if len(checkouts) == 1 and args.repeat == 1:
        return single(checkouts[0], args)
    have_data = all((c.parent / "shared" / "data").is_dir() for c in checkouts)
    per = [[r for r in rows(c) if not args.only or any(o.lower() in r[0].lower() for o in args.only)]
           for c in checkouts]
    names = [r[0] for r in per[0]]
    if any([r[0] for r in p] != names for p in per):
        raise SystemExit("the checkouts' rows differ (their README or guide blocks); compare "
                         "with --only on rows they share")
    for i, c in enumerate(checkouts):
        print(f"# [{i}] {c}")
    print(f"# best of {args.repeat} rounds, interleaved; fresh Numba cache per run; CPU s")
    print(f"{'row':<44} " + " ".join(f"{'[' + str(i) + ']':>8}" for i in range(len(checkouts)))
          + ("   last/first" if len(checkouts) > 1 else ""))
    for k, name in enumerate(names):
        if per[0][k][2] and not have_data:
            print(f"{name:<44} {'skipped (needs ../shared/data)':>17}")
            continue
        best = [float("inf")] * len(checkouts)
        failed = [False] * len(checkouts)
        for _ in range(args.repeat):
            for i, c in enumerate(checkouts):
                status, cpu, wall = measure(per[i][k][1], c, warm=args.warm)
                failed[i] |= status != 0
                best[i] = min(best[i], cpu)
        cells = " ".join(f"{b:8.2f}" + ("!" if f else "") for b, f in zip(best, failed))
        ratio = f"   {best[-1] / best[0]:8.2f}x" if len(checkouts) > 1 else ""
        print(f"{name:<44} {cells}{ratio}", flush=True)
    if any(failed):
        print("# !: a run failed (its stderr is above)")


def single(checkout, args):
    """One checkout, one round: the table with wall seconds too."""
    have_data = (checkout.parent / "shared" / "data").is_dir()
    todo = [r for r in rows(checkout)
            if not args.only or any(o.lower() in r[0].lower() for o in args.only)]
    print(f"# {checkout}  (fresh Numba cache per row; CPU = user + sys of the child)")
    print(f"{'row':<44} {'CPU s':>8} {'wall s':>8}")

    def one(row):
        name, cmd, needs = row
        if needs and not have_data:
            return name, None
        return name, measure(cmd, checkout, warm=args.warm)

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for name, result in pool.map(one, todo):
            if result is None:
                print(f"{name:<44} {'skipped (needs ../shared/data)':>17}")
                continue
            status, cpu, wall = result
            mark = "" if status == 0 else f"  FAILED (exit {status})"
            print(f"{name:<44} {cpu:8.2f} {wall:8.2f}{mark}", flush=True)


if __name__ == "__main__":
    main()
