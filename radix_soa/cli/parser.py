"""The ``radix-soa`` parser and entry point: subcommands, the default
command, and exit status 2 with one line on any bad input."""

import argparse
import os
import sys

import numpy as np

from .. import __version__
from .._input.validate import MAX_PAGE
from .._kernels.layout import POLICIES
from ..studies import report, traces, workloads
from ..studies.cluster import ROUTERS
from ..studies.study import DEFAULT_POINTS, DEFAULT_REQUESTS, DEFAULT_WORKLOAD
from .args import (PROG, Parser, UsageError, bounded, capacity_list, host_size, kv_bytes,
                   nonneg_int, pos_int, router_list, warmup_arg, workers_list)
from .args import size
from .build import build
from .router import add_parser as add_router_parser
from .cluster import CLUSTER_POINTS, CLUSTER_ROUTERS
from .study import study
from .traces import traces as traces_command
from .warmup import warmup as warmup_command


def build_parser():
    parser = Parser(
        prog=PROG,
        description="Radix-tree prefix cache over token sequences (NumPy + Numba). "
                    "Without a subcommand, runs 'study' (or 'build', given only build's "
                    "own options).")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", title="subcommands",
                                metavar="{study,build,warmup,traces,router}")

    s = sub.add_parser(
        "study", help="how much prefill a prefix cache of each size saves on a workload or "
                      "trace, and what the index costs",
        description="Replay a built-in seeded workload (default: %s, %d requests) or a real "
                    "trace against LRU prefix caches over a range of capacities; print the "
                    "hit-rate table and the index's memory. Capacities are in the trace's id "
                    "units (tokens for token traces, blocks for block traces) unless "
                    "--capacity-unit says tokens or bytes."
                    % (DEFAULT_WORKLOAD, DEFAULT_REQUESTS))
    src = s.add_argument_group("traffic (a built-in workload, or --trace)")
    src.add_argument("--workload", choices=list(workloads.GENERATORS),
                     help=f"built-in seeded workload (default {DEFAULT_WORKLOAD})")
    src.add_argument("--requests", type=bounded(10_000_000), metavar="N",
                     help=f"requests of the built-in workload (default {DEFAULT_REQUESTS})")
    src.add_argument("--seed", type=nonneg_int, metavar="S",
                     help="seed of the built-in workload (default 0)")
    src.add_argument("--trace", metavar="PATH",
                     help="a trace file, plain, .gz or .zst (zstd needs the zstandard module), "
                          "a directory of kv-cache-tester files, or - for standard input")
    src.add_argument("--format", choices=list(traces.FORMATS),
                     help="the trace's format (default: detected from the content)")
    cap = s.add_argument_group("capacities (default: %d points from 1/32 of the unbounded "
                               "footprint to all of it)" % DEFAULT_POINTS)
    ex = cap.add_mutually_exclusive_group()
    ex.add_argument("--capacities", type=capacity_list, metavar="C1,C2,...",
                    help="explicit capacities in --capacity-unit; suffixes k M G T (1000s) "
                         "and Ki Mi Gi Ti (1024s) are allowed (2M), and a B makes them "
                         "bytes of KV (40GB, 160KiB)")
    ex.add_argument("--points", type=bounded(10_000), default=None, metavar="K",
                    help=f"number of capacities (default {DEFAULT_POINTS}; "
                         f"{CLUSTER_POINTS} with --workers/--router)")
    cap.add_argument("--capacity-unit", choices=list(report.CAPACITY_UNITS), default=None,
                     help="unit of --capacities, --host-capacity and the table: the trace's "
                          "ids (default; blocks on block traces), tokens, or bytes of KV "
                          "(needs --kv-bytes-per-token); a B suffix (10GB) means bytes, and "
                          "contradicting it here is an error")
    cap.add_argument("--kv-bytes-per-token", type=kv_bytes, metavar="B",
                     help="KV cache bytes per token (2 x layers x KV heads x head dim x bytes "
                          "per value, e.g. 160KiB); adds a KV-bytes capacity column")
    rp = s.add_argument_group("replay")
    rp.add_argument("--schedule", choices=["fcfs", "lpm", "dfs"], default="fcfs",
                    help="request order (default fcfs)")
    rp.add_argument("--eviction-policy", choices=list(POLICIES), default="lru",
                    help="what the cache evicts first (default lru)")
    rp.add_argument("--window", type=pos_int, default=64, metavar="W",
                    help="scheduling window for lpm/dfs (default 64)")
    rp.add_argument("--page-size", type=bounded(MAX_PAGE), default=1, metavar="P",
                    help="ids per page; hits count whole pages (default 1)")
    rp.add_argument("--host-capacity", type=host_size, metavar="H",
                    help="add a host tier of H (in --capacity-unit) that catches device "
                         "evictions")
    rp.add_argument("--warmup", type=warmup_arg, default=0.0, metavar="F",
                    help="score only the requests after the first F of arrivals (they warm "
                         "the cache); 0.5 scores like kvcache-simulator (default 0)")
    cl = s.add_argument_group(
        "many workers (a cluster replay: each capacity is per worker; see "
        "radix_soa.replay_cluster)")
    cl.add_argument("--workers", type=workers_list, metavar="N1,N2,...",
                    help="worker counts to replay over (default 8 when --router is given)")
    cl.add_argument("--router", type=router_list, metavar="R1,R2,...",
                    help=f"routers, of {', '.join(ROUTERS)} (default "
                         f"{','.join(CLUSTER_ROUTERS)} when --workers is given)")
    out = s.add_argument_group("output")
    out.add_argument("--plot", metavar="OUT.png",
                     help="save a hit-rate-vs-capacity plot (needs matplotlib)")
    fmt = out.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true",
                     help="print one JSON document and nothing else on stdout"),
    fmt.add_argument("--csv", action="store_true",
                     help="print the sweep as CSV (one row per capacity) and nothing else")
    out.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress on stderr, of loading the trace and of the replays "
                          "(default: only when stderr is a terminal)")
    s.set_defaults(func=study)

    b = sub.add_parser("build", help="build a tree from a built-in workload and report it")
    b.add_argument("--sequences", type=bounded(10_000_000), default=20_000,
                   help="number of sequences (default 20000)")
    b.add_argument("--prompts", type=bounded(1_000_000), default=50,
                   help="distinct system prompts (default 50)")
    b.add_argument("--prompt-len", type=bounded(1_000_000), default=800,
                   help="system prompt tokens (default 800)")
    b.add_argument("--seed", type=nonneg_int, default=0)
    b.add_argument("--dtype", default="int64", choices=["int64", "int32", "uint16"])
    b.add_argument("--json", action="store_true", help="machine-readable output")
    b.set_defaults(func=build)

    w = sub.add_parser("warmup", help="compile every kernel now (once: Numba caches them)",
                       description="Compile (or load from Numba's on-disk cache) every kernel "
                                   "the library and the studies run, so later runs start "
                                   "fast. Prints each kernel group as it is done.")
    w.add_argument("--jobs", type=bounded(256), default=1, metavar="N",
                   help="compile the kernel groups in up to N processes at once (default 1: "
                        "in this one)")
    w.set_defaults(func=warmup_command)

    t = sub.add_parser("traces", help="the public traces the loaders read; download one",
                       description="List the public request traces radix-soa reads (where "
                                   "each comes from, its format and license), or download "
                                   "one: traces get NAME --to DIR puts its files in "
                                   "DIR/NAME/. Every file is checked (SHA-256 or git blob id) "
                                   "before it is kept.")
    t.add_argument("action", nargs="?", choices=["get"], help="get: download a trace")
    t.add_argument("name", nargs="?", help="the trace to get (as listed)")
    t.add_argument("--to", metavar="DIR",
                   help="where to put the files (in DIR/NAME/, a directory per trace)")
    t.add_argument("--from", dest="mirror", metavar="DIR|URL",
                   help="a mirror: a directory or base URL holding the source's paths, the "
                        "shared data's layout (mooncake-fast25/FILE, "
                        "kv-cache-tester-claude-code/FILE) or the files themselves")
    t.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="bytes downloaded on stderr (default: only on a terminal)")
    t.set_defaults(func=traces_command)

    add_router_parser(sub, bounded, pos_int, size)
    return parser


