"""The router service's request bodies, checked: every bad body raises
``BadRequest`` (the service answers 400 with its one-line message, which
names the field), never anything else.

>>> tokens_of({"tokens": [1, 2, 3]}).tolist()
[1, 2, 3]
>>> tokens_of({"tokens": [1, 2.5]})
Traceback (most recent call last):
...
radix_soa.service.schema.BadRequest: tokens must be a list of integers in [-2**63, 2**63); got a number among them
"""

import json
import re

import numpy as np

from .._events.kv_events import extra_hash
from .._kernels import text as text_kernels

__all__ = ["cut", "shown", "BadRequest", "parse_body", "read_tokens", "tokens_of",
           "namespace_of", "loads_of", "keys_of", "batch_of", "LOAD_FIELDS"]

# what a worker's load holds (all counts >= 0): outstanding requests and
# their tokens (least_loaded, cache_aware's balance), KV blocks held by
# running requests and prompt tokens still waiting for prefill (kv_overlap)
LOAD_FIELDS = ("requests", "tokens", "active_blocks", "prefill_tokens")
MAX_LOAD = 1 << 53  # exact in a JSON number


CUT = 200  # characters of a bad value an error message shows


def cut(text, limit=CUT):
    """``text`` (a str) cut to ``limit`` characters, saying its length if cut.

    >>> cut("x" * 300, 10)
    'xxxxxxxxxx... (300 characters)'
    """
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def shown(value, limit=CUT):
    """``repr(value)`` for an error message, cut to ``limit`` characters
    (a long str or list is cut before its repr is made).

    >>> shown("ab"), shown(list(range(1000)), 12)
    ("'ab'", '[0, 1, 2, 3,... (1000 items)')
    """
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    if isinstance(value, (list, tuple, dict)) and len(value) > limit // 2:
        head = (dict(list(value.items())[:limit // 2]) if isinstance(value, dict)
                else value[:limit // 2])
        return f"{cut(repr(head), limit)[:limit]}... ({len(value)} items)"
    return cut(repr(value), limit)


class BadRequest(ValueError):
    """A request body the service refuses (HTTP 400)."""


STREAM_FROM = 1 << 20  # bytes: a larger body's lists are read item by item


def parse_body(raw, *, stream=()):
    """The JSON object in ``raw`` (bytes). A body over ``STREAM_FROM`` bytes
    has the lists under the keys in ``stream`` read one item at a time, so
    the thread parsing it lets others run between items (one ``json.loads``
    of a large body holds the GIL throughout).

    >>> parse_body(b'{"events": [{"a": 1}, 2], "x": null}', stream=("events",))
    {'events': [{'a': 1}, 2], 'x': None}
    """
    try:
        if stream and len(raw) > STREAM_FROM:
            body = _parse_streaming(raw, stream)
        else:
            body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BadRequest(f"the body is not JSON: {msg}") from None
    except RecursionError:
        raise BadRequest("the body is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object; got {_kind(body)}")
    return body


_WS = re.compile(r"[ \t\n\r]*")


def _parse_streaming(raw, stream):
    """``json.loads(raw)`` for an object, the lists under ``stream`` keys
    decoded item by item (``ValueError`` as ``json.loads`` raises it)."""
    text = raw.decode("utf-8") if not isinstance(raw, str) else raw
    dec = json.JSONDecoder()
    ws = _WS.match

    def expect(i, chars):
        i = ws(text, i).end()
        if i >= len(text) or text[i] not in chars:
            raise ValueError(f"expected {' or '.join(map(repr, chars))} at char {i}")
        return i

    i = ws(text, 0).end()
    if not text.startswith("{", i):
        return json.loads(text)  # not an object: said by the caller
    i += 1
    out = {}
    if text[expect(i, "}\"")] == "}":
        i = expect(i, "}") + 1
    else:
        while True:
            i = expect(i, "\"")
            key, i = dec.raw_decode(text, i)
            i = expect(i, ":") + 1
            i = ws(text, i).end()
            if key in stream and text.startswith("[", i):
                items = []
                i += 1
                if text[expect(i, "]\"{[-0123456789tfnNI")] == "]":
                    i = expect(i, "]") + 1
                else:
                    while True:
                        v, i = dec.raw_decode(text, ws(text, i).end())
                        items.append(v)
                        i = expect(i, ",]")
                        i += 1
                        if text[i - 1] == "]":
                            break
                out[key] = items
            else:
                out[key], i = dec.raw_decode(text, i)
            i = expect(i, ",}") + 1
            if text[i - 1] == "}":
                break
    if ws(text, i).end() != len(text):
        raise ValueError(f"extra data at char {i}")
    return out


def _kind(v):
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number", type(None): "null"}.get(type(v),
                                                                           type(v).__name__)


def check_keys(body, allowed):
    extra = [k for k in body if k not in allowed]
    if extra:
        raise BadRequest(f"unknown field {shown(extra[0])}; the fields are {', '.join(allowed)}")


def tokens_of(body, field="tokens", maybe_bool=True):
    """``body[field]`` as an int64 array: a JSON list of integers
    (``maybe_bool=False``: the body was seen to hold no boolean, so the
    check for one is skipped)."""
    if field not in body:
        raise BadRequest(f"{field} is missing: a list of token ids")
    t = body[field]
    if not isinstance(t, list):
        raise BadRequest(f"{field} must be a list of integers; got {_kind(t)}")
    if not t:
        return np.zeros(0, np.int64)
    try:  # C speed for the common case; the dtype tells any non-integer
        a = np.array(t)
    except (ValueError, TypeError, OverflowError):
        a = None
    if a is None or a.dtype != np.int64 or a.ndim != 1:
        bad = next((x for x in t if type(x) is not int), None)
        what = _kind(bad) if bad is not None or any(x is None for x in t) else \
            "an integer out of range"
        raise BadRequest(f"{field} must be a list of integers in [-2**63, 2**63); got {what} "
                         f"among them")
    if maybe_bool:
        check_no_bool(t, field)
    return a


def has_bool(raw):
    """Whether a JSON body may hold a boolean (``np.array`` reads one
    among integers as 0 or 1): the slow check runs only then."""
    return b"true" in raw or b"false" in raw


def check_no_bool(t, field="tokens"):
    if any(type(x) is bool for x in t):
        raise BadRequest(f"{field} must be a list of integers in [-2**63, 2**63); got a boolean "
                         "among them")


def namespace_of(body):
    """``body["namespace"]``: absent or null (the default namespace), an
    integer or a string."""
    ns = body.get("namespace")
    if ns is None or isinstance(ns, str) or (type(ns) is int and -(1 << 63) <= ns < 1 << 63):
        return ns
    raise BadRequest(f"namespace must be null, an integer or a string; got {_kind(ns)}")


def keys_of(body):
    """``(lora_name, extra_keys)`` of a query body: absent or null, a
    string (the LoRA adapter's name), and a list of the keys vLLM folds
    into a request's first block (such as its cache salt)."""
    lora = body.get("lora_name")
    if lora is not None and not isinstance(lora, str):
        raise BadRequest(f"lora_name must be null or a string; got {_kind(lora)}")
    extra = body.get("extra_keys")
    if extra is not None:
        if not isinstance(extra, list):
            raise BadRequest(f"extra_keys must be null or a list; got {_kind(extra)}")
        try:
            extra_hash(extra)
        except (TypeError, ValueError) as exc:
            raise BadRequest(f"extra_keys: {exc}") from None
    return lora, extra


def batch_of(body):
    """``body["batch"]``: a list of token lists, as int64 arrays."""
    rows = body.get("batch")
    if not isinstance(rows, list):
        raise BadRequest(f"batch must be a list of token lists; got {_kind(rows)}")
    return [tokens_of({f"batch[{i}]": r}, f"batch[{i}]") for i, r in enumerate(rows)]


def loads_of(value, names, field="loads", delta=False):
    """A loads object ``{worker: {field: count, ...}, ...}`` checked against
    the worker ``names`` (str ids): ``{name: {field: int}}``. Counts are
    integers >= 0 (``delta``: any sign) up to 2**53."""
    if not isinstance(value, dict):
        raise BadRequest(f"{field} must be an object from worker id to its load; got "
                         f"{_kind(value)}")
    out = {}
    for name, load in value.items():
        if name not in names:
            raise BadRequest(f"{field}: unknown worker {shown(name)}")
        if not isinstance(load, dict):
            raise BadRequest(f"{field}[{shown(name)}] must be an object of "
                             f"{', '.join(LOAD_FIELDS)}; got {_kind(load)}")
        one = {}
        for k, v in load.items():
            if k not in LOAD_FIELDS:
                raise BadRequest(f"{field}[{shown(name)}]: unknown field {shown(k)}; the fields "
                                 f"are {', '.join(LOAD_FIELDS)}")
            lo = -MAX_LOAD if delta else 0
            if type(v) is not int or not lo <= v <= MAX_LOAD:
                raise BadRequest(f"{field}[{shown(name)}][{shown(k)}] must be an integer in "
                                 f"[{'-2**53' if delta else '0'}, 2**53]; got {shown(v)}")
            one[k] = v
        out[name] = one
    return out


def number_of(body, field, default, minimum=None):
    v = body.get(field, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or \
            (minimum is not None and v < minimum):
        raise BadRequest(f"{field} must be a number"
                         f"{'' if minimum is None else f' >= {minimum}'}; got {shown(v)}")
    return v


_SPACE = b" \t\n\r"


def _list_after(raw, j, n):
    """The position of the ``[`` of ``"key": [`` whose key ends at ``j``, or -1."""
    while j < n and raw[j] in _SPACE:
        j += 1
    if j >= n or raw[j] != 58:  # ':'
        return -1
    j += 1
    while j < n and raw[j] in _SPACE:
        j += 1
    return j if j < n and raw[j] == 91 else -1  # '['


def _fast_tokens(raw):
    """``(body, tokens)`` of a body with one ``"tokens": [`` (other
    ``"tokens"`` keys, such as a load's count, may hold numbers), a plain
    JSON array of integers read by a kernel without building a Python
    list; None whenever anything is unusual (a 19-digit id, a leading zero,
    a float, two such lists, the key not at the top), so that the exact
    path decides."""
    n = len(raw)
    j = -1
    at = raw.find(b'"tokens"')
    while at >= 0:
        k = _list_after(raw, at + 8, n)
        if k >= 0:
            if j >= 0:
                return None
            j = k
        at = raw.find(b'"tokens"', at + 8)
    if j < 0:
        return None
    out = np.empty((n - j) // 2 + 1, np.int64)
    k, end = text_kernels.int_list(np.frombuffer(raw, np.uint8), j, out)
    if k < 0:
        return None
    body = parse_body(raw[:j] + b"[]" + raw[end:])
    if body.get("tokens") != []:  # the key was not the top level's
        return None
    return body, out[:k]


def read_tokens(raw, allowed, field="tokens"):
    """``(body, tokens)`` of a raw request body: the JSON object (its
    fields checked against ``allowed``) and ``body[field]`` as an int64
    array; ``BadRequest`` naming the field otherwise.

    >>> body, t = read_tokens(b'{"tokens": [5, 6, 7], "namespace": "a"}', ("tokens", "namespace"))
    >>> body["namespace"], t.tolist()
    ('a', [5, 6, 7])
    """
    fast = _fast_tokens(raw) if field == "tokens" else None
    if fast is not None:
        check_keys(fast[0], allowed)
        return fast
    body = parse_body(raw)
    check_keys(body, allowed)
    return body, tokens_of(body, field, maybe_bool=has_bool(raw))
