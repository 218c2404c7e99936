"""``radix-soa build``: build a tree from a built-in shared-prefix workload
and report what it stored."""

import json
import time

from ..radix_cache import RadixCache
from ..studies import workloads


def build(args):
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
    rep = rc.memory_report()
    used, allocated = rep["used_bytes"], rep["total_bytes"]
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
