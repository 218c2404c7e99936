"""``radix-soa study``: replay a workload or a trace against prefix caches
over a range of capacities; the table, JSON, CSV and plot it prints."""

import importlib
import json
import sys
import time
from pathlib import Path


from .. import __version__
from .._warmup import warmup_replay
from ..studies import report, traces
from ..studies.sources import Source
from ..studies.study import (DEFAULT_POINTS, DEFAULT_REQUESTS, DEFAULT_WORKLOAD, capacity_study,
                             generated_trace)
from .args import UsageError, capacity_unit
from .plots import plot_figure
from .output import (describe, in_units, json_summary, jsonable, memory_lines,
                     rounding_line, settings_line, units)
from .cluster import cluster_study
from .progress import LoadProgress, Progress, progress_enabled


def check_study_args(args):
    args.capacity_unit = capacity_unit(args)
    if args.capacity_unit == "bytes" and args.kv_bytes_per_token is None:
        raise UsageError("capacities in bytes need --kv-bytes-per-token (2 x layers x KV "
                         "heads x head dim x bytes per value, e.g. 160KiB)")
    if args.trace is not None:
        if args.workload is not None:
            raise UsageError("give either --workload or --trace, not both")
        for opt, v in (("--requests", args.requests), ("--seed", args.seed)):
            if v is not None:
                raise UsageError(f"{opt} applies to built-in workloads, not to --trace")
    elif args.format is not None:
        raise UsageError("--format needs --trace PATH")
    if args.workers is not None or args.router is not None:
        if args.host_capacity is not None:
            raise UsageError("--host-capacity is not available with --workers/--router (the "
                             "cluster replay has no host tier)")
        if args.schedule != "fcfs":
            raise UsageError("--workers/--router replay each worker in arrival order: "
                             "--schedule must be fcfs")
    if args.plot is not None:
        try:
            importlib.import_module("matplotlib")  # the package itself, not a cached submodule
            from matplotlib.backend_bases import FigureCanvasBase
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install radix-soa[plot]") from None
        supported = FigureCanvasBase.get_supported_filetypes()
        suffix = Path(args.plot).suffix.lower().lstrip(".")
        if suffix not in supported:
            raise UsageError(f"--plot: file name must end in one of "
                             f"{', '.join('.' + k for k in sorted(supported))}; got {args.plot!r}")
        parent = Path(args.plot).resolve().parent
        if not parent.is_dir():
            raise UsageError(f"--plot: directory {str(parent)!r} does not exist")


def load(args):
    if args.trace is not None:
        src = Source(args.trace)
        fmt = args.format or traces.detect_format(src)
        bar = LoadProgress(progress_enabled(args.progress))
        src.progress = bar.update
        try:
            trace = traces.load_trace(src, args.format)
        finally:
            bar.close()
        return trace, {"source": "trace", "path": src.name, "format": fmt,
                       "format_detected": args.format is None}
    name = args.workload or DEFAULT_WORKLOAD
    requests = DEFAULT_REQUESTS if args.requests is None else args.requests
    seed = 0 if args.seed is None else args.seed
    return generated_trace(name, requests, seed)


def plot(path, args, st, trace, desc):
    bs = trace.block_size
    unit = args.capacity_unit
    scale = report.ids_to_capacity(1, unit, bs, args.kv_bytes_per_token)
    if unit == "bytes":
        x_label = f"cache capacity (bytes of KV at {args.kv_bytes_per_token:,} per token)"
    elif unit == "tokens":
        x_label = "cache capacity (tokens)"
    else:
        x_label = f"cache capacity ({report.id_unit(bs)}" + (f" of {bs} tokens)" if bs > 1 else ")")
    what = desc["workload"] if desc["source"] == "workload" else f"{trace.name} ({desc['format']})"
    host = ("no host tier" if args.host_capacity is None
            else f"host tier {in_units(args.host_ids, args, bs)}")
    window = f" (window {args.window})" if args.schedule != "fcfs" else ""
    scored = f", last {1 - args.warmup:.0%} scored" if args.warmup else ""
    title = (f"{what}: {len(trace):,} requests\nschedule {args.schedule}{window}, "
             f"eviction {args.eviction_policy}, page size {args.page_size}, {host}{scored}")
    fig = plot_figure(st.sweep, st.unbounded, st.memory, x_label, title, x_scale=scale)
    fig.savefig(path, dpi=120)
    return fig


