"""The ``radix-soa`` command.

``radix-soa study`` answers "how much prefill would a prefix cache of this
size save on this traffic, and what does the index cost?": it replays a
built-in seeded workload or a real trace against LRU prefix caches over a
range of capacities and prints the hit-rate table and the index's memory::

    $ radix-soa                                         # = radix-soa study: multi_turn workload
    $ radix-soa study --workload agent --points 6
    $ radix-soa study --trace conversation_trace.jsonl.gz --plot hits.png   # format detected
    $ radix-soa study --trace conv.jsonl --capacity-unit bytes --kv-bytes-per-token 160KiB \
          --capacities 10GB,40GB,80GB                   # what does 40 GB of KV buy me?
    $ radix-soa study --trace conv.jsonl --warmup 0.5   # score like kvcache-simulator
    $ zcat conv.jsonl.gz | radix-soa study --trace - --csv > sweep.csv
    $ radix-soa study --json > study.json
    $ radix-soa study --trace conv.jsonl --workers 4,8 \
          --router round_robin,cache_aware,kv_overlap    # N workers behind a router

``radix-soa build`` builds a tree from a built-in, seeded shared-prefix
workload and reports what it stored (given only build's own options, such as
``--sequences``, the subcommand may still be left out)::

    $ radix-soa build --sequences 2000

Exit status: 0 on success, 2 for bad usage or bad input (one line on stderr
starting with ``radix-soa: error:``), 1 if ``build`` finds a sequence missing.
"""

import argparse
import importlib
import json
import os
import re
import sys
import threading
import time
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np

from . import __version__
from ._kernels.layout import POLICIES
from ._validate import MAX_COUNT, MAX_PAGE, check_int
from ._warmup import warmup_cluster, warmup_replay
from .radix_cache import RadixCache
from .studies import report, traces, workloads
from .studies.cluster import MAX_WORKERS, ROUTERS, sweep_cluster
from .studies.replay import RENAMED, check_warmup
from .studies.sources import Source
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


_PREFIXES = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
             "ki": 2**10, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
_SIZE = re.compile(r"([0-9][0-9_]*(?:\.[0-9]+)?)\s*([kKMGTP]i?)?[bB]?")


