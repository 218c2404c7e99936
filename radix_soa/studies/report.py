"""The capacity sweep as people read it: a table whose columns name their
units, with a legend under it, a CSV of every number, capacities in ids,
tokens or bytes of KV, and the one-line answer (the smallest capacity that
reaches 90% of the unbounded hit rate).

>>> from radix_soa.studies.replay import replay, sweep
>>> seqs = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6], [1, 2, 3, 4, 7]]
>>> res = sweep(seqs, [3, 7]).results
>>> print(table(res, legend=False))  # doctest: +ELLIPSIS
capacity  hit rate  req. w/ hit    rejected  index peak  replay
(tokens)  (tokens)      (share)  (requests)     (bytes)    (ms)
       3    0.1250       0.2500           3 ...
       7    0.5625       0.7500           0 ...
>>> capacity_to_ids(40 * 10**9, "bytes", block_size=512, kv_bytes_per_token=163840)
476
>>> ids_to_capacity(476, "tokens", block_size=512)
243712
"""

import csv
import io
from dataclasses import dataclass

__all__ = ["CAPACITY_UNITS", "capacity_to_ids", "ids_to_capacity", "id_unit", "table", "to_csv",
           "smallest_reaching", "summary_line", "human_bytes", "CSV_FIELDS"]

#: Units a capacity can be given in: the trace's ids, prompt tokens, bytes of KV.
CAPACITY_UNITS = ("ids", "tokens", "bytes")


def _check_unit(unit, kv_bytes_per_token):
    if unit not in CAPACITY_UNITS:
        raise ValueError(f"capacity unit must be one of {', '.join(CAPACITY_UNITS)}; got {unit!r}")
    if unit == "bytes" and not kv_bytes_per_token:
        raise ValueError("capacities in bytes need kv_bytes_per_token (the KV cache's bytes "
                         "per token: 2 x layers x KV heads x head dim x bytes per value)")


def capacity_to_ids(value, unit, block_size, kv_bytes_per_token=None):
    """A capacity in ``unit`` as whole ids (rounded down: a cache of 1,000
    tokens holds one 512-token block). ``None`` (unbounded) stays ``None``."""
    _check_unit(unit, kv_bytes_per_token)
    if value is None:
        return None
    per_id = {"ids": 1, "tokens": block_size,
              "bytes": block_size * (kv_bytes_per_token or 0)}[unit]
    return int(value) // per_id


def ids_to_capacity(ids, unit, block_size, kv_bytes_per_token=None):
    """``ids`` expressed in ``unit`` (the inverse of ``capacity_to_ids`` on
    whole ids)."""
    _check_unit(unit, kv_bytes_per_token)
    if ids is None:
        return None
    return int(ids) * {"ids": 1, "tokens": block_size,
                       "bytes": block_size * (kv_bytes_per_token or 0)}[unit]


def id_unit(block_size):
    """What one id is called: ``"tokens"`` on token traces, else ``"blocks"``."""
    return "tokens" if block_size == 1 else "blocks"


def human_bytes(n):
    """``n`` bytes with a decimal prefix, 3 significant digits.

    >>> human_bytes(40_000_000_000), human_bytes(512), human_bytes(1_234_567)
    ('40.0 GB', '512 B', '1.23 MB')
    """
    x = float(n)
    if x < 1000:
        return f"{int(n)} B"
    for prefix in ("k", "M", "G", "T", "P", "E"):
        x /= 1000
        if x < 999.5 or prefix == "E":
            digits = f"{x:.0f}" if x >= 99.95 else f"{x:.1f}" if x >= 9.995 else f"{x:.2f}"
            return f"{digits} {prefix}B"


@dataclass
class _Column:
    key: str
    name: str
    unit: str
    legend: str
    cells: list
    values: list  # numbers, to find all-zero and duplicate columns
    keep: bool = False  # never left out (the capacities)


def _rate(x):
    return f"{x:.4f}"