def fail(message):
    message = " ".join(str(message).split())  # one line
    if len(message) > 400:
        message = message[:400] + " ..."
    sys.stderr.write(f"{PROG}: error: {message}\n")
    return 2


# options only 'build' has: given alone, they still mean 'build' (its old default)
BUILD_ONLY = ("--sequences", "--prompts", "--prompt-len", "--dtype")


def default_command(argv):
    """The subcommand run when none is given: 'study', unless the options
    are build's own."""
    if any(a.split("=", 1)[0] in BUILD_ONLY for a in argv):
        return "build"
    return "study"


def main(argv=None):
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = [default_command(argv)] + argv
    args = parser.parse_args(argv)
    for name in ("sequences", "prompts", "prompt_len"):
        if getattr(args, name, 1) < 1:
            parser.exit(2, f"{PROG}: error: --{name.replace('_', '-')} must be >= 1\n")
    np.seterr(all="ignore")
    try:
        return args.func(args)
    except UsageError as e:
        return fail(e)
    except BrokenPipeError:
        # stdout closed early (e.g. piped into head): exit quietly
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(f"\n{PROG}: interrupted\n")
        return 130
    except (ValueError, OSError, OverflowError, RecursionError, MemoryError) as e:
        # bad input: TraceFormatError (a ValueError), missing files, values
        # the library rejects or that overflow, input too large for memory,
        # unwritable plot paths
        if isinstance(e, OSError) and e.filename is not None and e.strerror:
            e = f"{e.strerror}: {e.filename}"
        elif isinstance(e, MemoryError):
            e = "the input is too large for this machine's memory"
        elif isinstance(e, RecursionError):
            e = "the input is nested too deeply"
        return fail(e)


if __name__ == "__main__":
    sys.exit(main())
