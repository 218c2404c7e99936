"""Tests for radix_soa.studies.traces: unit tests on tiny files written to tmp_path,
plus checks against the real traces in ../shared/data/traces (skipped when
that directory is absent)."""

import gzip
import io
import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

import data_paths  # $RADIX_SOA_TRACES, else ../shared/data/traces

from radix_soa.studies.traces import (
    FORMATS,
    Trace,
    TraceFormatError,
    load_kvcache_tester,
    load_mooncake,
    load_token_jsonl,
    detect_format,
    load_trace,
)

DATA = data_paths.TRACES
MOONCAKE = DATA / "mooncake-fast25"
KV = DATA / "kv-cache-tester-claude-code"


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------

def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def mc(ts=0, n_in=600, n_out=5, ids=(0, 1), **extra):
    d = {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": list(ids)}
    d.update(extra)
    return json.dumps(d)


def assert_line_error(excinfo, path, line):
    err = excinfo.value
    msg = str(err)
    assert path.name in msg, msg
    assert f"line {line}" in msg, msg
    assert err.line == line
    assert err.path == str(path)


def prefix_hit_rate(trace):
    """Unbounded-cache block hit rate: a request hits the leading run of its
    ids already seen (ids are prefix-chained), keyed per namespace."""
    flat = trace.flat.tolist()
    offs = trace.offsets.tolist()
    ns = trace.namespace.tolist()
    seen = set()
    hits = 0
    for i in range(len(trace)):
        seq = [(ns[i], x) for x in flat[offs[i]:offs[i + 1]]]
        k = 0
        while k < len(seq) and seq[k] in seen:
            k += 1
        hits += k
        seen.update(seq)
    return hits / len(flat)


# ----------------------------------------------------------------------------
# Trace container
# ----------------------------------------------------------------------------

def test_trace_basics():
    t = Trace.from_sequences([[1, 2, 3], [1, 2], [7]], name="x", output_tokens=[1, 2, 3])
    assert len(t) == 3 and t.num_blocks == 6
    assert t.flat.dtype == np.int64 and t.offsets.dtype == np.int64
    assert t.offsets.tolist() == [0, 3, 5, 6]
    assert t[0].tolist() == [1, 2, 3] and t[-1].tolist() == [7]
    assert t[np.int64(1)].tolist() == [1, 2]
    assert np.shares_memory(t[1], t.flat)
    seqs = t.sequences()
    assert [s.tolist() for s in seqs] == [[1, 2, 3], [1, 2], [7]]
    assert all(np.shares_memory(s, t.flat) for s in seqs)
    assert [s.tolist() for s in t] == [[1, 2, 3], [1, 2], [7]]
    with pytest.raises(IndexError):
        t[3]
    with pytest.raises(IndexError):
        t[-4]
    with pytest.raises(TypeError):
        t[1.0]
    s = t.summary()
    assert s["requests"] == 3 and s["total_blocks"] == 6 and s["unique_ids"] == 4
    assert s["avg_input_tokens"] == 2.0 and s["avg_output_tokens"] == 2.0
    assert "requests=3" in repr(t)


def test_trace_unique_ids_respects_namespaces():
    t = Trace.from_sequences([[1, 2], [1, 2], [1, 3]], namespace=[0, 1, 0])
    assert t.unique_ids() == 5
    assert t.summary()["namespaces"] == 2


def test_trace_empty_and_invalid():
    t = Trace.from_sequences([])
    assert len(t) == 0 and t.sequences() == [] and t.summary()["unique_ids"] == 0
    good = dict(name="x", flat=[1, 2], offsets=[0, 1, 2], timestamps=[0.0, 1.0],
                input_tokens=[1, 1], output_tokens=[0, 0], namespace=[0, 0], block_size=1)
    Trace(**good)
    for field, bad in [("offsets", [1, 2, 2]), ("offsets", [0, 2, 1]), ("offsets", [0, 1]),
                       ("timestamps", [1.0, 0.0]), ("namespace", [0]), ("block_size", 0),
                       ("flat", [1.5, 2.0])]:
        with pytest.raises((ValueError, TypeError)):
            Trace(**{**good, field: bad})


def test_error_pickles_and_is_valueerror():
    e = TraceFormatError("f.json", "boom", request="requests[1].requests[0]")
    assert isinstance(e, ValueError)
    e2 = pickle.loads(pickle.dumps(e))
    assert str(e2) == str(e) == "f.json: requests[1].requests[0]: boom"
    assert e2.request == "requests[1].requests[0]" and e2.line is None


# ----------------------------------------------------------------------------
# Mooncake
# ----------------------------------------------------------------------------

def test_mooncake_small(tmp_path):
    p = write_lines(tmp_path / "mc.jsonl", [
        mc(0, 600, 5, [0, 1]),
        mc(1500, 1024, 7, [0, 2]),
        mc(1500, 1, 0, [9], extra_field="ignored"),
    ])
    t = load_mooncake(p)
    assert t.name == "mc" and len(t) == 3 and t.block_size == 512
    assert [s.tolist() for s in t.sequences()] == [[0, 1], [0, 2], [9]]
    assert t.timestamps.tolist() == [0.0, 1.5, 1.5]
    assert t.input_tokens.tolist() == [600, 1024, 1]
    assert t.output_tokens.tolist() == [5, 7, 0]
    assert t.namespace.tolist() == [0, 0, 0]
    assert t.timestamps.dtype == np.float64 and t.input_tokens.dtype == np.int64
    assert load_trace(str(p), "mooncake").flat.tolist() == t.flat.tolist()


def test_mooncake_int64_bounds_accepted(tmp_path):
    p = write_lines(tmp_path / "b.jsonl", [mc(ids=[-(2**63), 2**63 - 1])])
    assert load_mooncake(p).flat.tolist() == [-(2**63), 2**63 - 1]


MOONCAKE_BAD = {
    "bad_json": '{"timestamp": 0, "input_length": 600,',
    "not_object": "[0, 1]",
    "missing_timestamp": json.dumps({"input_length": 600, "output_length": 1, "hash_ids": [0, 1]}),
    "missing_hash_ids": json.dumps({"timestamp": 0, "input_length": 600, "output_length": 1}),
    "missing_input_length": json.dumps({"timestamp": 0, "output_length": 1, "hash_ids": [0, 1]}),
    "missing_output_length": json.dumps({"timestamp": 0, "input_length": 600, "hash_ids": [0, 1]}),
    "string_timestamp": mc(ts="5"),
    "nan_timestamp": '{"timestamp": NaN, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}',
    "negative_timestamp": mc(ts=-1),
    "float_input_length": mc(n_in=600.0),
    "bool_output_length": mc(n_out=True),
    "negative_input_length": mc(n_in=-600),
    "negative_output_length": mc(n_out=-1),
    "hash_ids_not_list": mc(ids=[]).replace("[]", '"0,1"'),
    "float_id": mc(ids=[0, 1.0]),
    "string_id": mc(ids=[0, "1"]),
    "bool_id": mc(ids=[0, True]),
    "id_too_big": mc(ids=[0, 2**63]),
    "id_too_small": mc(ids=[0, -(2**63) - 1]),
    "len_mismatch_short": mc(n_in=1025, ids=[0, 1]),
    "len_mismatch_long": mc(n_in=512, ids=[0, 1]),
    "empty_hash_ids": mc(n_in=0, ids=[]),
    "decreasing_timestamp": mc(ts=5),
    "blank_line": "   ",
    "output_length_1e23": mc(n_out=10**23),
    "timestamp_of_400_digits": mc(ts=10**400),
}


@pytest.mark.parametrize("kind", sorted(MOONCAKE_BAD))
def test_mooncake_malformed(tmp_path, kind):
    p = write_lines(tmp_path / f"mc_{kind}.jsonl",
                    [mc(0), mc(10, 600, 5, [0, 2]), MOONCAKE_BAD[kind], mc(20)])
    if kind == "decreasing_timestamp":
        p = write_lines(p, [mc(0), mc(10, 600, 5, [0, 2]), mc(5)])
    with pytest.raises(TraceFormatError) as ei:
        load_mooncake(p)
    assert_line_error(ei, p, 3)


def test_mooncake_empty_and_missing(tmp_path):
    for content in ("", "\n", "  \n"):
        p = tmp_path / "empty.jsonl"
        p.write_text(content)
        with pytest.raises(TraceFormatError, match="empty.jsonl"):
            load_mooncake(p)
    with pytest.raises(FileNotFoundError):
        load_mooncake(tmp_path / "nope.jsonl")


def test_mooncake_non_utf8(tmp_path):
    p = tmp_path / "bin.jsonl"
    p.write_bytes(mc().encode() + b"\n\xff\xfe\n")
    with pytest.raises(TraceFormatError) as ei:
        load_mooncake(p)
    assert_line_error(ei, p, 2)


# ----------------------------------------------------------------------------
# kv-cache-tester
# ----------------------------------------------------------------------------

def kv_req(t, ids, n_in=None, n_out=3, typ="n", **extra):
    d = {"t": t, "type": typ, "in": 64 * len(ids) if n_in is None else n_in, "out": n_out,
         "hash_ids": list(ids)}
    d.update(extra)
    return d


def kv_doc(requests, block_size=64, **extra):
    d = {"id": "x", "block_size": block_size, "hash_id_scope": "local", "requests": requests}
    d.update(extra)
    return d


def write_json(path, obj, indent=None):
    path.write_text(json.dumps(obj, indent=indent))
    return path


def test_kvcache_subagents_flattened_and_ordered(tmp_path):
    doc = kv_doc([
        kv_req(0.0, [1, 2], model="m", api_time=1.0),
        {"t": 10.5, "type": "subagent", "agent_id": "a1", "requests": [
            kv_req(0.0, [50]),
            kv_req(2.0, [50, 51]),
            {"t": 3.0, "type": "subagent", "requests": [kv_req(1.0, [70])]},
            kv_req(30.0, [50, 51, 52]),
        ]},
        kv_req(12.5, [1, 2, 3], typ="s", ttft=0.5),   # ties with the nested t=2.0
        kv_req(20.0, [1, 2, 3, 4]),
    ])
    t = load_kvcache_tester(write_json(tmp_path / "c.json", doc))
    assert t.name == "c" and t.block_size == 64
    assert t.timestamps.tolist() == [0.0, 10.5, 12.5, 12.5, 14.5, 20.0, 40.5]
    # stable: at the 12.5 tie the nested request (earlier in the document) comes first
    assert [s.tolist() for s in t.sequences()] == [
        [1, 2], [50], [50, 51], [1, 2, 3], [70], [1, 2, 3, 4], [50, 51, 52]]
    assert t.namespace.tolist() == [0] * 7
    assert t.input_tokens.tolist() == [64 * len(s) for s in t.sequences()]


def test_kvcache_multiple_files_namespaces(tmp_path):
    d = tmp_path / "dir"
    d.mkdir()
    write_json(d / "b.json", kv_doc([kv_req(0.0, [1, 2]), kv_req(5.0, [1, 2, 3])]))
    write_json(d / "a.json", kv_doc([kv_req(1.0, [1]), kv_req(7.0, [1, 4])]))
    (d / "notes.txt").write_text("not a trace")
    t = load_kvcache_tester(d)
    assert t.name == "dir"
    # sorted file order: a.json -> namespace 0, b.json -> namespace 1; interleaved by time
    assert t.timestamps.tolist() == [0.0, 1.0, 5.0, 7.0]
    assert t.namespace.tolist() == [1, 0, 1, 0]
    assert [s.tolist() for s in t.sequences()] == [[1, 2], [1], [1, 2, 3], [1, 4]]
    # an explicit list keeps the given order
    t2 = load_kvcache_tester([d / "b.json", d / "a.json"])
    assert t2.namespace.tolist() == [0, 1, 0, 1]
    assert t2.name == "b+a"
    assert t2.summary()["unique_ids"] == 5
    assert load_trace(d, "kvcache-tester").namespace.tolist() == [1, 0, 1, 0]


def test_kvcache_file_level_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_kvcache_tester(tmp_path / "missing.json")
    with pytest.raises(FileNotFoundError):
        load_kvcache_tester([tmp_path / "missing.json"])
    empty_dir = tmp_path / "emptydir"
    empty_dir.mkdir()
    with pytest.raises(TraceFormatError, match="emptydir"):
        load_kvcache_tester(empty_dir)
    with pytest.raises(ValueError):
        load_kvcache_tester([])
    for content in ("", "  \n"):
        p = tmp_path / "empty.json"
        p.write_text(content)
        with pytest.raises(TraceFormatError, match="empty.json"):
            load_kvcache_tester(p)
    a = write_json(tmp_path / "a64.json", kv_doc([kv_req(0.0, [1])]))
    b = write_json(tmp_path / "b32.json", kv_doc([kv_req(0.0, [1], n_in=32)], block_size=32))
    with pytest.raises(TraceFormatError, match="b32.json.*block_size"):
        load_kvcache_tester([a, b])


def test_kvcache_invalid_json_names_line(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text('{\n  "block_size": 64,\n  "requests": [\n    {"t": 0.0,, }\n  ]\n}\n')
    with pytest.raises(TraceFormatError) as ei:
        load_kvcache_tester(p)
    assert_line_error(ei, p, 4)


KV_TOP_BAD = {
    "top_not_object": [kv_req(0.0, [1])],
    "missing_block_size": {"requests": [kv_req(0.0, [1])]},
    "missing_requests": {"block_size": 64},
    "requests_not_list": {"block_size": 64, "requests": {"t": 0}},
    "bad_block_size": kv_doc([kv_req(0.0, [1])], block_size=0),
    "float_block_size": kv_doc([kv_req(0.0, [1])], block_size=64.0),
    "global_scope": {**kv_doc([kv_req(0.0, [1])]), "hash_id_scope": "global"},
    "no_requests": kv_doc([]),
    "only_empty_subagent": kv_doc([{"t": 0.0, "type": "subagent", "requests": []}]),
    "block_size_1e23": kv_doc([kv_req(0.0, [1])], block_size=10**23),
}


@pytest.mark.parametrize("kind", sorted(KV_TOP_BAD))
def test_kvcache_top_level_malformed(tmp_path, kind):
    p = write_json(tmp_path / f"kv_{kind}.json", KV_TOP_BAD[kind])
    with pytest.raises(TraceFormatError, match=f"kv_{kind}.json"):
        load_kvcache_tester(p)


def _without(d, key):
    return {k: v for k, v in d.items() if k != key}


KV_REQ_BAD = {
    "not_object": [0, 1],
    "missing_t": _without(kv_req(6.0, [1, 2]), "t"),
    "missing_type": _without(kv_req(6.0, [1, 2]), "type"),
    "missing_in": _without(kv_req(6.0, [1, 2]), "in"),
    "missing_out": _without(kv_req(6.0, [1, 2]), "out"),
    "missing_hash_ids": _without(kv_req(6.0, [1, 2]), "hash_ids"),
    "unknown_type": kv_req(6.0, [1, 2], typ="x"),
    "string_t": kv_req("6", [1, 2]),
    "negative_t": kv_req(-1.0, [1, 2]),
    "decreasing_t": kv_req(4.0, [1, 2]),
    "negative_in": kv_req(6.0, [1, 2], n_in=-128),
    "float_out": kv_req(6.0, [1, 2], n_out=3.0),
    "negative_out": kv_req(6.0, [1, 2], n_out=-3),
    "empty_hash_ids": kv_req(6.0, [], n_in=10),
    "float_id": kv_req(6.0, [1, 2.5]),
    "null_id": kv_req(6.0, [1, None]),
    "id_too_big": kv_req(6.0, [1, 2**64]),
    "hash_ids_not_list": {**kv_req(6.0, [1]), "hash_ids": 7},
    "subagent_without_requests": {"t": 6.0, "type": "subagent"},
    "in_1e23": kv_req(6.0, [1, 2], n_in=10**23),
    "t_of_400_digits": kv_req(10**400, [1, 2]),
}


@pytest.mark.parametrize("kind", sorted(KV_REQ_BAD))
def test_kvcache_request_malformed(tmp_path, kind):
    doc = kv_doc([kv_req(0.0, [1]), kv_req(5.0, [1, 2]), KV_REQ_BAD[kind], kv_req(9.0, [1, 3])])
    p = write_json(tmp_path / f"kv_{kind}.json", doc)
    with pytest.raises(TraceFormatError) as ei:
        load_kvcache_tester(p)
    msg = str(ei.value)
    assert p.name in msg and "requests[2]" in msg, msg
    assert ei.value.request == "requests[2]"


@pytest.mark.parametrize("kind", ["decreasing_t", "float_id", "missing_hash_ids", "empty_hash_ids"])
def test_kvcache_nested_error_path(tmp_path, kind):
    bad = KV_REQ_BAD[kind]
    nested = [kv_req(0.0, [50]), kv_req(5.0, [50, 51]), bad]
    doc = kv_doc([
        kv_req(0.0, [1]),
        kv_req(1.0, [1, 2]),
        kv_req(2.0, [1, 2, 3]),
        {"t": 3.0, "type": "subagent", "requests": [
            kv_req(0.0, [60]),
            {"t": 1.0, "type": "subagent", "requests": nested}]},
    ])
    p = write_json(tmp_path / "nested.json", doc, indent=1)
    with pytest.raises(TraceFormatError) as ei:
        load_kvcache_tester(p)
    assert ei.value.request == "requests[3].requests[1].requests[2]"
    assert "nested.json: requests[3].requests[1].requests[2]: " in str(ei.value)


def test_kvcache_error_in_second_file_names_it(tmp_path):
    a = write_json(tmp_path / "good.json", kv_doc([kv_req(0.0, [1])]))
    b = write_json(tmp_path / "bad.json", kv_doc([kv_req(0.0, [1]), kv_req(1.0, [])]))
    with pytest.raises(TraceFormatError, match=r"bad\.json: requests\[1\]"):
        load_kvcache_tester([a, b])


# ----------------------------------------------------------------------------
# token JSONL
# ----------------------------------------------------------------------------

def test_tokens_lists_and_objects(tmp_path):
    p = write_lines(tmp_path / "toks.jsonl", [
        "[1, 2, 3]",
        '{"tokens": [1, 2, 4], "output_length": 9}',
        "[5]",
    ])
    t = load_token_jsonl(p)
    assert t.name == "toks" and t.block_size == 1
    assert [s.tolist() for s in t.sequences()] == [[1, 2, 3], [1, 2, 4], [5]]
    assert t.timestamps.tolist() == [0.0, 0.0, 0.0]
    assert t.input_tokens.tolist() == [3, 3, 1]
    assert t.output_tokens.tolist() == [0, 9, 0]
    assert t.namespace.tolist() == [0, 0, 0]
    assert load_trace(p, "tokens").flat.tolist() == t.flat.tolist()


def test_tokens_timestamps(tmp_path):
    p = write_lines(tmp_path / "ts.jsonl", [
        '{"tokens": [1], "timestamp": 0}',
        '{"tokens": [1, 2], "timestamp": 0.25}',
        '{"tokens": [1, 2], "timestamp": 0.25}',
    ])
    assert load_token_jsonl(p).timestamps.tolist() == [0.0, 0.25, 0.25]


TOKENS_BAD = {
    "bad_json": "[1, 2",
    "scalar": "7",
    "string": '"abc"',
    "empty_list": "[]",
    "float_token": "[1, 2.0]",
    "bool_token": "[1, false]",
    "string_token": '[1, "2"]',
    "huge_token": f"[1, {2**63}]",
    "nested_list": "[[1, 2]]",
    "missing_tokens": '{"output_length": 3}',
    "tokens_not_list": '{"tokens": "1 2 3"}',
    "unknown_key": '{"tokens": [1], "timestamps": 3}',
    "negative_output": '{"tokens": [1], "output_length": -1}',
    "float_output": '{"tokens": [1], "output_length": 1.5}',
    "string_timestamp": '{"tokens": [1], "timestamp": "now"}',
    "output_1e23": '{"tokens": [1], "output_length": 100000000000000000000000}',
    "timestamp_of_400_digits": '{"tokens": [1], "timestamp": 1%s}' % ("0" * 400),
    "blank": "",
}


@pytest.mark.parametrize("kind", sorted(TOKENS_BAD))
def test_tokens_malformed(tmp_path, kind):
    p = write_lines(tmp_path / f"tok_{kind}.jsonl", ["[1, 2]", TOKENS_BAD[kind], "[3]"])
    with pytest.raises(TraceFormatError) as ei:
        load_token_jsonl(p)
    assert_line_error(ei, p, 2)


@pytest.mark.parametrize("lines", [
    ['{"tokens": [1], "timestamp": 1.0}', '{"tokens": [1], "timestamp": 0.5}'],   # decreasing
    ['{"tokens": [1], "timestamp": 1.0}', "[1, 2]"],                               # ts then none
    ["[1, 2]", '{"tokens": [1], "timestamp": 1.0}'],                               # none then ts
    ['{"tokens": [1], "timestamp": 1.0}', '{"tokens": [1], "timestamp": -2.0}'],   # negative
])
def test_tokens_timestamp_rules(tmp_path, lines):
    p = write_lines(tmp_path / "tsbad.jsonl", lines)
    with pytest.raises(TraceFormatError) as ei:
        load_token_jsonl(p)
    assert_line_error(ei, p, 2)


def test_tokens_empty_and_missing(tmp_path):
    p = tmp_path / "e.jsonl"
    p.write_text("")
    with pytest.raises(TraceFormatError, match="e.jsonl"):
        load_token_jsonl(p)
    with pytest.raises(FileNotFoundError):
        load_token_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "missing.jsonl", "tokens")


def test_load_trace_unknown_format(tmp_path):
    p = write_lines(tmp_path / "x.jsonl", ["[1]"])
    assert set(FORMATS) == {"mooncake", "kvcache-tester", "tokens"}
    for bad in ("csv", "Mooncake", ""):
        with pytest.raises(ValueError, match="unknown trace format"):
            load_trace(p, bad)
    assert load_trace(p, None)[0].tolist() == [1]  # None: detected from the content


# ----------------------------------------------------------------------------
# compressed files, standard input, file objects, format detection
# ----------------------------------------------------------------------------

MC_LINES = [mc(0, 600, 5, (0, 1)), mc(10, 1100, 7, (0, 2, 3))]


def compress(kind, data):
    if kind == "gzip":
        return gzip.compress(data)
    zstd = pytest.importorskip("zstandard", reason="the zstandard module is not installed")
    return zstd.ZstdCompressor().compress(data)


@pytest.mark.parametrize("kind, suffix", [("gzip", ".gz"), ("zstd", ".zst")])
def test_compressed_traces_load_like_plain_ones(tmp_path, kind, suffix):
    plain = write_lines(tmp_path / "conv.jsonl", MC_LINES)
    packed = tmp_path / f"conv.jsonl{suffix}"
    packed.write_bytes(compress(kind, plain.read_bytes()))
    a, b = load_mooncake(plain), load_trace(packed)  # format detected through the compression
    assert b.name == "conv" and a.flat.tolist() == b.flat.tolist() == [0, 1, 0, 2, 3]
    assert b.input_tokens.tolist() == [600, 1100]
    # the content decides, not the name: a gzip file without .gz
    odd = tmp_path / "odd.jsonl"
    odd.write_bytes(compress(kind, plain.read_bytes()))
    assert load_mooncake(odd).flat.tolist() == a.flat.tolist()
    # a kv-cache-tester directory of compressed files
    d = tmp_path / "dir"
    d.mkdir()
    (d / f"a.json{suffix}").write_bytes(compress(kind, json.dumps(
        kv_doc([kv_req(0.0, [1, 2]), kv_req(1.0, [1, 2, 3])])).encode()))
    assert load_trace(d).flat.tolist() == [1, 2, 1, 2, 3]


def test_zstd_without_zstandard_is_a_clear_error(tmp_path, monkeypatch):
    p = tmp_path / "t.jsonl.zst"
    p.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 20)
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import fails
    with pytest.raises(ValueError, match=r"zstd-compressed: reading it needs the 'zstandard'"):
        load_mooncake(p)