def _size(text, what="capacity"):
    """``"40GB"``, ``"160KiB"``, ``"1.5M"``, ``"2_000"`` -> a non-negative int
    (decimal prefixes k M G T P, binary Ki Mi Gi Ti Pi, an optional B)."""
    t = text.strip()
    m = _SIZE.fullmatch(t.lstrip("-"))
    if m is None:
        raise argparse.ArgumentTypeError(
            f"{what} {text[:40]!r} is not an integer (whole ids, tokens or bytes, optionally "
            f"with a suffix: 5000, 2M, 40GB, 160KiB)")
    digits, prefix = m.group(1), m.group(2) or ""
    if "." in digits and not prefix:
        raise argparse.ArgumentTypeError(
            f"{what} {text[:40]!r} is not an integer (a fraction needs a suffix, e.g. 1.5GB)")
    try:
        value = Decimal(digits.replace("_", "")) * _PREFIXES[prefix]
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"{what} {text[:40]!r} is not a number") from None
    if value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"{what} {text[:40]!r} is not a whole number")
    value = int(value)
    if t.startswith("-") and value:
        raise argparse.ArgumentTypeError(f"{what} must be >= 0, got {text[:40]}")
    try:
        return check_int(what, value, minimum=0)
    except (ValueError, OverflowError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _capacity_list(text):
    """``"1000,2_000,40GB"`` -> distinct non-negative ints, in the order given."""
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise argparse.ArgumentTypeError("expected a comma-separated list of integers")
    return sorted({_size(p) for p in parts})


def _host_size(text):
    return _size(text, "host capacity")


def _kv_bytes(text):
    v = _size(text, "--kv-bytes-per-token")
    if v < 1:
        raise argparse.ArgumentTypeError("--kv-bytes-per-token must be >= 1")
    return v


def _warmup_arg(text):
    try:
        return check_warmup(float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            str(exc) if "warmup" in str(exc) else f"expected a number in [0, 1), got "
                                                  f"{text[:40]!r}") from None


def _workers_list(text):
    """``"1,2,8"`` -> distinct worker counts in [1, MAX_WORKERS], ascending."""
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError("expected a comma-separated list of worker counts")
    return sorted({_int_arg(p, 1, MAX_WORKERS) for p in parts})


def _router_list(text):
    """``"round_robin,cache_aware"`` -> router names, in the order given."""
    parts = [p.strip() for p in text.split(",")]
    bad = [p for p in parts if p not in ROUTERS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown router {bad[0][:40]!r}; choose from "
                                         f"{', '.join(ROUTERS)}")
    return list(dict.fromkeys(parts))


def _check_study_args(args):
    if args.capacity_unit == "bytes" and args.kv_bytes_per_token is None:
        raise _UsageError("--capacity-unit bytes needs --kv-bytes-per-token (2 x layers x KV "
                          "heads x head dim x bytes per value, e.g. 160KiB)")
    if args.trace is not None:
        if args.workload is not None:
            raise _UsageError("give either --workload or --trace, not both")
        for opt, v in (("--requests", args.requests), ("--seed", args.seed)):
            if v is not None:
                raise _UsageError(f"{opt} applies to built-in workloads, not to --trace")
    elif args.format is not None:
        raise _UsageError("--format needs --trace PATH")
    if args.workers is not None or args.router is not None:
        if args.host_capacity is not None:
            raise _UsageError("--host-capacity is not available with --workers/--router (the "
                              "cluster replay has no host tier)")
        if args.schedule != "fcfs":
            raise _UsageError("--workers/--router replay each worker in arrival order: "
                              "--schedule must be fcfs")
    if args.plot is not None:
        try:
            importlib.import_module("matplotlib")  # the package itself, not a cached submodule
            from matplotlib.backend_bases import FigureCanvasBase
        except ImportError:
            raise _UsageError("--plot needs matplotlib: pip install radix-soa[plot]") from None
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
        src = Source(args.trace)
        fmt = args.format or traces.detect_format(src)
        bar = _LoadProgress(_progress_enabled(args.progress))
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


class _LoadProgress:
    """Bytes of a trace file read, on stderr (tqdm, else a percentage)."""

    def __init__(self, enabled):
        self.enabled, self._bar, self._shown = enabled, None, -1

    def update(self, done, total):
        if not self.enabled or not total:
            return
        if self._bar is None and self._shown < 0:
            try:
                from tqdm import tqdm
            except ImportError:
                self._bar = False
            else:
                self._bar = tqdm(total=total, desc=f"{PROG}: loading", unit="B",
                                 unit_scale=True, file=sys.stderr, leave=False,
                                 dynamic_ncols=True)
            self._shown = 0
        if self._bar:
            self._bar.update(max(0, done - self._bar.n))
            return
        pct = min(100, done * 100 // total)
        if pct != self._shown:
            self._shown = pct
            sys.stderr.write(f"\r{PROG}: loading {pct}%")
            sys.stderr.flush()

    def close(self):
        if self._bar:
            self._bar.close()
        elif self._shown >= 0:
            sys.stderr.write("\r" + " " * (len(PROG) + 16) + "\r")
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


def _settings_line(args, trace, footprint, unbounded):
    bs = trace.block_size
    ids = report.id_unit(bs)
    host = ("no host tier" if args.host_capacity is None
            else f"host tier {_in_units(args.host_ids, args, bs)}")
    window = f", window {args.window}" if args.schedule != "fcfs" else ""
    rates = f"{unbounded.hit_rate:.4f} ({ids})"
    if bs > 1:
        rates += f", {unbounded.token_hit_rate:.4f} (tokens)"
    scored = (f"; rates score the last {unbounded.scored_requests:,} requests "
              f"(warmup {args.warmup:g})" if args.warmup else "")
    unit = {"ids": _units(bs)[1], "tokens": "tokens",
            "bytes": "bytes of KV"}[args.capacity_unit]
    return (f"capacities in {unit}; unbounded footprint {_in_units(footprint, args, bs)}, "
            f"unbounded hit rate {rates}; schedule {args.schedule}{window}, "
            f"eviction {args.eviction_policy}, page size {args.page_size} "
            f"{'id' if args.page_size == 1 else 'ids'}, {host}{scored}")


def _in_units(ids, args, block_size):
    """``ids`` said in the chosen unit, with ids beside when they differ."""
    name = report.id_unit(block_size)
    unit, kvb = args.capacity_unit, args.kv_bytes_per_token
    if unit == "bytes":
        return (f"{report.human_bytes(report.ids_to_capacity(ids, 'bytes', block_size, kvb))} "
                f"of KV ({ids:,} {name})")
    if unit == "tokens" and block_size > 1:
        return f"{report.ids_to_capacity(ids, 'tokens', block_size):,} tokens ({ids:,} {name})"
    return f"{ids:,} {name}"


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


def _compact_number(x, _pos=None):
    """Tick labels, 3 significant digits: 1500 -> '1.5k', 999.9e9 -> '1T'.

    >>> [_compact_number(x) for x in (12, 1500, 57_575, 999.9e9, 2e6)]
    ['12', '1.5k', '57.6k', '1T', '2M']
    """
    for suffix in ("", "k", "M", "G", "T", "P"):
        if abs(x) < 999.5 or suffix == "P":
            return f"{x:.3g}{suffix}"
        x /= 1000


def plot_figure(sweep_result, unbounded, memory, x_label, title, x_scale=1.0):
    """The study as a matplotlib ``Figure``: hit rates (top), the share of
    requests with any hit (middle, its own axis: it sits near 1 on traces
    with a shared system prompt) and the replay's peak index memory
    (bottom), against capacity (``x_scale`` converts ids to the x unit)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    results = [r for r in sweep_result.results if r.capacity is not None]
    caps = np.array([r.capacity for r in results], dtype=float) * x_scale
    bs = unbounded.block_size
    ids = "blocks" if bs > 1 else "tokens"
    fig = Figure(figsize=(7.5, 8.5))
    FigureCanvasAgg(fig)
    ax_hit, ax_req, ax_mem = fig.subplots(3, 1, sharex=True,
                                          gridspec_kw={"height_ratios": [3, 1.2, 1.5]})
    rates = [r.hit_rate for r in results]
    ax_hit.plot(caps, rates, "o-", label=f"hit rate ({ids})")
    top = max(rates + [unbounded.hit_rate])
    if bs > 1:
        tok = [r.token_hit_rate for r in results]
        ax_hit.plot(caps, tok, "d-", alpha=0.8, label="token hit rate (kvcache-simulator)")
        top = max(top, *tok)
    if any(r.host_hit_rate for r in results):
        both = [r.prefill_saved_fraction for r in results]
        ax_hit.plot(caps, both, "^-", label="prefill saved (device + host, tokens)")
        top = max(top, *both)
    ax_hit.axhline(unbounded.hit_rate, color="grey", linestyle=":",
                   label=f"unbounded hit rate ({unbounded.hit_rate:.3f})")
    ax_hit.set_ylim(0, min(1.0, top * 1.1) or 1.0)
    ax_hit.set_ylabel("hit rate")
    ax_hit.legend(loc="lower right", fontsize=8)
    ax_req.plot(caps, [r.request_hit_rate for r in results], "s--", color="tab:purple")
    ax_req.set_ylabel("requests\nwith a hit")
    ax_req.set_ylim(0, 1.05)
    ax_mem.plot(caps, [r.peak_index_bytes / 1e6 for r in results], "o-", color="tab:green",
                label="replay index, peak")
    ax_mem.axhline(memory["used_bytes"] / 1e6, color="tab:green", linestyle=":",
                   label=f"tree of every request ({memory['used_bytes'] / 1e6:.3g} MB)")
    ax_mem.set_ylabel("index memory (MB)")
    ax_mem.set_ylim(bottom=0)
    ax_mem.legend(loc="lower right", fontsize=8)
    positive = caps[caps > 0]
    log = positive.size == caps.size >= 2 and positive.max() / positive.min() > 10
    if log:
        ax_mem.set_xscale("log")
    # ticks at the capacities swept (thinned to fit), no minor labels
    ticks = list(caps)
    step = max(1, -(-len(ticks) // 8))
    ax_mem.xaxis.set_major_locator(FixedLocator(ticks[::step]))
    ax_mem.xaxis.set_major_formatter(FuncFormatter(_compact_number))
    ax_mem.xaxis.set_minor_locator(NullLocator())
    ax_mem.xaxis.set_minor_formatter(NullFormatter())
    ax_mem.set_xlabel(x_label)
    for ax in (ax_hit, ax_req, ax_mem):
        ax.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _plot(path, args, st, trace, desc):
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
            else f"host tier {_in_units(args.host_ids, args, bs)}")
    window = f" (window {args.window})" if args.schedule != "fcfs" else ""
    scored = f", last {1 - args.warmup:.0%} scored" if args.warmup else ""
    title = (f"{what}: {len(trace):,} requests\nschedule {args.schedule}{window}, "
             f"eviction {args.eviction_policy}, page size {args.page_size}, {host}{scored}")
    fig = plot_figure(st.sweep, st.unbounded, st.memory, x_label, title, x_scale=scale)
    fig.savefig(path, dpi=120)
    return fig


def _json_summary(result):
    """``result.summary()`` as ``--json`` writes it: the current keys, then
    each old name of ``RENAMED`` (``total_tokens``, ...: they counted ids)
    with its new key's value, so scripts reading 0.1's output keep working
    until 0.3 (the Python API keeps the same names as deprecated aliases)."""
    out = dict(result.summary())
    out.update((old, out[new]) for old, new in RENAMED.items())
    return out


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
    if args.workers is not None or args.router is not None:
        return _cluster_study(args, trace, desc, t_start)
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
    progress = _Progress(1 + n_caps, _progress_enabled(args.progress))

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
        _plot(args.plot, args, st, trace, desc)

    if args.csv:
        sys.stdout.write(report.to_csv(result.results, unit, kvb))
        return 0
    if args.json:
        best = report.smallest_reaching(result.results, 0.9 * unbounded.hit_rate)
        doc = {
            "version": __version__,
            "workload": {**desc, **trace.summary()},
            "units": _units(bs)[1],
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
            "unbounded": _json_summary(unbounded),
            "sweep": [_json_summary(r) for r in result.results],
            # old keys (counts of ids named *_tokens) still written beside
            # their new names in "unbounded" and "sweep", until 0.3
            "deprecated_keys": dict(RENAMED),
            "summary": {"line": summary, "share_of_unbounded": 0.9,
                        "smallest_capacity": None if best is None else best.capacity},
            "index_memory": mem,
            "plot": None if args.plot is None else str(args.plot),
            "seconds": seconds,
        }
        print(json.dumps(doc, indent=2, default=_jsonable, allow_nan=False))
        return 0
    print(_describe(desc, trace))
    print(_settings_line(args, trace, footprint, unbounded))
    print()
    print(report.table(result.results, unit, kvb))
    print()
    print(summary)
    print()
    print("\n".join(_memory_lines(mem, _units(bs)[0], bs)))
    if args.plot is not None:
        print(f"\nplot written to {args.plot}")
    return 0


# ----------------------------------------------------------------------------
# study over N workers (--workers / --router)
# ----------------------------------------------------------------------------

CLUSTER_POINTS = 4
CLUSTER_ROUTERS = ["round_robin", "cache_aware", "kv_overlap"]


def _cluster_summary(rows):
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


def plot_cluster_figure(sweep_result, x_label, title):
    """The cluster study as a matplotlib ``Figure``: share of prefill saved
    (top) and load imbalance (bottom) against capacity, one line per
    (workers, router)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 6.5))
    ax_hit, ax_imb = fig.subplots(2, 1, sharex=True)
    groups = {}
    for r in sweep_result.results:
        groups.setdefault((r.workers, r.router), []).append(r)
    for (w, name), rs_ in groups.items():
        pts = sorted((r.capacity, r) for r in rs_ if r.capacity is not None)
        if not pts:
            continue
        x = [c for c, _ in pts]
        ax_hit.plot(x, [r.prefill_saved_fraction for _, r in pts], marker="o", ms=3,
                    label=f"{w} x {name}")
        ax_imb.plot(x, [r.load_imbalance for _, r in pts], marker="o", ms=3)
    ax_hit.set_ylabel("prefill saved")
    ax_imb.set_ylabel("load imbalance (max / mean busy time)")
    ax_imb.set_xlabel(x_label)
    ax_hit.legend(fontsize=7, ncol=2)
    for ax in (ax_hit, ax_imb):
        ax.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _cluster_study(args, trace, desc, t_start):
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
        from .studies.replay import replay
        footprint = replay(trace, page_size=args.page_size,
                           eviction_policy=args.eviction_policy).peak_ids
        caps = default_capacities(footprint, args.points or CLUSTER_POINTS)
    total = len(workers) * len(routers) * len(caps)
    progress = _Progress(total, _progress_enabled(args.progress))
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
        print(json.dumps(doc, indent=2, default=_jsonable, allow_nan=False))
        return 0
    print(_describe(desc, trace))
    print(f"{len(workers) * len(routers)} clusters ({', '.join(map(str, workers))} workers x "
          f"{', '.join(routers)}); capacity per worker in {report.id_unit(bs)}; page size "
          f"{args.page_size}, eviction {args.eviction_policy}; load from the trace's "
          f"timestamps and output lengths (see radix_soa.studies.cluster)")
    print()
    print(result.table())
    summary = _cluster_summary(rows)
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


