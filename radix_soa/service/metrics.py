"""Prometheus text exposition (format 0.0.4) for the router service,
written here: counters, gauges and histograms with labels are a few lines
each, and prometheus_client's registry (global by default, one lock per
metric update) would cost more per request than the rest of a route.

>>> h = Histogram((0.001, 0.01))
>>> h.observe(0.002); h.observe(0.5)
>>> print("".join(h.lines("lat_seconds", 'endpoint="/route"')), end="")
lat_seconds_bucket{endpoint="/route",le="0.001"} 0
lat_seconds_bucket{endpoint="/route",le="0.01"} 1
lat_seconds_bucket{endpoint="/route",le="+Inf"} 2
lat_seconds_sum{endpoint="/route"} 0.502
lat_seconds_count{endpoint="/route"} 2
"""

import bisect
import re

__all__ = ["Histogram", "LATENCY_BUCKETS", "label", "family"]

# seconds: 50 us .. 1 s
LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
                   0.25, 0.5, 1.0)


_SURROGATE = re.compile("[\ud800-\udfff]")


def label(value):
    r"""A label value escaped as the text format requires (backslash, double
    quote, newline), a lone surrogate (no UTF-8 for it) as U+FFFD.

    >>> label('a"b\\c\nd\udc80') == 'a\\"b\\\\c\\nd\ufffd'
    True
    """
    text = _SURROGATE.sub("\ufffd", str(value))
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def family(name, kind, help_text, samples):
    """A metric family's lines: ``# HELP``, ``# TYPE`` and one line per
    ``(labels, value)`` of ``samples`` (labels a preformatted string)."""
    out = [f"# HELP {name} {help_text}\n", f"# TYPE {name} {kind}\n"]
    for labels, value in samples:
        out.append(f"{name}{{{labels}}} {_num(value)}\n" if labels else f"{name} {_num(value)}\n")
    return out


def _num(v):
    if isinstance(v, float):
        return repr(v) if v == v and v not in (float("inf"), float("-inf")) else \
            ("NaN" if v != v else ("+Inf" if v > 0 else "-Inf"))
    return str(v)


class Histogram:
    """Cumulative buckets of observations (not thread-safe: the service
    observes from its event loop only)."""

    def __init__(self, buckets=LATENCY_BUCKETS):
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v):
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1

    def lines(self, name, labels=""):
        sep = "," if labels else ""
        out, acc = [], 0
        for b, c in zip(self.bounds + (None,), self.counts):
            acc += c
            le = "+Inf" if b is None else repr(b)
            out.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {acc}\n')
        braces = f"{{{labels}}}" if labels else ""
        out.append(f"{name}_sum{braces} {round(self.sum, 9)!r}\n")
        out.append(f"{name}_count{braces} {self.count}\n")
        return out