def test_corrupt_gzip_names_the_file(tmp_path):
    p = tmp_path / "bad.jsonl.gz"
    p.write_bytes(gzip.compress(("\n".join(MC_LINES) + "\n").encode())[:-12])  # truncated
    with pytest.raises(ValueError, match=r"bad.jsonl.gz: corrupt gzip data"):
        load_mooncake(p)


def test_standard_input_and_file_objects(monkeypatch):
    data = ("\n".join(MC_LINES) + "\n").encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(data))))
    t = load_trace("-")  # read once, detected, decompressed
    assert t.name == "stdin" and t.flat.tolist() == [0, 1, 0, 2, 3]
    assert load_token_jsonl(io.BytesIO(b"[5, 6]\n[5]\n")).flat.tolist() == [5, 6, 5]
    with pytest.raises(TypeError, match="binary mode"):
        load_token_jsonl(io.StringIO("[5, 6]\n"))
    with pytest.raises(TypeError, match="a trace source must be"):
        load_token_jsonl(42)


def test_formats_are_detected_from_the_content(tmp_path):
    mooncake = write_lines(tmp_path / "a.txt", MC_LINES)
    tokens = write_lines(tmp_path / "b.txt", ['{"tokens": [1, 2]}', '{"tokens": [1]}'])
    lists = write_lines(tmp_path / "c.txt", ["[1, 2]"])
    kv = tmp_path / "d.txt"
    kv.write_text(json.dumps(kv_doc([kv_req(0.0, [1, 2])]), indent=2))  # pretty-printed
    long_line = write_lines(tmp_path / "e.txt", [mc(0, 512 * 40000, 1, range(40000))])
    assert [detect_format(p) for p in (mooncake, tokens, lists, kv, long_line, tmp_path)] == \
        ["mooncake", "tokens", "tokens", "kvcache-tester", "mooncake", "kvcache-tester"]
    for text, seen in [("hello\n", "'hello"), ('{"x": 1}\n', "fields 'x'"), ("", "empty")]:
        p = tmp_path / "u.txt"
        p.write_text(text)
        with pytest.raises(TraceFormatError, match="cannot tell the trace format") as e:
            load_trace(p)
        assert seen in str(e.value)


