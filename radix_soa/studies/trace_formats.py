"""The trace loaders, one per format: Mooncake FAST'25 JSONL
(``load_mooncake``), the kv-cache-tester Claude Code traces
(``load_kvcache_tester``) and token-id JSONL (``load_token_jsonl``). Each
validates strictly and raises ``TraceFormatError`` naming the file and the
line or request; ``radix_soa.studies.traces`` documents the rules."""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path

import numpy as np

from .sources import COMPRESSED_SUFFIXES, Source, as_source
from .trace import MOONCAKE_BLOCK_SIZE, Trace, TraceFormatError, _offsets

__all__ = ["load_mooncake", "load_kvcache_tester", "load_token_jsonl"]

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

# ----------------------------------------------------------------------------
# shared helpers
# ----------------------------------------------------------------------------

def _flatten(id_lists, total):
    """One ``np.fromiter`` over all id lists (already validated)."""
    return np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int64, count=total)


_MAX_BLOCK_SIZE = 2**31 - 1  # a page size (see radix_soa._input.validate.MAX_PAGE)


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
_OTHER_TRACE_SUFFIXES = (".jsonl",) + tuple(".jsonl" + c for c in COMPRESSED_SUFFIXES)


def _kv_files(paths):
    """Resolve ``paths`` (a file, ``"-"``, a directory, or an iterable of
    files) to a name and a list of ``Source``."""
    if isinstance(paths, (str, os.PathLike, Source)) or hasattr(paths, "read"):
        p = Path(os.fspath(paths)) if isinstance(paths, (str, os.PathLike)) else \
            getattr(paths, "path", None)
        if p is not None and p.is_dir():
            files = sorted(q for q in p.iterdir()
                           if q.name.endswith(_KV_SUFFIXES) and q.is_file())
            others = sorted(q.name for q in p.iterdir()
                            if q.name.endswith(_OTHER_TRACE_SUFFIXES) and q.is_file())
            if others:  # a directory is one trace: do not skip another format's files
                raise TraceFormatError(p, f"directory holds {len(others)} JSONL trace file"
                                          f"{'s' if len(others) > 1 else ''} ({others[0]}"
                                          f"{', ...' if len(others) > 1 else ''}) beside its "
                                          "kv-cache-tester *.json files; a directory is read "
                                          "as one kv-cache-tester trace: pass the file, or a "
                                          "directory per trace")
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
