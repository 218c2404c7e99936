"""The router service over real HTTP on 127.0.0.1: every endpoint, each
policy's pick against the plain rule it is defined by (and prefix_hash
against the compiled cluster study), 400 on every bad body, the metrics
as Prometheus text, the vLLM subscriber feeding it, and the command line."""

import http.client
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("uvicorn", reason="the router extra (pip install -e '.[router]')")

import radix_soa as rs  # noqa: E402
from radix_soa.router_index import rules  # noqa: E402
from radix_soa.cli import main  # noqa: E402
from radix_soa.service import RouterService  # noqa: E402
from radix_soa.service.schema import LOAD_FIELDS  # noqa: E402

PAGE = 4
NAMES = ["w0", "w1", "w2", "w3"]


def call(svc, method, path, body=None, raw=None):
    c = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=20)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body))
        c.request(method, path, data, {"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode()
        ctype = r.getheader("Content-Type", "")
    finally:
        c.close()
    return r.status, (json.loads(text) if ctype.startswith("application/json") else text)


@pytest.fixture
def cluster():
    """Four worker caches with shared and private prefixes, their events
    posted to a running service; yields (service, caches)."""
    rng = np.random.default_rng(7)
    caches = [rs.PrefixCache(page_size=PAGE, events=True, values=False) for _ in NAMES]
    base = [rng.integers(0, 50, 64).tolist() for _ in range(3)]
    for i, pc in enumerate(caches):
        for _ in range(6):
            b = base[rng.integers(0, 3)]
            cut = int(rng.integers(0, 64))
            pc.insert(b[:cut] + rng.integers(0, 50, int(rng.integers(0, 24))).tolist())
    ix = rs.RouterIndex(page_size=PAGE, workers=NAMES, strict=False)
    svc = RouterService(ix).start("127.0.0.1", 0)
    for name, pc in zip(NAMES, caches):
        st, out = call(svc, "POST", "/events",
                       {"worker": name, "events": [e.to_dict() for e in pc.take_events()]})
        assert st == 200, out
    try:
        yield svc, caches, base, rng
    finally:
        svc.stop()


def queries(base, rng, n):
    out = []
    for _ in range(n):
        b = base[rng.integers(0, 3)]
        out.append(b[:int(rng.integers(1, 64))] + rng.integers(0, 50, int(rng.integers(0, 8))).tolist())
    return out


def test_overlap_is_each_workers_match_length(cluster):
    svc, caches, base, rng = cluster
    for q in queries(base, rng, 40):
        st, out = call(svc, "POST", "/overlap", {"tokens": q})
        assert st == 200
        assert out["overlap"] == {n: pc.match_length(q) for n, pc in zip(NAMES, caches)}
        assert out["degraded"] == []


@pytest.mark.parametrize("policy", ["cache_aware", "kv_overlap", "least_loaded", "prefix_hash"])
def test_route_picks_what_the_rule_picks(cluster, policy):
    svc, caches, base, rng = cluster
    routed = {n: 0 for n in NAMES}
    turn = 0
    stored = {n: dict.fromkeys(LOAD_FIELDS, 0) for n in NAMES}
    modes = set()
    points = rules.ring_points([rules.ring_key(n) for n in NAMES], 64)
    for k, q in enumerate(queries(base, rng, 60)):
        told = {n: {f: int(rng.integers(0, 60)) for f in stored[n]} for n in NAMES
                if rng.random() < 0.5}
        if k % 3 == 0:  # a stored load (POST /load) beside the loads a route carries
            new = {n: {"requests": int(rng.integers(0, 40)), "active_blocks":
                       int(rng.integers(0, 40))} for n in NAMES if rng.random() < 0.5}
            assert call(svc, "POST", "/load", {"loads": new})[0] == 200
            for n, one in new.items():
                stored[n].update(one)
        body = {"tokens": q, "policy": policy}
        if told:
            body["loads"] = told
        st, out = call(svc, "POST", "/route", body)
        assert st == 200, out
        loads = [{**stored[n], **told.get(n, {})} for n in NAMES]
        ov = [pc.match_length(q) for pc in caches]
        if policy == "cache_aware":
            want, mode = rules.cache_aware_choice(ov, [x["requests"] for x in loads],
                                                  [routed[n] for n in NAMES], len(q))
        elif policy == "kv_overlap":
            want = rules.kv_overlap_choice(ov, [x["prefill_tokens"] for x in loads],
                                           [x["active_blocks"] for x in loads], len(q), PAGE,
                                           math.ceil(len(q) / PAGE), 1.0, turn % 4)
            turn += 1
            mode = "cost"
        elif policy == "least_loaded":
            want, mode = rules.least_loaded_choice([x["requests"] for x in loads]), "load"
        else:
            want = rules.prefix_hash_choice(rules.prefix_key(q, 0, 4 * PAGE), points)
            mode = "hash"
        assert out["worker"] == NAMES[want] and out["mode"] == mode, (k, out)
        assert out["load"] == loads[want] and out["overlap"] == dict(zip(NAMES, ov))
        routed[NAMES[want]] += 1
        modes.add(mode)
    if policy == "cache_aware":
        assert modes == {"hit", "miss", "balance"}
    st, w = call(svc, "GET", "/workers")
    assert {x["id"]: x["routed"] for x in w["workers"]} == routed


def test_prefix_hash_sends_requests_where_the_cluster_study_does():
    """Workers named 0..n-1 have the study's ring: the same pick as the
    compiled replay's prefix hashes on its ring."""
    from radix_soa._kernels.cluster import prefix_hashes
    from radix_soa.studies.cluster import prefix_hash_route, ring_points
    rng = np.random.default_rng(3)
    ix = rs.RouterIndex(page_size=2, workers=[str(i) for i in range(5)])
    svc = RouterService(ix, policy="prefix_hash", prefix_pages=3, vnodes=16).start()
    try:
        seqs = [rng.integers(0, 1000, int(rng.integers(1, 20))) for _ in range(50)]
        got = [int(call(svc, "POST", "/route", {"tokens": s.tolist()})[1]["worker"])
               for s in seqs]
    finally:
        svc.stop()
    flat = np.concatenate(seqs)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    h = np.empty(len(seqs), np.int64)
    prefix_hashes(flat, offsets, np.zeros(len(seqs), np.int64), 6, h)
    assert got == prefix_hash_route(h, *ring_points(5, 16)).tolist()


def test_load_sets_and_adds_all_or_nothing(cluster):
    svc = cluster[0]
    st, out = call(svc, "POST", "/load", {"loads": {"w1": {"requests": 5, "tokens": 700}}})
    assert st == 200 and out["loads"]["w1"] == {"requests": 5, "tokens": 700,
                                                "active_blocks": 0, "prefill_tokens": 0}
    st, out = call(svc, "POST", "/load", {"add": {"w1": {"requests": -2}, "w2": {"requests": 1}}})
    assert st == 200 and out["loads"]["w1"]["requests"] == 3 and out["loads"]["w2"]["requests"] == 1
    st, out = call(svc, "POST", "/load", {"add": {"w2": {"requests": 4}, "w1": {"requests": -4}}})
    assert st == 400 and "add['w1']['requests']" in out["error"]
    assert {x["id"]: x["load"]["requests"] for x in call(svc, "GET", "/workers")[1]["workers"]} \
        == {"w0": 0, "w1": 3, "w2": 1, "w3": 0}


@pytest.mark.parametrize("path, raw, field", [
    ("/route", b"{not json", "not JSON"),
    ("/route", b"[1, 2]", "JSON object"),
    ("/route", b"{}", "tokens is missing"),
    ("/route", b'{"tokens": "1 2 3"}', "tokens must be a list"),
    ("/route", b'{"tokens": [1, 2.5]}', "tokens must be a list of integers"),
    ("/route", b'{"tokens": [1, true]}', "got a boolean"),
    ("/route", b'{"tokens": [1, null]}', "got null"),
    ("/route", b'{"tokens": [[1, 2], [3, 4]]}', "got a list"),
    ("/route", b'{"tokens": [1, 18446744073709551616]}', "out of range"),
    ("/route", b'{"tokens": [1], "namespace": 1.5}', "namespace must be"),
    ("/route", b'{"tokens": [1], "policy": "nearest"}', "policy must be one of"),
    ("/route", b'{"tokens": [1], "loads": {"w9": {"requests": 1}}}', "unknown worker 'w9'"),
    ("/route", b'{"tokens": [1], "loads": {"w0": {"requests": -1}}}', "loads['w0']['requests']"),
    ("/route", b'{"tokens": [1], "loads": {"w0": {"queue": 1}}}', "unknown field 'queue'"),
    ("/route", b'{"tokens": [1], "loads": []}', "loads must be an object"),
    ("/route", b'{"tokens": [1], "extra": 1}', "unknown field 'extra'"),
    ("/overlap", b'{"tokens": {}}', "tokens must be a list"),
    ("/overlap", b'{"batch": [[1], {}]}', "batch[1] must be a list"),
    ("/overlap", b'{"batch": 3}', "batch must be a list"),
    ("/overlap", b'{"batch": [[1]], "policy": "x"}', "unknown field 'policy'"),
    ("/route", b'{"tokens": [1], "lora_name": 3}', "lora_name must be"),
    ("/route", b'{"tokens": [1], "extra_keys": "salt"}', "extra_keys must be"),
    ("/overlap", b'{"tokens": [1], "extra_keys": [{}]}', "extra_keys:"),
    ("/load", b'{}', "give loads"),
    ("/load", b'{"loads": {"w0": {"requests": 1.5}}}', "loads['w0']['requests']"),
    ("/events", b'{"worker": "w0", "events": [{"type": "BlockStored"}]}', "events:"),
    ("/events", b'{"worker": 3, "events": []}', "worker must be"),
    ("/events", b'{"worker": "w0", "events": {}}', "events must be a list"),
    ("/events", b'{"worker": "w0", "events": [], "seq": -1}', "seq must be"),
    ("/route", b'{"tokens": [1, 2], "tokens": "x"}', "tokens must be a list"),
    ("/route", b"\xff\xfe", "not JSON"),
])
def test_bad_bodies_answer_400_naming_the_field_and_change_nothing(cluster, path, raw, field):
    svc, caches, base, rng = cluster
    before = call(svc, "GET", "/workers")[1]
    pages = len(svc.index)
    st, out = call(svc, "POST", path, raw=raw)
    assert st == 400, out
    assert field in out["error"] and "\n" not in out["error"]
    assert call(svc, "GET", "/workers")[1] == before and len(svc.index) == pages


def test_a_lost_event_marks_the_worker_degraded_in_workers_healthz_and_metrics(cluster):
    svc = cluster[0]
    st, out = call(svc, "POST", "/events", {"worker": "w2", "events": [
        {"type": "BlockRemoved", "block_hashes": [12345]}]})
    assert st == 200
    w = {x["id"]: x for x in call(svc, "GET", "/workers")[1]["workers"]}
    assert w["w2"]["status"] == "degraded" and "12345" in w["w2"]["problem"]
    assert w["w1"]["status"] == "exact" and w["w1"]["problem"] is None
    assert call(svc, "GET", "/healthz")[1]["degraded"] == 1
    m = parse_metrics(call(svc, "GET", "/metrics")[1])
    assert m[("radix_soa_router_worker_degraded", (("worker", "w2"),))] == 1
    assert m[("radix_soa_router_degraded_workers", ())] == 1
    status = {(dict(k[1])["worker"], dict(k[1])["status"]): v for k, v in m.items()
              if k[0] == "radix_soa_router_worker_status"}
    assert status[("w2", "degraded")] == 1 and status[("w2", "exact")] == 0
    assert status[("w1", "exact")] == 1 and sum(v for (w, _), v in status.items() if w == "w2") == 1
    st, out = call(svc, "POST", "/route", {"tokens": [1, 2, 3, 4]})
    assert st == 200 and out["degraded"] == ["w2"]


LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*)\})?'
                  r' (-?[0-9.e+-]+|\+Inf|-Inf|NaN)$')