# ----------------------------------------------------------------------------
# parser and entry point
# ----------------------------------------------------------------------------

def build_parser():
    parser = _Parser(
        prog=PROG,
        description="Radix-tree prefix cache over token sequences (NumPy + Numba). "
                    "Without a subcommand, runs 'study' (or 'build', given only build's "
                    "own options).")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", title="subcommands", metavar="{study,build}")

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
    src.add_argument("--requests", type=_bounded(10_000_000), metavar="N",
                     help=f"requests of the built-in workload (default {DEFAULT_REQUESTS})")
    src.add_argument("--seed", type=_nonneg_int, metavar="S",
                     help="seed of the built-in workload (default 0)")
    src.add_argument("--trace", metavar="PATH",
                     help="a trace file, plain, .gz or .zst (zstd needs the zstandard module), "
                          "a directory of kv-cache-tester files, or - for standard input")
    src.add_argument("--format", choices=list(traces.FORMATS),
                     help="the trace's format (default: detected from the content)")
    cap = s.add_argument_group("capacities (default: %d points from 1/32 of the unbounded "
                               "footprint to all of it)" % DEFAULT_POINTS)
    ex = cap.add_mutually_exclusive_group()
    ex.add_argument("--capacities", type=_capacity_list, metavar="C1,C2,...",
                    help="explicit capacities in --capacity-unit; suffixes k M G T (1000s), "
                         "Ki Mi Gi Ti (1024s) and B are allowed: 40GB, 2M, 160KiB")
    ex.add_argument("--points", type=_bounded(10_000), default=None, metavar="K",
                    help=f"number of capacities (default {DEFAULT_POINTS}; "
                         f"{CLUSTER_POINTS} with --workers/--router)")
    cap.add_argument("--capacity-unit", choices=list(report.CAPACITY_UNITS), default="ids",
                     help="unit of --capacities, --host-capacity and the table: the trace's "
                          "ids (default; blocks on block traces), tokens, or bytes of KV "
                          "(needs --kv-bytes-per-token)")
    cap.add_argument("--kv-bytes-per-token", type=_kv_bytes, metavar="B",
                     help="KV cache bytes per token (2 x layers x KV heads x head dim x bytes "
                          "per value, e.g. 160KiB); adds a KV-bytes capacity column")
    rp = s.add_argument_group("replay")
    rp.add_argument("--schedule", choices=["fcfs", "lpm", "dfs"], default="fcfs",
                    help="request order (default fcfs)")
    rp.add_argument("--eviction-policy", choices=list(POLICIES), default="lru",
                    help="what the cache evicts first (default lru)")
    rp.add_argument("--window", type=_pos_int, default=64, metavar="W",
                    help="scheduling window for lpm/dfs (default 64)")
    rp.add_argument("--page-size", type=_bounded(MAX_PAGE), default=1, metavar="P",
                    help="ids per page; hits count whole pages (default 1)")
    rp.add_argument("--host-capacity", type=_host_size, metavar="H",
                    help="add a host tier of H (in --capacity-unit) that catches device "
                         "evictions")
    rp.add_argument("--warmup", type=_warmup_arg, default=0.0, metavar="F",
                    help="score only the requests after the first F of arrivals (they warm "
                         "the cache); 0.5 scores like kvcache-simulator (default 0)")
    cl = s.add_argument_group(
        "many workers (a cluster replay: each capacity is per worker; see "
        "radix_soa.replay_cluster)")
    cl.add_argument("--workers", type=_workers_list, metavar="N1,N2,...",
                    help="worker counts to replay over (default 8 when --router is given)")
    cl.add_argument("--router", type=_router_list, metavar="R1,R2,...",
                    help=f"routers, of {', '.join(ROUTERS)} (default "
                         f"{','.join(CLUSTER_ROUTERS)} when --workers is given)")
    out = s.add_argument_group("output")
    out.add_argument("--plot", metavar="OUT.png",
                     help="save a hit-rate-vs-capacity plot (needs matplotlib)")
    fmt = out.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true",
                     help="print one JSON document and nothing else on stdout; until 0.3 "
                          "its replay results also carry the deprecated old names of the id "
                          "counts (total_tokens, hit_tokens, ... beside total_ids, hit_ids, "
                          "...; \"deprecated_keys\" maps old to new)"),
    fmt.add_argument("--csv", action="store_true",
                     help="print the sweep as CSV (one row per capacity) and nothing else")
    out.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress on stderr, of loading the trace and of the replays "
                          "(default: only when stderr is a terminal)")
    s.set_defaults(func=_study)

    b = sub.add_parser("build", help="build a tree from a built-in workload and report it")
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


# options only 'build' has: given alone, they still mean 'build' (its old default)
_BUILD_ONLY = ("--sequences", "--prompts", "--prompt-len", "--dtype")


def _default_command(argv):
    """The subcommand run when none is given: 'study', unless the options
    are build's own."""
    if any(a.split("=", 1)[0] in _BUILD_ONLY for a in argv):
        return "build"
    return "study"


def main(argv=None):
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = [_default_command(argv)] + argv
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
