"""The command line's argument types: counts, sizes with unit suffixes,
lists of capacities, workers and routers; one-line usage errors."""

import argparse
import re
from decimal import Decimal, InvalidOperation

from .._input.validate import MAX_COUNT, check_int
from ..studies.cluster import MAX_WORKERS, ROUTERS
from ..studies.runs import check_warmup

PROG = "radix-soa"


class UsageError(Exception):
    """A bad combination of options (exit 2, one line)."""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``radix-soa: error: ...`` and exit 2."""

    def error(self, message):
        self.exit(2, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


def int_arg(text, minimum, maximum=MAX_COUNT):
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


def nonneg_int(text):
    return int_arg(text, 0)


def pos_int(text):
    return int_arg(text, 1)


def bounded(maximum):
    """A positive-int argument type with an upper limit."""
    def parse(text):
        return int_arg(text, 1, maximum)
    parse.__name__ = "int"
    return parse


PREFIXES = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
            "ki": 2**10, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
SIZE = re.compile(r"([0-9][0-9_]*(?:\.[0-9]+)?)\s*([kKMGTP]i?)?([bB]?)")


class Quantity(int):
    """A size read from the command line: an int that remembers whether it
    was written in bytes (a ``B`` suffix: ``40GB``, ``160KiB``)."""

    in_bytes = False


def size(text, what="capacity", minimum=0):
    """``"40GB"``, ``"160KiB"``, ``"1.5M"``, ``"2_000"`` -> a ``Quantity``
    of at least ``minimum`` (decimal prefixes k M G T P, binary Ki Mi Gi Ti
    Pi, and a ``B`` that makes it bytes); errors name ``what`` (the flag).

    >>> size("40GB"), size("40GB").in_bytes, size("2M").in_bytes
    (40000000000, True, False)
    """
    t = text.strip()
    m = SIZE.fullmatch(t.lstrip("-"))
    if m is None:
        raise argparse.ArgumentTypeError(
            f"{what} {text[:40]!r} is not an integer (whole ids, tokens or bytes, optionally "
            f"with a suffix: 5000, 2M, 40GB, 160KiB)")
    digits, prefix, in_bytes = m.group(1), m.group(2) or "", bool(m.group(3))
    if "." in digits and not prefix:
        raise argparse.ArgumentTypeError(
            f"{what} {text[:40]!r} is not an integer (a fraction needs a suffix, e.g. 1.5GB)")
    try:
        value = Decimal(digits.replace("_", "")) * PREFIXES[prefix]
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"{what} {text[:40]!r} is not a number") from None
    if value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"{what} {text[:40]!r} is not a whole number")
    value = -int(value) if t.startswith("-") else int(value)
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{what} must be >= {minimum}, got {text[:40]}")
    try:
        q = Quantity(check_int(what, value, minimum=minimum))
    except (ValueError, OverflowError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    q.in_bytes = in_bytes
    return q


def capacity_list(text):
    """``"1000,2_000,40GB"`` -> distinct non-negative ``Quantity``s,
    ascending; all in bytes (a ``B`` suffix) or none."""
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise argparse.ArgumentTypeError("expected a comma-separated list of integers")
    sizes = [size(p) for p in parts]
    if len({q.in_bytes for q in sizes}) > 1:
        raise argparse.ArgumentTypeError(
            f"{text[:60]!r} mixes sizes in bytes (a B suffix) with counts; write all of them "
            "in one unit")
    unique = {int(q): q for q in sizes}
    return [unique[k] for k in sorted(unique)]


def capacity_unit(args):
    """The unit of ``--capacities`` and ``--host-capacity``: ``bytes`` when
    they were written with a ``B`` suffix, else ``--capacity-unit`` (default
    ``ids``); a suffix that contradicts ``--capacity-unit`` is a
    ``UsageError``."""
    given = [("--capacities", q) for q in (args.capacities or [])]
    if args.host_capacity is not None:
        given.append(("--host-capacity", args.host_capacity))
    suffixed = sorted({opt for opt, q in given if q.in_bytes})
    counts = sorted({opt for opt, q in given if not q.in_bytes})
    if suffixed and counts:
        raise UsageError(f"{suffixed[0]} is in bytes (a B suffix) but {counts[0]} is not: "
                         "give both in one unit")
    if suffixed:
        if args.capacity_unit not in (None, "bytes"):
            raise UsageError(f"{suffixed[0]} is in bytes (a B suffix, as in 10GB) but "
                             f"--capacity-unit is {args.capacity_unit}: drop the B for "
                             f"{args.capacity_unit}, or say --capacity-unit bytes")
        return "bytes"
    return args.capacity_unit or "ids"


def host_size(text):
    return size(text, "--host-capacity")


def kv_bytes(text):
    return size(text, "--kv-bytes-per-token", minimum=1)


def warmup_arg(text):
    try:
        return check_warmup(float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            str(exc) if "warmup" in str(exc) else f"expected a number in [0, 1), got "
                                                  f"{text[:40]!r}") from None


def workers_list(text):
    """``"1,2,8"`` -> distinct worker counts in [1, MAX_WORKERS], ascending."""
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError("expected a comma-separated list of worker counts")
    return sorted({int_arg(p, 1, MAX_WORKERS) for p in parts})


def router_list(text):
    """``"round_robin,cache_aware"`` -> router names, in the order given."""
    parts = [p.strip() for p in text.split(",")]
    bad = [p for p in parts if p not in ROUTERS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown router {bad[0][:40]!r}; choose from "
                                         f"{', '.join(ROUTERS)}")
    return list(dict.fromkeys(parts))