def parse_metrics(text):
    """Prometheus text format 0.0.4, strictly: every line a comment (HELP,
    TYPE) or a sample; a TYPE before each family's samples."""
    out, typed = {}, {}
    for ln in text.splitlines():
        if ln.startswith("# "):
            kind, name, rest = ln[2:].split(" ", 2)
            assert kind in ("HELP", "TYPE") and rest
            if kind == "TYPE":
                assert rest in ("counter", "gauge", "histogram") and name not in typed
                typed[name] = rest
            continue
        m = LINE.match(ln)
        assert m, ln
        name, labels, value = m.groups()
        fam = re.sub(r"_(bucket|sum|count)$", "", name) if name not in typed else name
        assert fam in typed, ln
        pairs = tuple(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels or ""))
        out[(name, pairs)] = float(value)
    return out


def test_metrics_are_prometheus_text_counting_what_happened(cluster):
    svc, caches, base, rng = cluster
    for q in queries(base, rng, 7):
        assert call(svc, "POST", "/route", {"tokens": q})[0] == 200
    call(svc, "POST", "/route", raw=b"nope")
    st, text = call(svc, "GET", "/metrics")
    assert st == 200
    m = parse_metrics(text)
    ep = (("endpoint", "/route"),)
    assert m[("radix_soa_router_requests_total", ep + (("status", "200"),))] == 7
    assert m[("radix_soa_router_requests_total", ep + (("status", "400"),))] == 1
    assert m[("radix_soa_router_requests_total", (("endpoint", "/events"), ("status", "200")))] \
        == 4
    buckets = [(float(dict(k[1])["le"]), v) for k, v in m.items()
               if k[0] == "radix_soa_router_request_seconds_bucket" and dict(k[1])["endpoint"]
               == "/route"]
    counts = [v for _, v in sorted(buckets)]
    assert counts == sorted(counts) and counts[-1] == 8
    assert m[("radix_soa_router_request_seconds_count", ep)] == 8
    assert sum(v for k, v in m.items() if k[0] == "radix_soa_router_routed_total") == 7
    assert m[("radix_soa_router_index_bytes", ())] == svc.index.memory_report()["bytes"]
    assert m[("radix_soa_router_index_pages", ())] == len(svc.index)
    assert m[("radix_soa_router_workers", ())] == 4