def _columns(results, unit, kv_bytes_per_token):
    r0 = results[0]
    bs = r0.block_size
    ids = id_unit(bs)
    caps = [r.capacity for r in results]

    def cap_cells(u):
        out = []
        for c in caps:
            if c is None:
                out.append("unbounded")
            elif u == "bytes":
                out.append(human_bytes(ids_to_capacity(c, "bytes", bs, kv_bytes_per_token)))
            else:
                out.append(f"{ids_to_capacity(c, u, bs, kv_bytes_per_token):,}")
        return out

    cols = []
    shown_units = [unit]
    if kv_bytes_per_token and "bytes" not in shown_units:
        shown_units.append("bytes")
    if unit != "ids" and not (unit == "tokens" and bs == 1):
        shown_units.append("ids")
    for u in shown_units:
        label = {"ids": ids, "tokens": "tokens", "bytes": "KV bytes"}[u]
        what = {"ids": f"the cache's capacity in {ids} (the trace's ids"
                       + (f", {bs} tokens each)" if bs > 1 else ")"),
                "tokens": "the capacity in tokens" + (f" ({bs} per id)" if bs > 1 else ""),
                "bytes": f"the capacity as KV memory, at {kv_bytes_per_token:,} bytes per token"
                if kv_bytes_per_token else ""}[u]
        cols.append(_Column("capacity", "capacity", f"({label})", what, cap_cells(u),
                            [0] * len(caps), keep=True))

    def add(key, name, unit_, legend, fmt, attr=None):
        vals = [getattr(r, attr or key) for r in results]
        cols.append(_Column(key, name, unit_, legend, [fmt(v) for v in vals], vals))

    add("hit_rate", "hit rate", f"({ids})",
        f"device hits / all {ids} of the requests; a request's hit is the longest cached "
        f"whole-page prefix when it is scheduled", _rate)
    if bs > 1:
        add("token_hit_rate", "token hit", "(tokens)",
            f"prompt tokens served by the device / all prompt tokens, a hit weighing "
            f"min(hit blocks x {bs}, input length) (kvcache-simulator's hit rate)", _rate)
    add("host_hit_rate", "host hit", f"({ids})",
        f"{ids} loaded back from the host tier (beyond the device hit) / all {ids}: a rate, "
        f"like hit rate", _rate)
    add("prefill_saved_fraction", "prefill saved", "(tokens)",
        "prompt tokens not recomputed: device + host hits, in tokens, / all prompt tokens",
        _rate)
    add("request_hit_rate", "req. w/ hit", "(share)",
        "share of requests whose device hit is at least one page (near 1 when every "
        "request shares a system prompt)", _rate)
    add("evicted_ids", "evicted", f"({ids})",
        f"{ids} evicted from the device over the whole replay (a count)", lambda v: f"{v:,}")
    add("rejected", "rejected", "(requests)",
        "requests not cached at all: their new ids did not fit even after evicting",
        lambda v: f"{v:,}")
    add("peak_index_bytes", "index peak", "(bytes)",
        "peak memory of the replay's index arrays (device + host tier, eviction bookkeeping "
        "included; the KV itself is not counted). It counts the token runs evictions left "
        "dead until a compaction reclaims them (when the buffer fills and the dead outweigh "
        "the live), so a small capacity that evicts much can peak above a larger one and "
        "the column need not grow with capacity", lambda v: f"{v:,}")
    add("seconds", "replay", "(ms)",
        "wall time of the compiled replay, kernels compiled beforehand (a sweep runs its "
        "replays on parallel threads)", lambda v: f"{v * 1e3:.1f}")
    return cols


def _kept(cols):
    """Columns worth printing, and a note for each left out."""
    kept, notes = [], []
    for c in cols:
        if c.keep:
            kept.append(c)
            continue
        if c.key != "seconds" and all(v == 0 for v in c.values):
            notes.append(f"{c.name} (all zero)")
            continue
        twin = next((k for k in kept if not k.keep and k.values == c.values), None)
        if twin is not None and c.key.endswith(("rate", "fraction")):
            notes.append(f"{c.name} (equal to {twin.name})")
            continue
        kept.append(c)
    return kept, notes


def table(results, capacity_unit="ids", kv_bytes_per_token=None, legend=True):
    """The sweep ``results`` (a list of ``ReplayResult``, one per capacity)
    as a text table: a name and a unit row over each column, a row per
    capacity, and with ``legend`` what each column measures. Columns that
    are all zero, and rates equal to an earlier column, are left out (the
    legend says so)."""
    if not results:
        raise ValueError("no results to tabulate")
    _check_unit(capacity_unit, kv_bytes_per_token)
    cols, notes = _kept(_columns(results, capacity_unit, kv_bytes_per_token))
    widths = [max(len(c.name), len(c.unit), *(len(x) for x in c.cells)) for c in cols]
    lines = ["  ".join(f"{c.name:>{w}}" for c, w in zip(cols, widths)).rstrip(),
             "  ".join(f"{c.unit:>{w}}" for c, w in zip(cols, widths)).rstrip()]
    for i in range(len(results)):
        lines.append("  ".join(f"{c.cells[i]:>{w}}" for c, w in zip(cols, widths)).rstrip())
    if not legend:
        return "\n".join(lines)
    lines.append("")
    r0 = results[0]
    if r0.warmup:
        lines.append(f"scored: the last {r0.scored_requests:,} of {r0.requests:,} requests (the "
                     f"first {r0.warmup:.0%} of arrivals only warm the cache) for every rate; "
                     f"evicted, rejected, index peak and replay cover the whole replay")
    seen = set()
    for c in cols:
        if (c.name, c.unit) in seen:
            continue
        seen.add((c.name, c.unit))
        lines.append(f"  {c.name} {c.unit}: {c.legend}")
    if notes:
        lines.append("  left out: " + ", ".join(notes))
    return "\n".join(lines)


