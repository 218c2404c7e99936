"""The router service as a deployment meets it (issue 35): a status that
means what it says (syncing until the feed confirmed a worker, /readyz),
and HTTP that hostile clients cannot break (bounded error lines, bodies
refused before they are read or handled off the event loop, worker ids
checked, a bound on workers, duplicate seqs said, labels escaped). Real
HTTP and ZMQ on 127.0.0.1; waits poll a condition with a deadline."""

import http.client
import json
import socket
import threading
import time

import pytest

pytest.importorskip("uvicorn", reason="the router extra (pip install -e '.[router]')")

import radix_soa as rs  # noqa: E402
from radix_soa.service import RouterService  # noqa: E402

PAGE = 4


def call(svc, method, path, body=None, raw=None, timeout=20):
    c = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=timeout)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body))
        c.request(method, path, data, {"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode()
        ctype = r.getheader("Content-Type", "")
    finally:
        c.close()
    return r.status, (json.loads(text) if ctype.startswith("application/json") else text)


def until(cond, timeout=30):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def svc():
    s = RouterService(rs.RouterIndex(page_size=PAGE, workers=["w0"], strict=False),
                      allow_new_workers=True, max_workers=3, max_body=1 << 20).start()
    try:
        yield s
    finally:
        s.stop()


# ---------------------------------------------------------------- status

def test_a_worker_is_syncing_until_its_publisher_confirms_it_and_readyz_says_so():
    pytest.importorskip("zmq")
    from radix_soa.integrations.vllm_wire import WirePublisher
    pub = WirePublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", serve=False)
    engine = rs.PrefixCache(page_size=PAGE, events=True, values=False)
    engine.insert(list(range(8)))
    pub.publish(engine.take_events(), send=False)   # before the router: only in the buffer
    # "down" never answers: a publisher at a wrong address
    stop, server = threading.Event(), threading.Thread(target=lambda: None)
    server.start()
    svc = RouterService.from_endpoints({"up": (pub.endpoint, pub.replay_endpoint),
                                        "down": ("tcp://127.0.0.1:9", "tcp://127.0.0.1:9")},
                                       page_size=PAGE).start()
    try:
        st, out = call(svc, "GET", "/readyz")
        assert st == 503 and {w["id"] for w in out["not_exact"]} == {"up", "down"}
        out = call(svc, "POST", "/overlap", {"tokens": list(range(8))})[1]
        assert out["overlap"] == {"up": 0, "down": 0} and out["syncing"] == ["up", "down"]
        assert call(svc, "POST", "/route", {"tokens": [1]})[1]["syncing"] == ["up", "down"]
        stop = threading.Event()
        server = threading.Thread(target=lambda: [pub.serve_replay(50) for _ in iter(
            stop.is_set, True)])
        server.start()                              # the router asked, no batch awaited
        until(lambda: call(svc, "POST", "/overlap", {"tokens": list(range(8))})[1]["syncing"]
              == ["down"])
        assert call(svc, "POST", "/overlap", {"tokens": list(range(8))})[1]["overlap"] == \
            {"up": 8, "down": 0}
        workers = {w["id"]: w for w in call(svc, "GET", "/workers")[1]["workers"]}
        assert workers["up"]["status"] == "exact" and workers["up"]["reason"] is None
        assert workers["down"]["status"] == "syncing"
        assert workers["down"]["reason"].startswith("nothing from tcp://127.0.0.1:9")
        st, out = call(svc, "GET", "/readyz")
        assert st == 503 and [w["id"] for w in out["not_exact"]] == ["down"]
        assert call(svc, "GET", "/healthz")[0] == 200   # liveness, not readiness
        metrics = call(svc, "GET", "/metrics")[1]
        # a state set: one series per (worker, status), bounded, the reason in /workers
        assert 'radix_soa_router_worker_status{worker="down",status="syncing"} 1' in metrics
        assert 'radix_soa_router_worker_status{worker="down",status="exact"} 0' in metrics
        assert 'radix_soa_router_worker_status{worker="up",status="exact"} 1' in metrics
        assert "reason=" not in metrics
        assert "radix_soa_router_syncing_workers 1" in metrics
        svc.subscriber.remove_endpoint("down")
        st, out = call(svc, "GET", "/readyz")
        assert st == 200 and out["ready"] and out["not_exact"] == []
    finally:
        svc.stop()
        stop.set()
        server.join(10)
        pub.close()


def test_overlap_report_carries_syncing_apart_from_degraded():
    ix = rs.RouterIndex(page_size=2, workers=["a", "b", "c"], strict=False)
    ix.mark_syncing("a", "replaying")
    ix.mark_syncing("b", "replaying")
    ix.mark_degraded("b", "lost")
    rep = ix.overlap_report([1, 2])
    assert rep.syncing == {"a"} and rep.degraded == {"b"}
    assert ix.statuses() == {"a": ("syncing", "replaying"), "b": ("degraded", "lost"),
                             "c": ("exact", None)}
    ix.apply_snapshot("b", [])
    assert ix.status("b") == "syncing"      # a clear does not confirm the feed
    ix.mark_syncing("b", None)
    assert ix.status("b") == "exact"
    with pytest.raises(KeyError):
        ix.mark_syncing("x", "r")
    with pytest.raises(TypeError, match="reason"):
        ix.mark_syncing("a", 5)


# ---------------------------------------------------------------- hostile HTTP

def test_an_error_shows_a_bad_value_cut_with_its_length(svc):
    st, out = call(svc, "POST", "/events", {"worker": "x" * 100_000, "events": []})
    assert st == 400 and len(out["error"]) < 600 and "(100000 characters)" in out["error"]
    st, out = call(svc, "POST", "/load", {"loads": {"w0": {"requests": "y" * 50_000}}})
    assert st == 400 and len(out["error"]) < 600 and "characters" in out["error"]


@pytest.mark.parametrize("name", ["a\udc80b", "tab\there", "x" * 257, ""])
def test_worker_ids_are_printable_and_bounded(svc, name):
    raw = json.dumps({"worker": name, "events": []})    # ensure_ascii: the lone surrogate as \udc80
    st, out = call(svc, "POST", "/events", raw=raw)
    assert st == 400 and "printable" in out["error"]
    assert [w["id"] for w in call(svc, "GET", "/workers")[1]["workers"]] == ["w0"]
    assert call(svc, "GET", "/metrics")[0] == 200


def test_max_workers_bounds_what_posts_add(svc):
    for w in ("w1", "w2"):
        assert call(svc, "POST", "/events", {"worker": w, "events": []})[0] == 200
    st, out = call(svc, "POST", "/events", {"worker": "w3", "events": []})
    assert st == 400 and "max_workers=3" in out["error"]
    assert call(svc, "POST", "/events", {"worker": "w2", "events": []})[0] == 200


def test_a_duplicate_seq_is_said_and_applies_nothing(svc):
    pc = rs.PrefixCache(page_size=PAGE, events=True, values=False)
    pc.insert([1, 2, 3, 4])
    ev = [e.to_dict() for e in pc.take_events()]
    assert call(svc, "POST", "/events", {"worker": "w0", "events": ev, "seq": 0})[1] == \
        {"worker": "w0", "applied": 1}
    pc.reset()
    again = [e.to_dict() for e in pc.take_events()]       # a clear, posted under seq 0 again
    assert call(svc, "POST", "/events", {"worker": "w0", "events": again, "seq": 0})[1] == \
        {"worker": "w0", "applied": 0, "duplicate": True}
    assert call(svc, "POST", "/overlap", {"tokens": [1, 2, 3, 4]})[1]["overlap"] == {"w0": 4}


def test_a_body_over_max_body_is_refused_before_it_is_read(svc):
    s = socket.create_connection(("127.0.0.1", svc.port), timeout=10)
    try:   # headers only: a server reading the body would wait for it
        s.sendall(b"POST /events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (100 << 20))
        head = s.recv(4096)
    finally:
        s.close()
    assert head.startswith(b"HTTP/1.1 413")


def test_healthz_is_answered_while_a_large_body_is_handled():
    ix = rs.RouterIndex(page_size=PAGE, workers=["w0"], strict=False)
    svc = RouterService(ix).start()
    try:
        pc = rs.PrefixCache(page_size=PAGE, events=True, values=False)
        for i in range(12_000):
            pc.insert([i, i + 1, i + 2, i + 3, 7, 7, 7, 7])
        events = [e.to_dict() for e in pc.take_events()]
        body = json.dumps({"worker": "w0", "events": events * 1}).encode()
        assert len(body) > 1 << 20
        done = []
        t = threading.Thread(target=lambda: done.append(call(svc, "POST", "/events",
                                                              raw=body, timeout=120)))
        t.start()
        answered = 0
        while t.is_alive() and answered < 20:
            assert call(svc, "GET", "/healthz", timeout=10)[0] == 200
            answered += 1
        t.join(120)
        assert done[0][0] == 200 and done[0][1]["applied"] == len(events)
        assert answered >= 1
    finally:
        svc.stop()


class HeldIndex(rs.RouterIndex):
    """An index whose next apply, once armed, holds its lock until
    ``release`` is set: a large write in progress, for as long as the test
    wants."""

    held = None

    def apply(self, worker, events, **kw):
        held, self.held = self.held, None
        if held is not None:
            entered, release = held
            with self._lock:
                entered.set()
                release.wait(60)
        return super().apply(worker, events, **kw)


def test_healthz_does_not_wait_for_an_apply_in_progress():
    ix = HeldIndex(page_size=PAGE, workers=["w0"], strict=False)
    svc = RouterService(ix).start()
    entered, release = threading.Event(), threading.Event()
    done = []
    t = threading.Thread(target=lambda: done.append(call(svc, "POST", "/events", {
        "worker": "w0", "events": []}, timeout=60)))
    try:
        ix.held = (entered, release)
        t.start()
        assert entered.wait(30)
        st, out = call(svc, "GET", "/healthz", timeout=30)   # answered while the post waits
        assert st == 200 and out["workers"] == 1 and not done
    finally:
        release.set()
        t.join(60)
        svc.stop()
    assert done[0][0] == 200