def test_events_posted_as_a_vllm_msgpack_batch(cluster):
    import msgpack
    from radix_soa.integrations.vllm_wire import encode_batch

    svc, caches, base, rng = cluster
    pc = rs.PrefixCache(page_size=PAGE, events=True, values=False)
    pc.insert(list(range(100, 100 + 3 * PAGE)))
    batch = encode_batch(pc.take_events(), encoding="array")
    body = msgpack.packb({"worker": "w1", "seq": 4, "batch": batch})
    st, out = call(svc, "POST", "/events", raw=body)
    assert st == 200 and out == {"worker": "w1", "applied": 1}
    q = list(range(100, 100 + 3 * PAGE))
    assert call(svc, "POST", "/overlap", {"tokens": q})[1]["overlap"]["w1"] == 3 * PAGE
    pages = len(svc.index)
    for raw, field in [(msgpack.packb({"worker": "w1", "batch": batch[:-2]}), "batch: byte"),
                       (msgpack.packb({"worker": "w9", "batch": batch}), "unknown worker"),
                       (msgpack.packb({"worker": "w1", "batch": "x"}), "batch must be"),
                       (msgpack.packb({"worker": "w1", "batch": batch, "x": 1}), "unknown field"),
                       (b"\x81\xc1", "neither JSON nor msgpack")]:
        st, out = call(svc, "POST", "/events", raw=raw)
        assert st == 400 and field in out["error"], out
    assert len(svc.index) == pages


