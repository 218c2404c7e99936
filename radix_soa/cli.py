"""The ``radix-soa`` command.

``radix-soa build`` (the default) builds a tree from a built-in, seeded
shared-prefix workload and reports what it stored::

    $ radix-soa build --sequences 2000
"""

import argparse
import json
import sys
import time

import numpy as np

from . import workloads
from .radix_cache import RadixCache


def _build(args):
    t0 = time.perf_counter()
    seqs = workloads.shared_prefix(n_sequences=args.sequences, n_prompts=args.prompts,
                                   prompt_len=args.prompt_len, seed=args.seed)
    t_gen = time.perf_counter() - t0
    rc = RadixCache(dtype=args.dtype)
    rc.insert(seqs[0][:1])  # compile or load the kernels before timing
    rc.remove(seqs[0][:1])
    t0 = time.perf_counter()
    for s in seqs:
        rc.insert(s)
    t_insert = time.perf_counter() - t0
    t0 = time.perf_counter()
    found = sum(rc.exists(s) for s in seqs)
    t_exists = time.perf_counter() - t0
    usage = rc._s.array_usage()
    used = sum(a["used_bytes"] for a in usage.values())
    allocated = sum(a["allocated_bytes"] for a in usage.values())
    inserted = int(sum(len(s) for s in seqs))
    report = {
        "workload": f"shared_prefix(n_sequences={args.sequences}, n_prompts={args.prompts}, "
                    f"prompt_len={args.prompt_len}, seed={args.seed})",
        "dtype": rc.dtype.name,
        "sequences": len(seqs),
        "distinct_sequences": len(rc),
        "tokens_inserted": inserted,
        "tokens_stored": rc.num_tokens,
        "compression_ratio": round(inserted / max(rc.num_tokens, 1), 3),
        "nodes": rc.num_nodes,
        "used_bytes": used,
        "allocated_bytes": allocated,
        "bytes_per_stored_token": round(used / max(rc.num_tokens, 1), 3),
        "all_found": found == len(seqs),
        "generate_seconds": round(t_gen, 4),
        "insert_seconds": round(t_insert, 4),
        "exists_seconds": round(t_exists, 4),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        width = max(len(k) for k in report)
        for k, v in report.items():
            if isinstance(v, int) and not isinstance(v, bool):
                v = f"{v:,}"
            print(f"{k:<{width}}  {v}")
    return 0 if report["all_found"] else 1


def build_parser():
    parser = argparse.ArgumentParser(
        prog="radix-soa",
        description="Radix-tree prefix cache over token sequences (NumPy + Numba).")
    sub = parser.add_subparsers(dest="command")
    b = sub.add_parser("build", help="build a tree from a built-in workload and report it (default)")
    b.add_argument("--sequences", type=int, default=20_000, help="number of sequences (default 20000)")
    b.add_argument("--prompts", type=int, default=50, help="distinct system prompts (default 50)")
    b.add_argument("--prompt-len", type=int, default=800, help="system prompt tokens (default 800)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--dtype", default="int64", choices=["int64", "int32", "uint16"])
    b.add_argument("--json", action="store_true", help="machine-readable output")
    b.set_defaults(func=_build)
    return parser


def main(argv=None):
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["build"] + argv
    args = parser.parse_args(argv)
    for name in ("sequences", "prompts", "prompt_len"):
        if getattr(args, name, 1) < 1:
            parser.exit(2, f"radix-soa: error: --{name.replace('_', '-')} must be >= 1\n")
    np.seterr(all="ignore")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