def study(args):
    check_study_args(args)
    t_start = time.perf_counter()
    trace, desc = load(args)
    if args.workers is not None or args.router is not None:
        return cluster_study(args, trace, desc, t_start)
    if args.points is None:
        args.points = DEFAULT_POINTS
    bs = trace.block_size
    unit, kvb = args.capacity_unit, args.kv_bytes_per_token
    caps = None
    if args.capacities:
        caps = sorted({report.capacity_to_ids(c, unit, bs, kvb) for c in args.capacities})
    args.host_ids = (None if args.host_capacity is None
                     else report.capacity_to_ids(args.host_capacity, unit, bs, kvb))
    warmup_replay()  # compile (or load) the replay kernels now, so "ms" is the replay alone
    replay_args = dict(page_size=args.page_size, host_capacity=args.host_ids,
                       schedule=args.schedule, window=args.window,
                       eviction_policy=args.eviction_policy, warmup=args.warmup)
    n_caps = len(caps) if caps else args.points
    progress = Progress(1 + n_caps, progress_enabled(args.progress))

    def progress_report(done, total):
        if total != progress.total:  # known once the unbounded replay is done
            progress.set_total(total)
        progress.set(done)

    try:
        st = capacity_study(trace, caps, args.points, progress=progress_report, **replay_args)
    finally:
        progress.close()
    unbounded, footprint, result, mem = st.unbounded, st.footprint, st.sweep, st.memory
    seconds = time.perf_counter() - t_start
    summary = report.summary_line(result.results, unbounded, footprint, unit, kvb)
    if args.plot is not None:
        plot(args.plot, args, st, trace, desc)

    if args.csv:
        sys.stdout.write(report.to_csv(result.results, unit, kvb))
        return 0
    if args.json:
        best = report.smallest_reaching(result.results, 0.9 * unbounded.hit_rate)
        doc = {
            "version": __version__,
            "workload": {**desc, **trace.summary()},
            "units": units(bs)[1],
            "id_unit": report.id_unit(bs),
            "capacity_unit": unit,
            "kv_bytes_per_token": kvb,
            "settings": {"schedule": args.schedule, "window": args.window,
                         "page_size": args.page_size, "host_capacity": args.host_ids,
                         "eviction_policy": args.eviction_policy, "warmup": args.warmup},
            "footprint": footprint,
            "capacities": [r.capacity for r in result.results],
            "capacities_in_unit": [report.ids_to_capacity(r.capacity, unit, bs, kvb)
                                   for r in result.results],
            "capacities_asked": None if not args.capacities else [int(c) for c in
                                                                  args.capacities],
            "rounding": rounding_line(args, bs),
            "unbounded": json_summary(unbounded),
            "sweep": [json_summary(r) for r in result.results],
            "summary": {"line": summary, "share_of_unbounded": 0.9,
                        "smallest_capacity": None if best is None else best.capacity},
            "index_memory": mem,
            "plot": None if args.plot is None else str(args.plot),
            "seconds": seconds,
        }
        print(json.dumps(doc, indent=2, default=jsonable, allow_nan=False))
        return 0
    print(describe(desc, trace))
    print(settings_line(args, trace, footprint, unbounded))
    rounded = rounding_line(args, bs)
    if rounded:
        print(rounded)
    print()
    print(report.table(result.results, unit, kvb))
    print()
    print(summary)
    print()
    print("\n".join(memory_lines(mem, units(bs)[0], bs)))
    if args.plot is not None:
        print(f"\nplot written to {args.plot}")
    return 0