#: The CSV's columns after the capacities (``ReplayResult`` names).
CSV_FIELDS = ("hit_rate", "token_hit_rate", "host_hit_rate", "combined_hit_rate",
              "prefill_saved_fraction", "request_hit_rate", "hit_ids", "host_hit_ids",
              "total_ids", "prefill_tokens_hit", "prefill_tokens_saved", "prefill_tokens",
              "evicted_ids", "host_evicted_ids", "rejected", "peak_ids", "final_ids",
              "peak_index_bytes", "final_index_bytes", "seconds", "requests", "scored_requests",
              "warmup", "block_size", "page_size", "schedule", "window", "host_capacity")


def to_csv(results, capacity_unit="ids", kv_bytes_per_token=None):
    """Every number of the sweep ``results``, one row per capacity
    (``capacity_ids`` first, then the capacity in ``capacity_unit`` if that
    is not ids, then ``CSV_FIELDS``); unbounded is an empty cell.

    >>> from radix_soa.studies.replay import sweep
    >>> print(to_csv(sweep([[1, 2], [1, 2]], [2]).results).splitlines()[1][:20])
    2,0.5,0.5,0.0,0.5,0.
    """
    _check_unit(capacity_unit, kv_bytes_per_token)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    extra = [] if capacity_unit == "ids" else [f"capacity_{capacity_unit}"]
    w.writerow(["capacity_ids", *extra, *CSV_FIELDS])
    for r in results:
        s = r.summary()
        caps = [r.capacity] + [ids_to_capacity(r.capacity, capacity_unit, r.block_size,
                                               kv_bytes_per_token) for _ in extra]
        w.writerow(["" if v is None else v for v in (*caps, *(s[f] for f in CSV_FIELDS))])
    return out.getvalue()


def smallest_reaching(results, target):
    """The first result (capacities ascending) whose ``hit_rate`` reaches
    ``target``, or ``None``."""
    bounded = sorted((r for r in results if r.capacity is not None), key=lambda r: r.capacity)
    return next((r for r in bounded if r.hit_rate >= target - 1e-12), None)


def summary_line(results, unbounded, footprint, capacity_unit="ids", kv_bytes_per_token=None,
                 share=0.9):
    """One line: the smallest swept capacity reaching ``share`` of the
    unbounded hit rate, in ``capacity_unit`` (and ids)."""
    bs = unbounded.block_size
    ids = id_unit(bs)
    full = unbounded.hit_rate
    if full == 0:
        return "summary: no request hits even in an unbounded cache"
    target = share * full
    best = smallest_reaching(results, target)
    goal = f"{share:.0%} of the unbounded hit rate ({target:.4f} of {full:.4f}, {ids})"
    if best is None:
        top = max((r for r in results if r.capacity is not None), key=lambda r: r.capacity,
                  default=None)
        if top is None:
            return f"summary: no bounded capacity was swept to reach {goal}"
        return (f"summary: no capacity swept reaches {goal}; the largest, "
                f"{_say(top.capacity, capacity_unit, bs, kv_bytes_per_token)}, reaches "
                f"{top.hit_rate:.4f}")
    frac = f", {best.capacity / footprint:.1%} of the unbounded footprint" if footprint else ""
    return (f"summary: {_say(best.capacity, capacity_unit, bs, kv_bytes_per_token)} "
            f"is the smallest capacity swept that reaches {goal}: {best.hit_rate:.4f}{frac}")


def _say(ids_, unit, bs, kvb):
    parts = []
    if kvb:
        parts.append(f"{human_bytes(ids_to_capacity(ids_, 'bytes', bs, kvb))} of KV")
    if bs > 1 or unit != "ids":
        parts.append(f"{ids_to_capacity(ids_, 'tokens', bs):,} tokens")
    if bs > 1:
        parts.append(f"{ids_:,} {id_unit(bs)}")
    if not parts:
        parts.append(f"{ids_:,} tokens")
    first = parts[0] if unit != "ids" or bs == 1 else parts[-1]
    rest = [p for p in parts if p != first]
    return first + (f" ({', '.join(rest)})" if rest else "")
