"""The ``radix-soa`` command.

``radix-soa study`` answers "how much prefill would a prefix cache of this
size save on this traffic, and what does the index cost?": it replays a
built-in seeded workload or a real trace against LRU prefix caches over a
range of capacities and prints the hit-rate table and the index's memory::

    $ radix-soa study                                   # built-in multi_turn workload
    $ radix-soa study --workload agent --points 6
    $ radix-soa study --trace conversation_trace.jsonl --format mooncake --plot hits.png
    $ radix-soa study --json > study.json

``radix-soa build`` (still the default when no subcommand is given) builds a
tree from a built-in, seeded shared-prefix workload and reports what it
stored::

    $ radix-soa build --sequences 2000

Exit status: 0 on success, 2 for bad usage or bad input (one line on stderr
starting with ``radix-soa: error:``), 1 if ``build`` finds a sequence missing.
"""

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from ._kernels.layout import POLICIES
from ._validate import MAX_COUNT, MAX_PAGE, check_int
from .radix_cache import RadixCache
from .studies import traces, workloads
from .studies.study import (DEFAULT_POINTS, DEFAULT_REQUESTS, DEFAULT_WORKLOAD, capacity_study,
                            default_capacities, generated_trace)

__all__ = ["main", "build_parser", "default_capacities"]

PROG = "radix-soa"


class _UsageError(Exception):
    """A bad combination of options (exit 2, one line)."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``radix-soa: error: ...`` and exit 2."""

    def error(self, message):
        self.exit(2, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


# ----------------------------------------------------------------------------
# build
# ----------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------
# study: inputs
# ----------------------------------------------------------------------------

def _int_arg(text, minimum, maximum=MAX_COUNT):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}") from None
    try:
        return check_int("the value", v, minimum=minimum, maximum=maximum)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {v}") from None
    except OverflowError:
        raise argparse.ArgumentTypeError(f"must be <= {maximum}") from None


def _nonneg_int(text):
    return _int_arg(text, 0)


def _pos_int(text):
    return _int_arg(text, 1)


def _bounded(maximum):
    """A positive-int argument type with an upper limit."""
    def parse(text):
        return _int_arg(text, 1, maximum)
    parse.__name__ = "int"
    return parse


