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

from .sources import Source, SourceError, as_source
from .trace import MOONCAKE_BLOCK_SIZE, Trace, TraceFormatError
from .trace_formats import load_kvcache_tester, load_mooncake, load_token_jsonl

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
#: Format names accepted by :func:`load_trace`.
FORMATS = ("mooncake", "kvcache-tester", "tokens")

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
