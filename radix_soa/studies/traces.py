"""Loaders for real LLM request traces with prefix structure.

Three input formats are supported, each returning a :class:`Trace`:

* :func:`load_mooncake` -- the Mooncake FAST'25 JSONL traces (one request
  per line; ``hash_ids`` are prefix-chained ids of 512-token blocks).
* :func:`load_kvcache_tester` -- the kv-cache-tester Claude Code traces
  (one JSON conversation per file; ids of 64-token blocks, local to a file).
* :func:`load_token_jsonl` -- plain token-id sequences, one per line.

:func:`load_trace` dispatches on a format name, or detects it from the
content (:func:`detect_format`). Every loader reads a path, ``"-"`` for
standard input or a binary file object, and gzip or zstd content (told by its
first bytes; zstd needs the ``zstandard`` module).

All loaders validate strictly: a malformed line or request raises
:class:`TraceFormatError` naming the file and the 1-based line number (JSONL)
or the request path such as ``requests[3].requests[2]`` (kv-cache-tester
JSON). Nothing is silently dropped. Rules common to every format:

* ids must be JSON integers (not floats, not booleans) inside signed int64;
* every request must hold at least one id (an empty request is an error);
* lengths and token counts must be non-negative integers;
* timestamps must be finite, non-negative and never decreasing;
* an empty file (or one holding only whitespace) is an error, and a missing
  file raises :class:`FileNotFoundError`.

Unknown extra fields are ignored in the two external formats (Mooncake,
kv-cache-tester) but rejected in the token format, where they are most
likely typos.

>>> import tempfile, pathlib
>>> tmp = tempfile.TemporaryDirectory()
>>> p = pathlib.Path(tmp.name) / "toy.jsonl"
>>> _ = p.write_text("[1, 2, 3]\\n[1, 2, 4, 5]\\n")
>>> t = load_trace(p, "tokens")
>>> len(t), t.num_blocks, t[1].tolist()
(2, 7, [1, 2, 4, 5])
>>> tmp.cleanup()
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..batch import Batch
from .sources import COMPRESSED_SUFFIXES, Source, SourceError, as_source

__all__ = [
    "TraceFormatError",
    "Trace",
    "load_mooncake",
    "load_kvcache_tester",
    "load_token_jsonl",
    "load_trace",
    "detect_format",
    "Source",
    "SourceError",
    "MOONCAKE_BLOCK_SIZE",
    "FORMATS",
]

#: Tokens per ``hash_ids`` entry in the Mooncake traces.
MOONCAKE_BLOCK_SIZE = 512

#: Format names accepted by :func:`load_trace`.
FORMATS = ("mooncake", "kvcache-tester", "tokens")

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


class TraceFormatError(ValueError):
    """Malformed trace input; the message names the file and the line
    (1-based) or request path.

    Attributes: ``path`` (str), ``reason`` (str), ``line`` (int or None) and
    ``request`` (str such as ``"requests[3].requests[2]"``, or None).

    >>> e = TraceFormatError("a.jsonl", "bad JSON", line=3)
    >>> str(e), e.line
    ('a.jsonl: line 3: bad JSON', 3)
    >>> str(TraceFormatError("c.json", "'in' is negative", request="requests[0]"))
    "c.json: requests[0]: 'in' is negative"
    """

    def __init__(self, path, reason, line=None, request=None):
        self.path = str(path)
        self.reason = reason
        self.line = line
        self.request = request
        where = []
        if line is not None:
            where.append(f"line {line}")
        if request is not None:
            where.append(request)
        super().__init__(": ".join([self.path, *where, reason]))

    def __reduce__(self):
        return (type(self), (self.path, self.reason, self.line, self.request))


# ----------------------------------------------------------------------------
# Trace container
# ----------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Trace:
    """A request trace: ``n`` id sequences stored flat, plus per-request metadata.

    Request ``i`` is ``flat[offsets[i]:offsets[i+1]]``; one id stands for one
    block of ``block_size`` tokens. ``namespace[i]`` tells which id space the
    request's ids live in (ids from different namespaces must not be treated
    as equal). The dataclass is frozen (fields cannot be rebound) but the
    arrays are ordinary writable NumPy arrays; equality is identity.

    >>> t = Trace.from_sequences([[1, 2, 3], [1, 2, 9]], name="toy")
    >>> len(t), t.num_blocks, t[1].tolist(), t.offsets.tolist()
    (2, 6, [1, 2, 9], [0, 3, 6])
    >>> s = t.summary()
    >>> s["requests"], s["total_blocks"], s["unique_ids"]
    (2, 6, 4)
    """

    name: str
    flat: np.ndarray
    offsets: np.ndarray
    timestamps: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    namespace: np.ndarray
    block_size: int

    def __post_init__(self):
        def as_int64(field):
            a = np.asarray(getattr(self, field))
            if a.size and a.dtype.kind not in "iu":
                raise TypeError(f"Trace.{field} must hold integers, got dtype {a.dtype}")
            a = np.ascontiguousarray(a, dtype=np.int64)
            object.__setattr__(self, field, a)
            return a

        flat = as_int64("flat")
        offsets = as_int64("offsets")
        if flat.ndim != 1 or offsets.ndim != 1:
            raise ValueError("Trace.flat and Trace.offsets must be 1-D")
        if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(flat):
            raise ValueError("Trace.offsets must start at 0 and end at len(flat)")
        if np.any(np.diff(offsets) < 0):
            raise ValueError("Trace.offsets must be non-decreasing")
        n = len(offsets) - 1
        ts = np.ascontiguousarray(self.timestamps, dtype=np.float64)
        object.__setattr__(self, "timestamps", ts)
        for field in ("input_tokens", "output_tokens", "namespace"):
            as_int64(field)
        for field in ("timestamps", "input_tokens", "output_tokens", "namespace"):
            a = getattr(self, field)
            if a.shape != (n,):
                raise ValueError(f"Trace.{field} must have shape ({n},), got {a.shape}")
        if n > 1 and np.any(np.diff(ts) < 0):
            raise ValueError("Trace.timestamps must be non-decreasing")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, (int, np.integer)) \
                or self.block_size <= 0:
            raise ValueError(f"Trace.block_size must be a positive int, got {self.block_size!r}")
        object.__setattr__(self, "block_size", int(self.block_size))
        object.__setattr__(self, "name", str(self.name))

    @classmethod
    def from_sequences(cls, sequences, name="trace", timestamps=None, input_tokens=None,
                       output_tokens=None, namespace=None, block_size=1):
        """Build a trace from a list of id sequences (lists or 1-D arrays).

        Missing metadata defaults to: timestamps 0.0, ``input_tokens`` =
        ``len(seq) * block_size``, ``output_tokens`` 0, namespace 0.

        >>> Trace.from_sequences([[5, 6], [5]]).input_tokens.tolist()
        [2, 1]
        """
        seqs = [np.asarray(s, dtype=np.int64).ravel() for s in sequences]
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        n = len(seqs)
        flat = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int64)
        return cls(
            name=name,
            flat=flat,
            offsets=_offsets(lengths),
            timestamps=np.zeros(n) if timestamps is None else timestamps,
            input_tokens=lengths * block_size if input_tokens is None else input_tokens,
            output_tokens=np.zeros(n, dtype=np.int64) if output_tokens is None else output_tokens,
            namespace=np.zeros(n, dtype=np.int64) if namespace is None else namespace,
            block_size=block_size,
        )

    def __len__(self):
        return len(self.offsets) - 1

    def __radix_batch__(self):
        """The requests as a ``radix_soa.Batch`` (zero-copy), so a trace goes
        wherever a batch does; refused when it holds several namespaces,
        whose ids must not meet in one tree."""
        if len(np.unique(self.namespace)) > 1:
            raise ValueError(
                f"trace {self.name!r} holds several namespaces whose ids must not be mixed in "
                "one tree; replay() keeps them apart, or select one namespace first")
        return Batch(self.flat, self.offsets)

    def __getitem__(self, i):
        """The ``i``-th request's id sequence (a view into ``flat``).

        >>> Trace.from_sequences([[1], [2, 3]])[-1].tolist()
        [2, 3]
        """
        n = len(self)
        i = operator.index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"request index out of range for a trace of {n} requests")
        return self.flat[self.offsets[i]:self.offsets[i + 1]]

    def __iter__(self):
        return iter(self.sequences())

    def sequences(self):
        """All requests as a list of 1-D int64 views into ``flat``.

        >>> [s.tolist() for s in Trace.from_sequences([[1, 2], [3]]).sequences()]
        [[1, 2], [3]]
        """
        if len(self) == 0:
            return []
        return np.split(self.flat, self.offsets[1:-1])

    @property
    def num_blocks(self):
        """Total number of ids (blocks) over all requests, ``len(flat)``."""
        return len(self.flat)

    def unique_ids(self):
        """Number of distinct ``(namespace, id)`` pairs.

        >>> t = Trace.from_sequences([[1, 2], [1, 2]], namespace=[0, 1])
        >>> t.unique_ids()
        4
        """
        if len(self) == 0:
            return 0
        ns = self.namespace
        if ns.min() == ns.max():
            return int(np.unique(self.flat).size)
        per_block = np.repeat(ns, np.diff(self.offsets))
        return sum(int(np.unique(self.flat[per_block == k]).size) for k in np.unique(ns))

    def summary(self):
        """A dict of headline statistics.

        Keys: ``name``, ``requests``, ``avg_input_tokens``,
        ``avg_output_tokens``, ``total_blocks``, ``unique_ids`` (distinct
        ``(namespace, id)`` pairs), ``block_size`` and ``namespaces``.

        >>> Trace.from_sequences([[1, 2], [1, 3]], name="x", output_tokens=[4, 6]).summary()
        {'name': 'x', 'requests': 2, 'avg_input_tokens': 2.0, 'avg_output_tokens': 5.0,
         'total_blocks': 4, 'unique_ids': 3, 'block_size': 1, 'namespaces': 1}
        """
        n = len(self)
        return {
            "name": self.name,
            "requests": n,
            "avg_input_tokens": float(self.input_tokens.mean()) if n else 0.0,
            "avg_output_tokens": float(self.output_tokens.mean()) if n else 0.0,
            "total_blocks": self.num_blocks,
            "unique_ids": self.unique_ids(),
            "block_size": self.block_size,
            "namespaces": int(np.unique(self.namespace).size),
        }

    def __repr__(self):
        return (f"Trace(name={self.name!r}, requests={len(self)}, blocks={self.num_blocks}, "
                f"block_size={self.block_size})")


# ----------------------------------------------------------------------------
# shared helpers
# ----------------------------------------------------------------------------

def _offsets(lengths):
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _flatten(id_lists, total):
    """One ``np.fromiter`` over all id lists (already validated)."""
    return np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int64, count=total)


_MAX_BLOCK_SIZE = 2**31 - 1  # a page size (see radix_soa._validate.MAX_PAGE)


def _is_int(x):
    return type(x) is int  # excludes bool, float


def _is_number(x):
    if type(x) is int:
        return _INT64_MIN <= x <= _INT64_MAX  # a 400-digit int is no timestamp
    return type(x) is float and math.isfinite(x)


def _check_count(value, field):
    """Return None if ``value`` is a non-negative integer, else a reason."""
    if not _is_int(value):
        return f"{field!r} must be an integer, got {value!r}"
    if value < 0:
        return f"{field!r} is negative ({value})"
    if value > _INT64_MAX:
        return f"{field!r} = {value} is outside signed int64"
    return None


def _check_ids(ids, field):
    """Return None if ``ids`` is a non-empty list of int64-range ints, else a reason."""
    if type(ids) is not list:
        return f"{field!r} must be a list of integers, got {type(ids).__name__}"
    if not ids:
        return f"{field!r} is empty"
    # set(map(type, ...)), min and max all run in C: cheap even for ~10^6 ids.
    if set(map(type, ids)) != {int}:
        for k, x in enumerate(ids):
            if type(x) is not int:
                return f"{field}[{k}] = {x!r} is not an integer"
    if min(ids) < _INT64_MIN or max(ids) > _INT64_MAX:
        for k, x in enumerate(ids):
            if not _INT64_MIN <= x <= _INT64_MAX:
                return f"{field}[{k}] = {x} is outside signed int64"
    return None


def _iter_jsonl(src):
    """Yield ``(lineno, obj)`` for each line of a JSONL source; raise on bad or blank lines."""
    any_line = False
    path = src.name
    with src.open() as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                raise TraceFormatError(path, "blank line (every line must hold one request)",
                                       line=lineno)
            any_line = True
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                msg = getattr(e, "msg", None) or str(e)
                col = getattr(e, "colno", None)
                raise TraceFormatError(
                    path, f"invalid JSON: {msg}" + (f" (column {col})" if col else ""),
                    line=lineno) from None
            except RecursionError:
                raise TraceFormatError(path, "invalid JSON: nested too deeply",
                                       line=lineno) from None
            yield lineno, obj
    if not any_line:
        raise TraceFormatError(path, "empty file (no requests)")


# ----------------------------------------------------------------------------
# Mooncake
# ----------------------------------------------------------------------------

def load_mooncake(path):
    """Load a Mooncake FAST'25 JSONL trace.

    Each line is ``{"timestamp": ms, "input_length": int, "output_length":
    int, "hash_ids": [int, ...]}``; ``hash_ids`` are prefix-chained ids of
    512-token blocks, so ``len(hash_ids) == ceil(input_length / 512)`` must
    hold (the last block may be partial). Timestamps (ms from the trace
    start) become float seconds. Every request gets namespace 0 and
    ``block_size`` is 512. Extra fields on a line are ignored.

    >>> import tempfile, pathlib
    >>> tmp = tempfile.TemporaryDirectory()
    >>> p = pathlib.Path(tmp.name) / "tiny.jsonl"
    >>> _ = p.write_text(
    ...     '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\\n'
    ...     '{"timestamp": 1500, "input_length": 1100, "output_length": 7, "hash_ids": [0, 2, 3]}\\n')
    >>> t = load_mooncake(p)
    >>> t.name, len(t), t[1].tolist(), t.timestamps.tolist(), t.block_size
    ('tiny', 2, [0, 2, 3], [0.0, 1.5], 512)
    >>> tmp.cleanup()
    """
    src = as_source(path)
    path = src.name
    ids_lists, ts, inp, out = [], [], [], []
    prev_ts = 0
    for lineno, obj in _iter_jsonl(src):
        def fail(reason):
            return TraceFormatError(path, reason, line=lineno)

        if type(obj) is not dict:
            raise fail(f"expected a JSON object, got {type(obj).__name__}")
        for key in ("timestamp", "input_length", "output_length", "hash_ids"):
            if key not in obj:
                raise fail(f"missing field {key!r}")
        t = obj["timestamp"]
        if not _is_number(t):
            raise fail(f"'timestamp' must be a finite number, got {t!r}")
        if t < 0:
            raise fail(f"'timestamp' is negative ({t})")
        if t < prev_ts:
            raise fail(f"timestamp decreases ({t} after {prev_ts})")
        prev_ts = t
        n_in, n_out = obj["input_length"], obj["output_length"]
        for key, v in (("input_length", n_in), ("output_length", n_out)):
            reason = _check_count(v, key)
            if reason:
                raise fail(reason)
        ids = obj["hash_ids"]
        reason = _check_ids(ids, "hash_ids")
        if reason:
            raise fail(reason)
        expected = -(-n_in // MOONCAKE_BLOCK_SIZE)
        if len(ids) != expected:
            raise fail(f"len(hash_ids) = {len(ids)} but ceil(input_length/{MOONCAKE_BLOCK_SIZE})"
                       f" = {expected} (input_length = {n_in})")
        ids_lists.append(ids)
        ts.append(t)
        inp.append(n_in)
        out.append(n_out)

    lengths = np.fromiter(map(len, ids_lists), dtype=np.int64, count=len(ids_lists))
    n = len(ids_lists)
    return Trace(
        name=src.stem,
        flat=_flatten(ids_lists, int(lengths.sum())),
        offsets=_offsets(lengths),
        timestamps=np.asarray(ts, dtype=np.float64) / 1000.0,
        input_tokens=np.asarray(inp, dtype=np.int64),
        output_tokens=np.asarray(out, dtype=np.int64),
        namespace=np.zeros(n, dtype=np.int64),
        block_size=MOONCAKE_BLOCK_SIZE,
    )


# ----------------------------------------------------------------------------
# kv-cache-tester (Claude Code traces)
# ----------------------------------------------------------------------------

_KV_REQUEST_TYPES = ("n", "s")
_KV_SUBAGENT = "subagent"


_KV_SUFFIXES = (".json",) + tuple(".json" + c for c in COMPRESSED_SUFFIXES)


def _kv_files(paths):
    """Resolve ``paths`` (a file, ``"-"``, a directory, or an iterable of
    files) to a name and a list of ``Source``."""
    if isinstance(paths, (str, os.PathLike, Source)) or hasattr(paths, "read"):
        p = Path(os.fspath(paths)) if isinstance(paths, (str, os.PathLike)) else \
            getattr(paths, "path", None)
        if p is not None and p.is_dir():
            files = sorted(q for q in p.iterdir()
                           if q.name.endswith(_KV_SUFFIXES) and q.is_file())
            if not files:
                raise TraceFormatError(p, "directory holds no *.json (or .json.gz, .json.zst) "
                                          "trace files")
            return p.name, [Source(q) for q in files]
        src = as_source(paths)
        return src.stem, [src]
    files = [Source(q) for q in paths]
    if not files:
        raise ValueError("load_kvcache_tester: empty list of files")
    return "+".join(f.stem for f in files), files


def _kv_walk(path, reqs, where, base_t, out):
    """Append ``(abs_t, ids, in, out)`` for every leaf request, depth first.

    ``base_t`` is the absolute start of the enclosing conversation or
    sub-agent; each ``t`` is relative to it.
    """
    if type(reqs) is not list:
        raise TraceFormatError(path, f"'requests' must be a list, got {type(reqs).__name__}",
                               request=where or None)
    prefix = f"{where}.requests" if where else "requests"
    prev_t = None
    for k, r in enumerate(reqs):
        loc = f"{prefix}[{k}]"

        def fail(reason):
            return TraceFormatError(path, reason, request=loc)

        if type(r) is not dict:
            raise fail(f"expected a JSON object, got {type(r).__name__}")
        if "t" not in r:
            raise fail("missing field 't'")
        t = r["t"]
        if not _is_number(t):
            raise fail(f"'t' must be a finite number, got {t!r}")
        if t < 0:
            raise fail(f"'t' is negative ({t})")
        if prev_t is not None and t < prev_t:
            raise fail(f"'t' decreases ({t} after {prev_t})")
        prev_t = t
        if "type" not in r:
            raise fail("missing field 'type'")
        kind = r["type"]
        if kind == _KV_SUBAGENT:
            if "requests" not in r:
                raise fail("sub-agent entry has no 'requests' list")
            _kv_walk(path, r["requests"], loc, base_t + t, out)
            continue
        if kind not in _KV_REQUEST_TYPES:
            raise fail(f"unknown request type {kind!r} (expected 'n', 's' or 'subagent')")
        for key in ("in", "out", "hash_ids"):
            if key not in r:
                raise fail(f"missing field {key!r}")
        n_in, n_out = r["in"], r["out"]
        for key, v in (("in", n_in), ("out", n_out)):
            reason = _check_count(v, key)
            if reason:
                raise fail(reason)
        ids = r["hash_ids"]
        reason = _check_ids(ids, "hash_ids")
        if reason:
            raise fail(reason)
        out.append((base_t + t, ids, n_in, n_out))


def _kv_load_file(src):
    raw = src.read()
    path = src.name
    if not raw.strip():
        raise TraceFormatError(path, "empty file")
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise TraceFormatError(path, f"invalid JSON: {e.msg} (column {e.colno})",
                               line=e.lineno) from None
    except UnicodeDecodeError as e:
        raise TraceFormatError(path, f"invalid JSON: {e}") from None
    except RecursionError:
        raise TraceFormatError(path, "invalid JSON: nested too deeply") from None
    if type(doc) is not dict:
        raise TraceFormatError(path, f"expected a JSON object at top level, got "
                                     f"{type(doc).__name__}", line=1)
    for key in ("block_size", "requests"):
        if key not in doc:
            raise TraceFormatError(path, f"missing top-level field {key!r}")
    bs = doc["block_size"]
    if not _is_int(bs) or not 0 < bs <= _MAX_BLOCK_SIZE:
        raise TraceFormatError(path, f"'block_size' must be an integer in [1, {_MAX_BLOCK_SIZE}], "
                                     f"got {bs!r}")
    scope = doc.get("hash_id_scope", "local")
    if scope != "local":
        raise TraceFormatError(
            path, f"unsupported 'hash_id_scope' {scope!r} (only 'local' is supported)")
    leaves = []
    _kv_walk(path, doc["requests"], "", 0.0, leaves)
    if not leaves:
        raise TraceFormatError(path, "no requests")
    return bs, leaves


def load_kvcache_tester(paths):
    """Load kv-cache-tester (WEKA Claude Code) conversation traces.

    ``paths`` is one JSON file, a directory (all ``*.json`` files in it, in
    sorted name order), or an iterable of files (in the given order). File
    ``j`` gets namespace ``j``: hash ids are local to each file, so ids from
    different files must never be identified. Sub-agents share their
    parent's namespace. All files must have the same ``block_size``
    (64 in the published corpus), which becomes ``Trace.block_size``.

    Requests of type ``"n"``/``"s"`` are kept; a ``"type": "subagent"``
    entry holds its own ``requests`` list (nesting to any depth), whose
    requests are flattened into the stream.

    **Sub-agent timing.** A nested request's ``t`` is relative to the
    sub-agent's own start, i.e. to the ``t`` of the ``subagent`` entry, not
    to the conversation start. Its arrival time is therefore
    ``entry.t + nested.t``. Evidence from the data: every nested list starts
    at ``t == 0.0``; the entry ``t`` carries the spawn time with millisecond
    precision (e.g. 100.65 s); and ``entry.t + last.t + last.api_time`` ends
    a few seconds before ``entry.t + duration_ms / 1000`` for every completed
    sub-agent (trace_0010 agent_001: 100.65 + 57 + 31.41 = 189.06 s vs
    191.89 s). Read as conversation-relative, sub-agents would send requests
    at 0 s, before they were spawned.

    **Order.** The merged stream (parent requests and all nested requests)
    is sorted by arrival time with a stable sort, so ties keep file order,
    and within a file, depth-first document order. When several files are
    loaded, every conversation starts at t = 0 and they are interleaved as
    concurrent sessions.

    **Validation.** Besides the common rules (see the module docstring):
    ``t``, ``in``, ``out`` and ``hash_ids`` are required on every request;
    ``t`` must not decrease within one ``requests`` list; the type must be
    ``"n"``, ``"s"`` or ``"subagent"``; ``hash_id_scope``, if present, must
    be ``"local"``. Requests with empty ``hash_ids`` raise: none occur in
    the 12 published files we have (which all satisfy
    ``len(hash_ids) == in // block_size``, i.e. only whole 64-token blocks get
    an id), so an empty list would signal a broken file rather than a short
    prompt. Other fields (``model``, ``ttft``, ``api_time``, ...) are
    ignored. Errors name the file and the request path, e.g.
    ``requests[3].requests[2]``.

    >>> import json, tempfile, pathlib
    >>> tmp = tempfile.TemporaryDirectory()
    >>> p = pathlib.Path(tmp.name) / "conv.json"
    >>> _ = p.write_text(json.dumps({"block_size": 64, "requests": [
    ...     {"t": 0.0, "type": "n", "in": 130, "out": 5, "hash_ids": [1, 2]},
    ...     {"t": 10.5, "type": "subagent", "requests": [
    ...         {"t": 0.0, "type": "n", "in": 64, "out": 3, "hash_ids": [7]},
    ...         {"t": 20.0, "type": "n", "in": 128, "out": 3, "hash_ids": [7, 8]}]},
    ...     {"t": 15.0, "type": "s", "in": 200, "out": 9, "hash_ids": [1, 2, 3]}]}))
    >>> t = load_kvcache_tester(p)
    >>> t.timestamps.tolist()
    [0.0, 10.5, 15.0, 30.5]
    >>> [s.tolist() for s in t.sequences()]
    [[1, 2], [7], [1, 2, 3], [7, 8]]
    >>> t.block_size, t.namespace.tolist()
    (64, [0, 0, 0, 0])
    >>> tmp.cleanup()
    """
    name, files = _kv_files(paths)
    block_size = None
    times, ids_lists, inp, out, ns = [], [], [], [], []
    for j, f in enumerate(files):
        bs, leaves = _kv_load_file(f)
        if block_size is None:
            block_size = bs
        elif bs != block_size:
            raise TraceFormatError(f.name, f"block_size {bs} differs from {block_size} in "
                                           f"{files[0].name}")
        for abs_t, ids, n_in, n_out in leaves:
            times.append(abs_t)
            ids_lists.append(ids)
            inp.append(n_in)
            out.append(n_out)
        ns.extend([j] * len(leaves))

    times = np.asarray(times, dtype=np.float64)
    order = np.argsort(times, kind="stable")
    if np.any(order != np.arange(len(order))):
        ids_lists = [ids_lists[i] for i in order.tolist()]
        times = times[order]
        inp = np.asarray(inp, dtype=np.int64)[order]
        out = np.asarray(out, dtype=np.int64)[order]
        ns = np.asarray(ns, dtype=np.int64)[order]
    lengths = np.fromiter(map(len, ids_lists), dtype=np.int64, count=len(ids_lists))
    return Trace(
        name=name,
        flat=_flatten(ids_lists, int(lengths.sum())),
        offsets=_offsets(lengths),
        timestamps=times,
        input_tokens=np.asarray(inp, dtype=np.int64),
        output_tokens=np.asarray(out, dtype=np.int64),
        namespace=np.asarray(ns, dtype=np.int64),
        block_size=block_size,
    )


# ----------------------------------------------------------------------------
# plain token lists
# ----------------------------------------------------------------------------

_TOKEN_KEYS = {"tokens", "timestamp", "output_length"}


def load_token_jsonl(path):
    """Load a JSONL file of token-id sequences (``block_size`` 1).

    Each line is either a JSON list of ints, or an object
    ``{"tokens": [...], "timestamp": seconds, "output_length": int}`` where
    ``timestamp`` and ``output_length`` are optional. Either every line has a
    ``timestamp`` (seconds, non-decreasing) or none has (then all are 0.0);
    a missing ``output_length`` is 0. ``input_tokens`` is the sequence
    length. Unknown keys are rejected (they are most likely typos).

    >>> import tempfile, pathlib
    >>> tmp = tempfile.TemporaryDirectory()
    >>> p = pathlib.Path(tmp.name) / "toks.jsonl"
    >>> _ = p.write_text('{"tokens": [5, 6, 7], "timestamp": 0.5, "output_length": 2}\\n'
    ...                  '{"tokens": [5, 6], "timestamp": 1.25}\\n')
    >>> t = load_token_jsonl(p)
    >>> t[0].tolist(), t.timestamps.tolist(), t.output_tokens.tolist(), t.block_size
    ([5, 6, 7], [0.5, 1.25], [2, 0], 1)
    >>> tmp.cleanup()
    """
    src = as_source(path)
    path = src.name
    ids_lists, ts, out = [], [], []
    has_ts = None  # decided by the first line
    prev_t = None
    for lineno, obj in _iter_jsonl(src):
        def fail(reason):
            return TraceFormatError(path, reason, line=lineno)

        t, n_out = None, 0
        if type(obj) is list:
            ids = obj
        elif type(obj) is dict:
            unknown = set(obj) - _TOKEN_KEYS
            if unknown:
                raise fail(f"unknown field(s) {sorted(unknown)} "
                           f"(allowed: 'tokens', 'timestamp', 'output_length')")
            if "tokens" not in obj:
                raise fail("missing field 'tokens'")
            ids = obj["tokens"]
            t = obj.get("timestamp")
            if "timestamp" in obj:
                if not _is_number(t):
                    raise fail(f"'timestamp' must be a finite number, got {t!r}")
                if t < 0:
                    raise fail(f"'timestamp' is negative ({t})")
            if "output_length" in obj:
                n_out = obj["output_length"]
                reason = _check_count(n_out, "output_length")
                if reason:
                    raise fail(reason)
        else:
            raise fail(f"expected a JSON list of ints or an object, got {type(obj).__name__}")
        reason = _check_ids(ids, "tokens")
        if reason:
            raise fail(reason)
        if has_ts is None:
            has_ts = t is not None
        elif has_ts != (t is not None):
            raise fail("'timestamp' must be given on every line or on none"
                       + (" (this line lacks it)" if has_ts else " (earlier lines lack it)"))
        if t is not None:
            if prev_t is not None and t < prev_t:
                raise fail(f"timestamp decreases ({t} after {prev_t})")
            prev_t = t
        ids_lists.append(ids)
        ts.append(0.0 if t is None else t)
        out.append(n_out)

    lengths = np.fromiter(map(len, ids_lists), dtype=np.int64, count=len(ids_lists))
    n = len(ids_lists)
    return Trace(
        name=src.stem,
        flat=_flatten(ids_lists, int(lengths.sum())),
        offsets=_offsets(lengths),
        timestamps=np.asarray(ts, dtype=np.float64),
        input_tokens=lengths.copy(),
        output_tokens=np.asarray(out, dtype=np.int64),
        namespace=np.zeros(n, dtype=np.int64),
        block_size=1,
    )


# ----------------------------------------------------------------------------
# dispatch
# ----------------------------------------------------------------------------

_LOADERS = {
    "mooncake": load_mooncake,
    "kvcache-tester": load_kvcache_tester,
    "tokens": load_token_jsonl,
}


def _top_level_keys(text, limit=64):
    """The keys of the first JSON object in ``text`` (which may be cut
    short), in order: a scan that follows strings and nesting only.

    >>> _top_level_keys('{"a": 1, "b": {"c": [2]}, "d": "x}", "e": [')
    ['a', 'b', 'd', 'e']
    """
    keys, depth, i, n = [], 0, 0, len(text)
    while i < n and len(keys) < limit:
        ch = text[i]
        if ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if depth == 1:
                k = j + 1
                while k < n and text[k] in " \t\r\n":
                    k += 1
                if k < n and text[k] == ":":
                    keys.append(text[i + 1:j])
            i = j + 1
            continue
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                break
        i += 1
    return keys


def _sniff(src):
    """``(format or None, what the content starts with)``."""
    if src.path is not None and src.path.is_dir():
        return "kvcache-tester", "a directory"
    head = src.head().decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if not head:
        return None, "nothing (an empty file)"
    if head[0] == "[":
        return "tokens", "a JSON list on the first line"
    if head[0] != "{":
        return None, f"{head[:12]!r}, not a JSON object or list"
    keys = _top_level_keys(head)
    shown = "the first record's fields " + ", ".join(map(repr, keys[:6])) if keys else \
        "a JSON object without fields"
    if "requests" in keys or "block_size" in keys:
        return "kvcache-tester", shown
    if "hash_ids" in keys or "input_length" in keys:
        return "mooncake", shown
    if "tokens" in keys:
        return "tokens", shown
    return None, shown


def detect_format(path):
    """The format of the trace at ``path`` ("-" for standard input), told
    from its content: a directory or a JSON object with ``requests`` /
    ``block_size`` is kv-cache-tester, lines with ``hash_ids`` /
    ``input_length`` are Mooncake, lines that are lists or have ``tokens``
    are token JSONL. Raises ``TraceFormatError`` when it cannot tell.

    >>> import io
    >>> detect_format(io.BytesIO(b'{"timestamp": 0, "input_length": 3, "hash_ids": [1]}\\n'))
    'mooncake'
    >>> detect_format(io.BytesIO(b'[1, 2, 3]\\n'))
    'tokens'
    """
    src = as_source(path)
    fmt, seen = _sniff(src)
    if fmt is None:
        raise TraceFormatError(src.name, f"cannot tell the trace format: it starts with {seen}; "
                                         f"name the format ({', '.join(FORMATS)})")
    return fmt


def load_trace(path, format=None):
    """Load ``path`` (a file, a kv-cache-tester directory, ``"-"`` for
    standard input, or a binary file object; gzip and zstd content is
    decompressed) with the loader for ``format``: ``"mooncake"``,
    ``"kvcache-tester"`` or ``"tokens"``, or ``None`` to detect it
    (``detect_format``). When a named format fails on content that looks
    like another, the error says which.

    >>> load_trace("unused.jsonl", "csv")
    Traceback (most recent call last):
    ...
    ValueError: unknown trace format 'csv'; expected one of mooncake, kvcache-tester, tokens
    """
    if format is not None:
        try:
            loader = _LOADERS[format]
        except (KeyError, TypeError):
            raise ValueError(f"unknown trace format {format!r}; expected one of "
                             f"{', '.join(FORMATS)}") from None
    src = path if isinstance(path, (list, tuple)) else as_source(path)
    if format is None:
        return _LOADERS[detect_format(src)](src)
    try:
        return loader(src)
    except TraceFormatError as e:
        if isinstance(src, (list, tuple)):
            raise
        try:
            seen, why = _sniff(src)
        except (OSError, ValueError):
            raise e from None
        if seen is None or seen == format:
            raise
        raise TraceFormatError(src.name, f"this looks like a {seen} trace, not {format} "
                                         f"({why}); load it as {seen!r}, or leave the format "
                                         f"out to detect it") from None