def test_overlap_of_a_waiting_queue_in_one_call(cluster):
    svc, caches, base, rng = cluster
    qs = queries(base, rng, 30) + [[]]
    st, out = call(svc, "POST", "/overlap", {"batch": qs})
    assert st == 200 and out["workers"] == NAMES and out["degraded"] == []
    assert out["overlaps"] == [[pc.match_length(q) for pc in caches] for q in qs]
    st, out = call(svc, "POST", "/overlap", {"batch": [], "namespace": "batch"})
    assert st == 200 and out["overlaps"] == []
    # a one-list body naming "batch" elsewhere keeps the one-list answer
    st, out = call(svc, "POST", "/overlap", {"tokens": qs[0], "namespace": "batch"})
    assert st == 200 and set(out["overlap"]) == set(NAMES)


def test_lora_pages_and_a_cache_salt_match_only_their_requests(cluster):
    svc, caches, base, rng = cluster
    toks = list(range(5, 5 + 2 * PAGE))  # two pages of a LoRA "ad" request salted "s1"
    ev = {"type": "BlockStored", "block_hashes": [901, 902], "parent_block_hash": None,
          "token_ids": toks, "block_size": PAGE, "lora_id": 3, "lora_name": "ad",
          "extra_keys": [["ad", "s1"], ["ad"]]}
    assert call(svc, "POST", "/events", {"worker": "w2", "events": [ev]})[0] == 200
    for body, w2 in [({}, 0), ({"lora_name": "ad"}, 0), ({"extra_keys": ["s1"]}, 0),
                     ({"lora_name": "ad", "extra_keys": ["s2"]}, 0),
                     ({"lora_name": "ad", "extra_keys": ["s1"]}, 2 * PAGE)]:
        out = call(svc, "POST", "/overlap", dict(body, tokens=toks))[1]
        assert out["overlap"]["w2"] == w2, body
        out = call(svc, "POST", "/route", dict(body, tokens=toks, policy="cache_aware"))[1]
        assert out["overlap"]["w2"] == w2 and (w2 == 0 or out["worker"] == "w2"), body


