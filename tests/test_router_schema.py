"""The router service's body checks: ``read_tokens``'s fast path (NumPy's
text parser over the list) answers exactly what ``json.loads`` and an
integer check answer, on random and on hand-picked bodies."""

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from radix_soa.service.schema import BadRequest, _fast_tokens, read_tokens

FIELDS = ("tokens", "namespace", "policy", "loads")


def oracle(raw):
    """What the body means: ("ok", tokens, rest) or ("bad",)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return ("bad",)
    if not isinstance(body, dict) or set(body) - set(FIELDS) or "tokens" not in body:
        return ("bad",)
    t = body["tokens"]
    if not isinstance(t, list) or not all(type(x) is int and -2**63 <= x < 2**63 for x in t):
        return ("bad",)
    return ("ok", t, {k: v for k, v in body.items() if k != "tokens"})


def answer(raw):
    try:
        body, t = read_tokens(raw, FIELDS)
    except BadRequest:
        return ("bad",)
    assert t.dtype == np.int64 and t.ndim == 1
    return ("ok", t.tolist(), {k: v for k, v in body.items() if k != "tokens"})


ints = st.one_of(st.integers(0, 2**20), st.integers(-2**63, 2**63 - 1),
                 st.integers(2**63, 2**70), st.just(0))
values = st.one_of(ints, st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
                   st.none(), st.text(max_size=3))


@settings(max_examples=400, deadline=None)
@given(toks=st.lists(st.one_of(ints, values), max_size=20), sep=st.sampled_from([",", ", ", " , ", ",\n"]),
       ns=st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=8)),
       order=st.booleans(), nested=st.booleans())
def test_fast_path_answers_as_json_does(toks, sep, ns, order, nested):
    items = "[" + sep.join(json.dumps(x) for x in toks) + "]"
    parts = [f'"tokens": {items}', f'"namespace": {json.dumps(ns)}']
    if nested:
        parts.append('"loads": {"w0": {"tokens": 3}}')
    raw = ("{" + ", ".join(parts if order else parts[::-1]) + "}").encode()
    assert answer(raw) == oracle(raw)


@pytest.mark.parametrize("raw", [
    b'{"tokens": [1, 2, 3]}', b'{"tokens":[1,2,3]}', b'{"tokens": [01, 2]}',
    b'{"tokens": [1, 2,]}', b'{"tokens": [1,, 2]}', b'{"tokens": [ ]}', b'{"tokens": []}',
    b'{"tokens": [-]}', b'{"tokens": [1 2]}', b'{"tokens": [0, 0]}',
    b'{"tokens": [9223372036854775807]}', b'{"tokens": [9223372036854775808]}',
    b'{"tokens": [99999999999999999999]}', b'{"tokens": [-1, 5]}',
    b'{"namespace": "tokens", "tokens": [4]}', b'{"namespace": {"tokens": [1]}, "tokens": [2]}',
    b'{"namespace": {"tokens": [1]}}', b'{"tokens": [1], "tokens": [2]}',
    b'{"tokens": [1]', b'{"tokens" : [7 , 8]} ', b'{"tokens": [1]} x', b'{"tokens": [1e3]}',
    b'{"tokens": [1.0]}', b'{"namespace": "a\\"tokens\\": [1]", "tokens": [3]}',
    b'{"loads": {"w0": {"tokens": [1]}}, "tokens": [3]}', b'{"loads": {"tokens": 4}, "tokens": [3]}',
    b'{"a": "\\"tokens": [1]}', b'{"loads": {"w0": {"tokens": 2}}}',
])
def test_hand_picked_bodies(raw):
    assert answer(raw) == oracle(raw)


def test_the_fast_path_is_taken_for_an_ordinary_body():
    raw = json.dumps({"tokens": list(range(1, 500)), "namespace": "x"}).encode()
    body, t = _fast_tokens(raw)
    assert t.tolist() == list(range(1, 500)) and body == {"tokens": [], "namespace": "x"}


def test_the_fast_path_reads_a_route_that_carries_loads():
    raw = json.dumps({"tokens": [3, 4, 5], "loads": {"w0": {"requests": 2, "tokens": 900}}}).encode()
    body, t = _fast_tokens(raw)
    assert t.tolist() == [3, 4, 5] and body["loads"] == {"w0": {"requests": 2, "tokens": 900}}
