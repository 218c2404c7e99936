"""Headline ratios, measured side by side in one run.

    python asv_bench/bench.py            # every section
    python asv_bench/bench.py core       # one section

Each line compares radix_soa with its named baseline on the same data in the
same process; ratios > 1 mean radix_soa is faster (or smaller).
"""

import argparse
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchmarks import common  # noqa: E402

import radix_soa  # noqa: E402


def best_of(fn, repeat=3, setup=None):
    """Best wall time of ``fn`` over ``repeat`` runs (``setup`` untimed)."""
    best = float("inf")
    for _ in range(repeat):
        arg = setup() if setup else None
        t0 = time.perf_counter()
        fn(arg) if setup else fn()
        best = min(best, time.perf_counter() - t0)
    return best


def line(what, ours, base, base_name):
    print(f"  {what:<48} radix_soa {ours * 1e3:9.2f} ms   {base_name} {base * 1e3:9.2f} ms"
          f"   ratio {base / ours:7.2f}x")


def section_core(repeat):
    radix_soa.warmup()
    for wl in common.WORKLOADS:
        seqs = common.sequences(wl)
        ntok = sum(len(s) for s in seqs)
        print(f"\n[core] workload {wl}: {len(seqs):,} sequences, {ntok:,} tokens")
        for kind in ("numpy", "list"):
            data = common.inputs(wl, kind)

            def insert_all(tree, data=data):
                for s in data:
                    tree.insert(s)

            ours = best_of(insert_all, repeat, setup=lambda: common.make("radix_soa"))
            base = best_of(insert_all, repeat, setup=lambda: common.make("reference"))
            line(f"insert, one at a time ({kind} input)", ours, base, "reference")
            rc = common.build("radix_soa", seqs)
            ref = common.build("reference", seqs)
            ours = best_of(lambda: [rc.exists(s) for s in data], repeat)
            base = best_of(lambda: [ref.exists(s) for s in data], repeat)
            line(f"exists, one at a time ({kind} input)", ours, base, "reference")
            misses = common.near_misses(wl)
            if kind == "list":
                misses = [m.tolist() for m in misses]
            ours = best_of(lambda: [rc.match_prefix(s) for s in misses], repeat)
            base = best_of(lambda: [ref.match_prefix(s) for s in misses], repeat)
            line(f"match_prefix, near misses ({kind} input)", ours, base, "reference")
        for dtype in ("int64", "int32"):
            rc = radix_soa.RadixCache(dtype=dtype)
            for s in seqs:
                rc.insert(s)
            usage = rc._s.array_usage()
            used = sum(a["used_bytes"] for a in usage.values())
            tok = usage["tokens"]["used_bytes"]
            print(f"  memory {dtype}: {used / rc.num_tokens:.3f} used bytes per stored token; "
                  f"{tok / rc.num_tokens:.3f} token bytes per stored token + "
                  f"{(used - tok) / rc.num_nodes:.2f} bytes per node "
                  f"({rc.num_nodes:,} nodes, {rc.num_tokens:,} stored tokens)")
    code = ("import time; t=time.perf_counter(); import radix_soa; rc=radix_soa.RadixCache(); "
            "rc.insert([1,2,3]); rc.exists([1,2,3]); rc.match_prefix([1,2]); rc.remove([1,2,3]); "
            "print(time.perf_counter()-t)")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)  # warm the cache
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
        times.append((time.perf_counter() - t0, float(out.stdout)))
    wall, inproc = min(times)
    print(f"\n[core] fresh process, warm on-disk cache: import + first calls {inproc * 1e3:.0f} ms "
          f"(whole interpreter {wall * 1e3:.0f} ms)")


SECTIONS = {"core": section_core}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="*", default=list(SECTIONS), choices=list(SECTIONS))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"radix_soa {radix_soa.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cpus")
    for name in args.sections:
        SECTIONS[name](args.repeat)


if __name__ == "__main__":
    main()