def test_overlap_with_a_namespace_and_an_empty_request(cluster):
    svc, caches, base, rng = cluster
    pc = rs.PrefixCache(page_size=PAGE, events=True, values=False)
    pc.insert([5, 6, 7, 8, 9], namespace="lora-a")
    assert call(svc, "POST", "/events", {"worker": "w3", "events":
                [e.to_dict() for e in pc.take_events()]})[0] == 200
    out = call(svc, "POST", "/overlap", {"tokens": [5, 6, 7, 8, 9], "namespace": "lora-a"})[1]
    assert out["overlap"] == {"w0": 0, "w1": 0, "w2": 0, "w3": 4}
    assert call(svc, "POST", "/overlap", {"tokens": []})[1]["overlap"] == dict.fromkeys(NAMES, 0)
    st, out = call(svc, "POST", "/route", {"tokens": [], "policy": "cache_aware"})
    assert st == 200 and out["mode"] == "miss"


def test_a_post_for_an_unknown_worker_is_refused_unless_new_workers_are_allowed():
    svc = RouterService(rs.RouterIndex(page_size=2, workers=["w0"], strict=False)).start()
    try:
        st, out = call(svc, "POST", "/events", {"worker": "wO", "events": []})  # a typo of w0
        assert st == 400 and "unknown worker 'wO'" in out["error"]
        assert "--allow-new-workers" in out["error"]  # what the command line calls it
        assert call(svc, "GET", "/workers")[1]["workers"][0]["id"] == "w0"
        assert len(call(svc, "GET", "/workers")[1]["workers"]) == 1
    finally:
        svc.stop()


def test_healthz_is_503_when_the_event_feed_stopped():
    class Feed:  # a subscriber that has stopped feeding the index
        running = False

        def start(self):
            pass

        def stop(self):
            pass

        def stats(self, w):
            return {}

    svc = RouterService(rs.RouterIndex(page_size=2, workers=["w0"], strict=False),
                        subscriber=Feed()).start()
    try:
        st, out = call(svc, "GET", "/healthz")
        assert st == 503 and out["status"] == "events stopped"
    finally:
        svc.stop()


def test_no_workers_is_503_and_a_posted_worker_joins():
    svc = RouterService(rs.RouterIndex(page_size=2, strict=False), allow_new_workers=True).start()
    try:
        st, out = call(svc, "POST", "/route", {"tokens": [1, 2]})
        assert st == 503 and "no workers" in out["error"]
        assert call(svc, "POST", "/events", {"worker": "new", "events": []})[0] == 200
        st, out = call(svc, "POST", "/route", {"tokens": [1, 2]})
        assert st == 200 and out["worker"] == "new"
        assert call(svc, "GET", "/healthz")[1]["workers"] == 1
        assert call(svc, "GET", "/nowhere")[0] == 404
        assert call(svc, "GET", "/route")[0] == 405
    finally:
        svc.stop()