def test_a_wrong_format_says_which_it_looks_like(tmp_path):
    mooncake = write_lines(tmp_path / "conv.jsonl", MC_LINES)
    with pytest.raises(TraceFormatError) as e:
        load_trace(mooncake, "kvcache-tester")
    msg = str(e.value)
    assert "looks like a mooncake trace, not kvcache-tester" in msg and "Extra data" not in msg
    kv = tmp_path / "k.json"
    kv.write_text(json.dumps(kv_doc([kv_req(0.0, [1, 2])])))
    with pytest.raises(TraceFormatError, match="looks like a kvcache-tester trace, not tokens"):
        load_trace(kv, "tokens")
    # a genuinely broken file of the named format keeps its own message
    bad = write_lines(tmp_path / "bad.jsonl", [MC_LINES[0], mc(5, 600, 5, (1.5, 2))])
    with pytest.raises(TraceFormatError, match="line 2: hash_ids\\[0\\] = 1.5"):
        load_trace(bad, "mooncake")


# ----------------------------------------------------------------------------
# real data (../shared/data/traces)
# ----------------------------------------------------------------------------

needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"trace data not found at {DATA}")


@pytest.fixture(scope="module")
def mooncake_traces():
    if not MOONCAKE.is_dir():
        pytest.skip(f"Mooncake traces not found at {MOONCAKE}")
    return {name: load_mooncake(MOONCAKE / f"{name}_trace.jsonl")
            for name in ("conversation", "synthetic")}


