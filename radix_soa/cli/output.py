"""What ``radix-soa study`` prints: the workload line, the settings line,
the index memory, values said in the chosen capacity unit, JSON values."""

import numpy as np

from ..studies import report


def units(block_size):
    if block_size == 1:
        return "ids", "ids (= tokens)"
    return "blocks", f"{block_size}-token blocks"


def describe(desc, trace):
    s = trace.summary()
    n_ns = s["namespaces"]
    if desc["source"] == "workload":
        what = f"workload {desc['workload']} ({desc['generator']}, seed {desc['seed']})"
    else:
        what = f"trace {s['name']} ({desc['format']}: {desc['path']})"
    block = ("block size 1 (one id per token)" if s["block_size"] == 1
             else f"block size {s['block_size']} tokens (one id per block)")
    distinct = f" ({s['unique_ids']:,} distinct)" if s["block_size"] > 1 else ""
    return (f"{what}: {s['requests']:,} requests, {s['total_blocks']:,} ids{distinct}, "
            f"{block}, {n_ns} namespace{'s' if n_ns != 1 else ''}")


def settings_line(args, trace, footprint, unbounded):
    bs = trace.block_size
    ids = report.id_unit(bs)
    host = ("no host tier" if args.host_capacity is None
            else f"host tier {in_units(args.host_ids, args, bs)}")
    window = f", window {args.window}" if args.schedule != "fcfs" else ""
    rates = f"{unbounded.hit_rate:.4f} ({ids})"
    if bs > 1:
        rates += f", {unbounded.token_hit_rate:.4f} (tokens)"
    scored = (f"; rates score the last {unbounded.scored_requests:,} requests "
              f"(warmup {args.warmup:g})" if args.warmup else "")
    unit = {"ids": units(bs)[1], "tokens": "tokens",
            "bytes": "bytes of KV"}[args.capacity_unit]
    return (f"capacities in {unit}; unbounded footprint {in_units(footprint, args, bs)}, "
            f"unbounded hit rate {rates}; schedule {args.schedule}{window}, "
            f"eviction {args.eviction_policy}, page size {args.page_size} "
            f"{'id' if args.page_size == 1 else 'ids'}, {host}{scored}")


def rounding_line(args, block_size):
    """A line saying which capacities asked for were rounded down to whole
    ids (``10GB`` of 512-token blocks at 160 KiB a token is 119 blocks:
    9.98 GB), or None when every one is whole."""
    unit, kvb = args.capacity_unit, args.kv_bytes_per_token
    if unit == "ids":
        return None
    name = report.id_unit(block_size)
    given = [("", c) for c in args.capacities or []]
    if args.host_capacity is not None:
        given.append(("host tier ", args.host_capacity))

    def show(x, other):
        if unit == "tokens":
            return f"{int(x):,} tokens"
        short = report.human_bytes(x)
        return short if short != report.human_bytes(other) else f"{int(x):,} B"

    parts = []
    for label, asked in given:
        ids = report.capacity_to_ids(asked, unit, block_size, kvb)
        got = report.ids_to_capacity(ids, unit, block_size, kvb)
        if got != asked:
            parts.append(f"{label}{show(asked, got)} -> {show(got, asked)} ({ids:,} {name})")
    if not parts:
        return None
    one = report.ids_to_capacity(1, unit, block_size, kvb)
    each = report.human_bytes(one) if unit == "bytes" else f"{one:,} tokens"
    return (f"capacities are whole {name} ({each} each), rounded down: " + ", ".join(parts))


def in_units(ids, args, block_size):
    """``ids`` said in the chosen unit, with ids beside when they differ."""
    name = report.id_unit(block_size)
    unit, kvb = args.capacity_unit, args.kv_bytes_per_token
    if unit == "bytes":
        return (f"{report.human_bytes(report.ids_to_capacity(ids, 'bytes', block_size, kvb))} "
                f"of KV ({ids:,} {name})")
    if unit == "tokens" and block_size > 1:
        return f"{report.ids_to_capacity(ids, 'tokens', block_size):,} tokens ({ids:,} {name})"
    return f"{ids:,} {name}"


def memory_lines(mem, unit, block_size):
    lines = ["index memory (a plain RadixCache holding every request, unbounded; the table's "
             "index bytes are the replay's LRU cache, eviction bookkeeping included):"]
    if mem["namespace_handling"]:
        lines.append(f"  ids are per namespace: for this report only, "
                     f"{mem['namespace_handling']} so the {mem['namespaces']} namespaces "
                     f"share nothing")
    rows = [
        ("requests inserted", f"{mem['requests_inserted']:,} "
                              f"({mem['distinct_requests']:,} distinct)"),
        (f"{unit} inserted", f"{mem['tokens_inserted']:,}"),
        (f"{unit} stored", f"{mem['tokens_stored']:,}"),
        ("compression ratio", f"{mem['compression_ratio']:.2f}x (inserted / stored)"),
        ("nodes", f"{mem['nodes']:,}"),
        ("used bytes", f"{mem['used_bytes']:,} (allocated {mem['total_bytes']:,})"),
        (f"bytes per stored {unit[:-1]}", f"{mem['bytes_per_stored_token']:.2f}"),
        ("bytes per node", f"{mem['bytes_per_node']:.2f} (beyond the {unit} themselves)"),
    ]
    if block_size > 1 and mem["tokens_stored"]:
        rows.append(("bytes per stored token",
                     f"{mem['used_bytes'] / (mem['tokens_stored'] * block_size):.4f}"))
    width = max(len(k) for k, _ in rows)
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    return lines


def json_summary(result):
    """``result.summary()`` as ``--json`` writes it."""
    return dict(result.summary())


def jsonable(x):
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