def test_the_vllm_subscriber_feeds_the_service():
    pytest.importorskip("zmq")
    from radix_soa.integrations.vllm_wire import WirePublisher
    pubs = {f"v{i}": WirePublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") for i in range(3)}
    svc = RouterService.from_endpoints(
        {w: (p.endpoint, p.replay_endpoint) for w, p in pubs.items()}, page_size=PAGE)
    svc.start()
    try:
        for p in pubs.values():
            assert p.wait_subscribers(1)
        engines = {w: rs.PrefixCache(page_size=PAGE, events=True, values=False) for w in pubs}
        for i, (w, pc) in enumerate(engines.items()):
            pc.insert(list(range(4 * (i + 1) + 2)))
            pubs[w].publish(pc.take_events())
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ws = call(svc, "GET", "/workers")[1]["workers"]
            if all(x["events"].get("batches", 0) >= 1 for x in ws):
                break
            time.sleep(0.05)
        assert [x["events"]["batches"] for x in ws] == [1, 1, 1]
        out = call(svc, "POST", "/overlap", {"tokens": list(range(20))})[1]
        assert out["overlap"] == {"v0": 4, "v1": 8, "v2": 12}
        st, out = call(svc, "POST", "/route", {"tokens": list(range(20)), "policy": "cache_aware"})
        assert st == 200 and out["worker"] == "v2" and out["mode"] == "hit"
        m = parse_metrics(call(svc, "GET", "/metrics")[1])
        assert [m[("radix_soa_router_events_applied_total", (("worker", w),))] for w in pubs] \
            == [float(x["events"]["events"]) for x in ws]
    finally:
        svc.stop()
        svc.subscriber.close()
        for p in pubs.values():
            p.close()


def assert_usage_error(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(list(argv)))
    err = capsys.readouterr().err
    assert exc.value.code == 2
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("radix-soa: error: "), err
    return lines[0]


@pytest.mark.parametrize("argv, expect", [
    (["--worker", "bad id"], "worker id 'bad id'"),
    (["--worker", "w0=http://h:1"], "is not tcp://host:port"),
    (["--worker", "w0=tcp://h:1,replay"], "is not replay=ADDRESS"),
    (["--worker", "w0=tcp://h:1,replay=x"], "the replay address 'x'"),
    (["--worker", "a", "--worker", "a"], "--worker a is given twice"),
    (["--port", "70000"], "must be <= 65535"),
    (["--port", "eighty"], "expected an integer"),
    (["--page-size", "0"], "must be >= 1"),
    (["--policy", "random"], "invalid choice: 'random'"),
    (["--event-hash", "md5"], "invalid choice: 'md5'"),
    (["--event-hash-seed", "1"], "needs --event-hash sha256_cbor"),
    (["--cache-threshold", "-1"], "must be a number >= 0"),
    (["--max-bytes", "100"], "--max-bytes must be >= 4096"),
    (["--max-bytes", "-5"], "--max-bytes must be >= 4096, got -5"),
    (["--max-bytes", "lots"], "is not an integer"),
    (["--host", "256.0.0.1", "--port", "0"], "256.0.0.1"),
])
def test_router_cli_errors_exit_2_with_one_line(capsys, argv, expect):
    assert expect in assert_usage_error(capsys, "router", *argv)


def test_router_cli_names_its_flags_not_python_keywords(capsys, monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    line = assert_usage_error(capsys, "router", "--event-hash", "sha256_cbor")
    assert "--event-hash sha256_cbor needs --event-hash-seed" in line
    assert "event_hash" not in line


def test_router_cli_serves_until_interrupted():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "radix_soa", "router", "--port", "0",
                             "--worker", "a", "--worker", "b", "--policy", "least_loaded"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stderr.readline()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+) \(2 workers, 0 subscribed", line)
        assert m, line

        class Svc:
            port = int(m.group(1))
        assert call(Svc, "GET", "/healthz")[1]["workers"] == 2
        call(Svc, "POST", "/load", {"loads": {"a": {"requests": 3}}})
        assert call(Svc, "POST", "/route", {"tokens": [1, 2]})[1]["worker"] == "b"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


@pytest.mark.slow
def test_the_load_test_runs_bounded_and_stops_by_itself():
    pytest.importorskip("zmq")
    from radix_soa.service import loadtest
    opts = loadtest.parser().parse_args(["--workers", "2", "--requests", "300", "--connections",
                                         "2", "--tokens", "64", "--prefix", "48",
                                         "--event-rate", "20", "--repeat", "1"])
    r = loadtest.run(opts)  # raises unless every route was answered 200
    assert r["routes_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
    assert r["degraded"] == 0 and r["published"]["batches"] >= 2
    assert r["events_per_s"] > 0  # measured while events streamed, not before


@pytest.mark.slow
def test_the_load_test_at_event_rate_zero_routes_without_events():
    pytest.importorskip("zmq")
    from radix_soa.service import loadtest
    opts = loadtest.parser().parse_args(["--workers", "2", "--requests", "200", "--connections",
                                         "2", "--tokens", "64", "--prefix", "48",
                                         "--event-rate", "0", "--repeat", "1"])
    r = loadtest.run(opts)
    assert r["published"] == {"batches": 0, "events": 0} and r["events_per_s"] == 0
    assert r["routes_per_s"] > 0


@pytest.mark.parametrize("rate", ["-1", "nan"])
def test_the_load_test_refuses_a_negative_event_rate(rate, capsys):
    from radix_soa.service import loadtest
    with pytest.raises(SystemExit) as exc:
        loadtest.main(["--event-rate", rate])
    assert exc.value.code == 2 and "--event-rate" in capsys.readouterr().err
