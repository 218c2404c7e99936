"""``radix-soa study --workers/--router``: the study over N workers behind
a router (``radix_soa.replay_cluster``)."""

import json
import sys
import time

from .. import __version__
from .._warmup import warmup_cluster, warmup_replay
from ..studies import report
from ..studies.cluster import sweep_cluster
from ..studies.study import default_capacities
from .plots import plot_cluster_figure
from .progress import Progress, progress_enabled
from .output import describe, jsonable, rounding_line


CLUSTER_POINTS = 4
CLUSTER_ROUTERS = ["round_robin", "cache_aware", "kv_overlap"]


def cluster_summary(rows):
    """One line per (workers, capacity) with round robin and another router:
    what the best router saves over round robin, and at what imbalance."""
    lines = []
    by = {}
    for r in rows:
        by.setdefault((r["workers"], r["capacity"]), {})[r["router"]] = r
    for (w, cap), routers in by.items():
        base = routers.get("round_robin")
        others = [r for name, r in routers.items() if name != "round_robin"]
        if base is None or not others or w == 1:
            continue
        best = max(others, key=lambda r: r["prefill_tokens_saved"])
        gain = best["prefill_tokens_saved"] - base["prefill_tokens_saved"]
        where = "unbounded" if cap is None else f"{cap:,}"
        lines.append(f"  {w} workers, capacity {where}: {best['router']} saves {gain:+,} prompt "
                     f"tokens over round_robin ({best['prefill_saved_fraction']:.1%} vs "
                     f"{base['prefill_saved_fraction']:.1%} of prefill), load imbalance "
                     f"{best['load_imbalance']:.2f} vs {base['load_imbalance']:.2f}")
    return lines


def cluster_study(args, trace, desc, t_start):
    bs = trace.block_size
    unit, kvb = args.capacity_unit, args.kv_bytes_per_token
    workers = args.workers or [8]
    routers = args.router or CLUSTER_ROUTERS
    warmup_replay()
    warmup_cluster()  # so each row's "seconds" is the replay, not compilation
    common = dict(page_size=args.page_size, eviction_policy=args.eviction_policy,
                  warmup=args.warmup)
    if args.capacities:
        caps = sorted({report.capacity_to_ids(c, unit, bs, kvb) for c in args.capacities})
    else:  # per worker: the grid of the one-cache study over that cache's footprint
        from ..studies.replay import replay
        footprint = replay(trace, page_size=args.page_size,
                           eviction_policy=args.eviction_policy).peak_ids
        caps = default_capacities(footprint, args.points or CLUSTER_POINTS)
    total = len(workers) * len(routers) * len(caps)
    progress = Progress(total, progress_enabled(args.progress))
    try:
        result = sweep_cluster(trace, workers=workers, capacities=caps, routers=routers,
                               progress=progress.set, **common)
    finally:
        progress.close()
    seconds = time.perf_counter() - t_start
    rows = result.rows
    what = desc["workload"] if desc["source"] == "workload" else f"{trace.name} ({desc['format']})"
    if args.plot is not None:
        title = (f"{what}: {len(trace):,} requests over {', '.join(map(str, workers))} "
                 f"workers\npage size {args.page_size}, eviction {args.eviction_policy}")
        ids = report.id_unit(bs)
        fig = plot_cluster_figure(result, f"capacity per worker ({ids})", title)
        fig.savefig(args.plot, dpi=120)
    if args.csv:
        sys.stdout.write(result.to_csv())
        return 0
    if args.json:
        doc = {
            "version": __version__,
            "workload": {**desc, **trace.summary()},
            "id_unit": report.id_unit(bs),
            "settings": {"workers": workers, "routers": routers, "capacities": caps,
                         "page_size": args.page_size, "eviction_policy": args.eviction_policy,
                         "warmup": args.warmup},
            "rows": rows,
            "per_worker": [{k: v.tolist() for k, v in r.per_worker.items()}
                           for r in result.results],
            "plot": None if args.plot is None else str(args.plot),
            "seconds": seconds,
        }
        print(json.dumps(doc, indent=2, default=jsonable, allow_nan=False))
        return 0
    print(describe(desc, trace))
    print(f"{len(workers) * len(routers)} clusters ({', '.join(map(str, workers))} workers x "
          f"{', '.join(routers)}); capacity per worker in {report.id_unit(bs)}; page size "
          f"{args.page_size}, eviction {args.eviction_policy}; load from the trace's "
          f"timestamps and output lengths (see radix_soa.studies.cluster)")
    rounded = rounding_line(args, bs)
    if rounded:
        print(rounded)
    print()
    print(result.table())
    summary = cluster_summary(rows)
    if summary:
        print()
        print("\n".join(summary))
    print()
    print("hit rate: cached ids / all ids over every worker; prefill saved: prompt tokens not "
          "recomputed; imbalance: the busiest worker's busy time / the mean (1.00 = even); "
          "req imbalance: the same for request counts; mean TTFT: the model's time to first "
          "token")
    if args.plot is not None:
        print(f"\nplot written to {args.plot}")
    return 0