def _capacity_list(text):
    """``"1000,2_000,5000"`` -> sorted distinct non-negative ints."""
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise argparse.ArgumentTypeError("expected a comma-separated list of integers")
    caps = []
    for p in parts:
        try:
            v = int(p)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"capacity {p!r} is not an integer (capacities are whole ids, "
                f"e.g. --capacities 1000,5000,20000)") from None
        try:
            caps.append(check_int("capacity", v, minimum=0))
        except (ValueError, OverflowError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return sorted(set(caps))


def _check_study_args(args):
    if args.trace is not None:
        if args.format is None:
            raise _UsageError(f"--trace needs --format ({', '.join(traces.FORMATS)})")
        if args.workload is not None:
            raise _UsageError("give either --workload or --trace, not both")
        for opt, v in (("--requests", args.requests), ("--seed", args.seed)):
            if v is not None:
                raise _UsageError(f"{opt} applies to built-in workloads, not to --trace")
    elif args.format is not None:
        raise _UsageError("--format needs --trace PATH")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise _UsageError("--plot needs matplotlib: pip install radix-soa[plot]") from None
        from matplotlib.backend_bases import FigureCanvasBase
        supported = FigureCanvasBase.get_supported_filetypes()
        suffix = Path(args.plot).suffix.lower().lstrip(".")
        if suffix not in supported:
            raise _UsageError(f"--plot: file name must end in one of "
                              f"{', '.join('.' + k for k in sorted(supported))}; got {args.plot!r}")
        parent = Path(args.plot).resolve().parent
        if not parent.is_dir():
            raise _UsageError(f"--plot: directory {str(parent)!r} does not exist")


def _load(args):
    if args.trace is not None:
        trace = traces.load_trace(args.trace, args.format)
        return trace, {"source": "trace", "path": str(args.trace), "format": args.format}
    name = args.workload or DEFAULT_WORKLOAD
    requests = DEFAULT_REQUESTS if args.requests is None else args.requests
    seed = 0 if args.seed is None else args.seed
    return generated_trace(name, requests, seed)


# ----------------------------------------------------------------------------
# study: progress
# ----------------------------------------------------------------------------

class _Progress:
    """Replays done, on stderr: a tqdm bar if tqdm is installed, else a
    plain counter. ``set(k)`` is thread-safe (sweep calls it from workers)."""

    def __init__(self, total, enabled):
        self.total, self.enabled, self.done = total, enabled, 0
        self._lock = threading.Lock()
        self._bar = None
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            self._draw()
        else:
            self._bar = tqdm(total=total, desc=f"{PROG}: replays", unit="replay",
                             file=sys.stderr, leave=False, dynamic_ncols=True)

    def _draw(self):
        sys.stderr.write(f"\r{PROG}: replay {self.done}/{self.total}")
        sys.stderr.flush()

    def set_total(self, total):
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def set(self, done):
        if not self.enabled:
            return
        with self._lock:
            if done <= self.done:
                return
            step, self.done = done - self.done, done
            if self._bar is not None:
                self._bar.update(step)
            else:
                self._draw()

    def close(self):
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\r" + " " * (len(PROG) + 32) + "\r")
            sys.stderr.flush()


def _progress_enabled(flag):
    if flag is not None:
        return flag
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


# ----------------------------------------------------------------------------
# study: the index's memory
# ----------------------------------------------------------------------------

# ----------------------------------------------------------------------------
# study: output
# ----------------------------------------------------------------------------

def _units(block_size):
    if block_size == 1:
        return "ids", "ids (= tokens)"
    return "blocks", f"{block_size}-token blocks"


def _describe(desc, trace):
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


def _settings_line(args, unit_long, footprint, unbounded):
    host = ("no host tier" if args.host_capacity is None
            else f"host tier {args.host_capacity:,}")
    window = f", window {args.window}" if args.schedule != "fcfs" else ""
    return (f"capacities in {unit_long}; unbounded footprint {footprint:,}, "
            f"unbounded hit rate {unbounded.hit_rate:.4f}; schedule {args.schedule}{window}, "
            f"eviction {args.eviction_policy}, page size {args.page_size}, {host}")


def _memory_lines(mem, unit, block_size):
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


def _plot(path, sweep_result, unbounded, unit, unit_long, title):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = sweep_result.rows
    caps = np.array([r["capacity"] for r in rows], dtype=float)
    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(caps, [r["hit_rate"] for r in rows], "o-", label=f"hit rate (share of {unit})")
    ax.plot(caps, [r["request_hit_rate"] for r in rows], "s--", alpha=0.7,
            label="request hit rate")
    if any(r["host_hit_rate"] for r in rows):
        ax.plot(caps, [r["hit_rate"] + r["host_hit_rate"] for r in rows], "^-",
                label="device + host hit rate")
    ax.axhline(unbounded.hit_rate, color="grey", linestyle=":",
               label=f"unbounded ({unbounded.hit_rate:.3f})")
    positive = caps[caps > 0]
    if positive.size >= 2 and positive.max() / positive.min() > 10 and positive.size == caps.size:
        ax.set_xscale("log")
    ax.set_xlabel(f"cache capacity ({unit_long})")
    ax.set_ylabel("hit rate")
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _jsonable(x):
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


# ----------------------------------------------------------------------------
# study
# ----------------------------------------------------------------------------

def _study(args):
    _check_study_args(args)
    t_start = time.perf_counter()
    trace, desc = _load(args)
    replay_args = dict(page_size=args.page_size, host_capacity=args.host_capacity,
                       schedule=args.schedule, window=args.window,
                       eviction_policy=args.eviction_policy)
    n_caps = len(args.capacities) if args.capacities else args.points
    progress = _Progress(1 + n_caps, _progress_enabled(args.progress))

    def report(done, total):
        if total != progress.total:  # known once the unbounded replay is done
            progress.set_total(total)
        progress.set(done)

    try:
        st = capacity_study(trace, args.capacities, args.points, progress=report, **replay_args)
    finally:
        progress.close()
    unbounded, footprint, result, mem = st.unbounded, st.footprint, st.sweep, st.memory
    seconds = time.perf_counter() - t_start

    unit, unit_long = _units(trace.block_size)
    header = _describe(desc, trace)
    settings = _settings_line(args, unit_long, footprint, unbounded)
    if args.plot is not None:
        title = (desc["workload"] if desc["source"] == "workload"
                 else f"{trace.name} ({desc['format']})")
        _plot(args.plot, result, unbounded, unit, unit_long, title)

    if args.json:
        doc = {
            "workload": {**desc, **trace.summary()},
            "units": unit_long,
            "settings": {"schedule": args.schedule, "window": args.window,
                         "page_size": args.page_size, "host_capacity": args.host_capacity},
            "footprint": footprint,
            "capacities": [r.capacity for r in result.results],
            "unbounded": unbounded.summary(),
            "sweep": [r.summary() for r in result.results],
            "index_memory": mem,
            "plot": None if args.plot is None else str(args.plot),
            "seconds": seconds,
        }
        print(json.dumps(doc, indent=2, default=_jsonable, allow_nan=False))
        return 0
    print(header)
    print(settings)
    print()
    print(result)
    print()
    print("\n".join(_memory_lines(mem, unit, trace.block_size)))
    if args.plot is not None:
        print(f"\nplot written to {args.plot}")
    return 0


# ----------------------------------------------------------------------------
# parser and entry point
# ----------------------------------------------------------------------------

def build_parser():
    parser = _Parser(
        prog=PROG,
        description="Radix-tree prefix cache over token sequences (NumPy + Numba). "
                    "Without a subcommand, runs 'build'.")
    sub = parser.add_subparsers(dest="command", title="subcommands", metavar="{study,build}")

    s = sub.add_parser(
        "study", help="how much prefill a prefix cache of each size saves on a workload or "
                      "trace, and what the index costs",
        description="Replay a built-in seeded workload (default: %s, %d requests) or a real "
                    "trace against LRU prefix caches over a range of capacities; print the "
                    "hit-rate table and the index's memory. Capacities are in the trace's id "
                    "units (tokens for token traces, blocks for block traces)."
                    % (DEFAULT_WORKLOAD, DEFAULT_REQUESTS))
    src = s.add_argument_group("traffic (a built-in workload, or --trace with --format)")
    src.add_argument("--workload", choices=list(workloads.GENERATORS),
                     help=f"built-in seeded workload (default {DEFAULT_WORKLOAD})")
    src.add_argument("--requests", type=_bounded(10_000_000), metavar="N",
                     help=f"requests of the built-in workload (default {DEFAULT_REQUESTS})")
    src.add_argument("--seed", type=_nonneg_int, metavar="S",
                     help="seed of the built-in workload (default 0)")
    src.add_argument("--trace", type=Path, metavar="PATH",
                     help="a trace file (or a directory of kv-cache-tester files)")
    src.add_argument("--format", choices=list(traces.FORMATS), help="the trace's format")
    cap = s.add_argument_group("capacities (default: %d points from 1/32 of the unbounded "
                               "footprint to all of it)" % DEFAULT_POINTS)
    ex = cap.add_mutually_exclusive_group()
    ex.add_argument("--capacities", type=_capacity_list, metavar="C1,C2,...",
                    help="explicit capacities, in ids (blocks for block traces)")
    ex.add_argument("--points", type=_bounded(10_000), default=DEFAULT_POINTS, metavar="K",
                    help=f"number of capacities (default {DEFAULT_POINTS})")
    rp = s.add_argument_group("replay")
    rp.add_argument("--schedule", choices=["fcfs", "lpm", "dfs"], default="fcfs",
                    help="request order (default fcfs)")
    rp.add_argument("--eviction-policy", choices=list(POLICIES), default="lru",
                    help="what the cache evicts first (default lru)")
    rp.add_argument("--window", type=_pos_int, default=64, metavar="W",
                    help="scheduling window for lpm/dfs (default 64)")
    rp.add_argument("--page-size", type=_bounded(MAX_PAGE), default=1, metavar="P",
                    help="ids per page; hits count whole pages (default 1)")
    rp.add_argument("--host-capacity", type=_nonneg_int, metavar="H",
                    help="add a host tier of H ids that catches device evictions")
    out = s.add_argument_group("output")
    out.add_argument("--plot", metavar="OUT.png",
                     help="save a hit-rate-vs-capacity plot (needs matplotlib)")
    out.add_argument("--json", action="store_true",
                     help="print one JSON document and nothing else on stdout")
    out.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress bar on stderr (default: only when stderr is a terminal)")
    s.set_defaults(func=_study)

    b = sub.add_parser("build", help="build a tree from a built-in workload and report it "
                                     "(the default)")
    b.add_argument("--sequences", type=_bounded(10_000_000), default=20_000,
                   help="number of sequences (default 20000)")
    b.add_argument("--prompts", type=_bounded(1_000_000), default=50,
                   help="distinct system prompts (default 50)")
    b.add_argument("--prompt-len", type=_bounded(1_000_000), default=800,
                   help="system prompt tokens (default 800)")
    b.add_argument("--seed", type=_nonneg_int, default=0)
    b.add_argument("--dtype", default="int64", choices=["int64", "int32", "uint16"])
    b.add_argument("--json", action="store_true", help="machine-readable output")
    b.set_defaults(func=_build)
    return parser


def _fail(message):
    message = " ".join(str(message).split())  # one line
    if len(message) > 400:
        message = message[:400] + " ..."
    sys.stderr.write(f"{PROG}: error: {message}\n")
    return 2


def main(argv=None):
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["build"] + argv
    args = parser.parse_args(argv)
    for name in ("sequences", "prompts", "prompt_len"):
        if getattr(args, name, 1) < 1:
            parser.exit(2, f"{PROG}: error: --{name.replace('_', '-')} must be >= 1\n")
    np.seterr(all="ignore")
    try:
        return args.func(args)
    except _UsageError as e:
        return _fail(e)
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
        return _fail(e)


if __name__ == "__main__":
    sys.exit(main())