@pytest.fixture(scope="module")
def kv_files():
    if not KV.is_dir():
        pytest.skip(f"kv-cache-tester traces not found at {KV}")
    return sorted(KV.glob("*.json"))


# Mooncake FAST'25 Table 2: requests, avg input tokens, avg output tokens;
# plus the unbounded-cache block-level prefix hit rate.
TABLE2 = {"conversation": (12_031, 12_035, 343, 0.37), "synthetic": (3_993, 15_325, 149, 0.64)}


@needs_data
@pytest.mark.parametrize("name", sorted(TABLE2))
def test_mooncake_table2(mooncake_traces, name):
    t = mooncake_traces[name]
    n, avg_in, avg_out, _ = TABLE2[name]
    s = t.summary()
    print(f"{name}: {s}")
    assert s["requests"] == len(t) == n
    assert round(s["avg_input_tokens"]) == avg_in
    assert round(s["avg_output_tokens"]) == avg_out
    assert t.block_size == 512 and np.all(t.namespace == 0)
    blocks = np.diff(t.offsets)
    assert np.array_equal(blocks, -(-t.input_tokens // 512))
    assert t.timestamps[0] == 0.0 and np.all(np.diff(t.timestamps) >= 0)


@needs_data
@pytest.mark.parametrize("name", sorted(TABLE2))
def test_mooncake_unbounded_hit_rate(mooncake_traces, name):
    rate = prefix_hit_rate(mooncake_traces[name])
    print(f"{name}: unbounded-cache block hit rate = {rate:.4f}")
    assert abs(rate - TABLE2[name][3]) <= 0.01


@needs_data
def test_kvcache_every_file_loads(kv_files):
    assert len(kv_files) == 12
    for f in kv_files:
        t = load_kvcache_tester(f)
        doc = json.loads(f.read_bytes())
        totals = doc["totals"]["combined_tokens"]
        assert t.name == f.stem and t.block_size == 64
        # parent + sub-agent requests are all there: token totals match the file's own totals
        assert int(t.input_tokens.sum()) == totals["input"], f.name
        assert int(t.output_tokens.sum()) == totals["output"], f.name
        assert np.array_equal(np.diff(t.offsets), t.input_tokens // 64), f.name
        assert np.all(np.diff(t.timestamps) >= 0)


@needs_data
def test_kvcache_small_file(kv_files):
    path = KV / "trace_0504.json"
    t = load_kvcache_tester(path)
    doc = json.loads(path.read_bytes())
    assert len(t) == 3
    assert t.timestamps.tolist() == [r["t"] for r in doc["requests"]]
    assert [s.tolist() for s in t.sequences()] == [r["hash_ids"] for r in doc["requests"]]
    assert t.input_tokens.tolist() == [r["in"] for r in doc["requests"]]


@needs_data
def test_kvcache_subagents_included(kv_files):
    doc = json.loads((KV / "trace_0295.json").read_bytes())
    subs = [r for r in doc["requests"] if r["type"] == "subagent"]
    assert len(subs) == 8 == doc["totals"]["subagent_count"]
    n_parent = sum(r["type"] != "subagent" for r in doc["requests"])
    n_nested = sum(len(s["requests"]) for s in subs)
    t = load_kvcache_tester(KV / "trace_0295.json")
    assert len(t) == n_parent + n_nested == 416
    # nested request times are relative to the sub-agent's start
    ts = set(t.timestamps.tolist())
    for s in subs:
        for r in s["requests"]:
            assert s["t"] + r["t"] in ts
    # every nested request's ids appear, at its absolute time
    first = subs[0]["requests"][0]
    i = int(np.searchsorted(t.timestamps, subs[0]["t"] + first["t"]))
    assert t[i].tolist() == first["hash_ids"]


@pytest.mark.slow
@needs_data
def test_kvcache_directory_namespaces(kv_files):
    t = load_kvcache_tester(KV)
    assert t.name == KV.name
    singles = [load_kvcache_tester(f) for f in kv_files]
    assert len(t) == sum(len(s) for s in singles)
    assert np.unique(t.namespace).tolist() == list(range(len(kv_files)))
    lengths = np.diff(t.offsets)
    block_ns = np.repeat(t.namespace, lengths)
    for j, single in enumerate(singles):
        mask = t.namespace == j
        assert int(mask.sum()) == len(single), kv_files[j].name
        # the per-namespace request stream equals the single-file load (stable merge)
        assert np.array_equal(lengths[mask], np.diff(single.offsets)), kv_files[j].name
        assert np.array_equal(t.flat[block_ns == j], single.flat), kv_files[j].name
        assert np.array_equal(t.timestamps[mask], single.timestamps), kv_files[j].name
    assert t.summary()["unique_ids"] == sum(x.summary()["unique_ids"] for x in singles)


@needs_data
def test_kvcache_biggest_file_loads_whole(kv_files):
    # its load time is a benchmark (asv_bench), not a unit test's business
    t = load_kvcache_tester(KV / "trace_0178.json")
    assert t.num_blocks == 847_377 and len(t) == 219
