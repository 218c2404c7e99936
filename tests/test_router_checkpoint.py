"""The router's checkpoint (radix_soa.service.checkpoint) and what it is
for: a router restarted from its state directory, or a replica started
from a peer's snapshot, exact again within the engines' replay window
without replaying from 0. Damaged and foreign checkpoints are refused with
a clear error. Real ZMQ and HTTP on 127.0.0.1."""

import os
import json

import numpy as np
import pytest

import radix_soa as rs
from radix_soa.service import checkpoint as ck

PAGE = 4


def filled(**kw):
    ix = rs.RouterIndex(page_size=PAGE, workers=["a", ("b", 1), 7], strict=False, **kw)
    for i, w in enumerate(ix.workers):
        pc = rs.PrefixCache(page_size=PAGE, events=True, values=False,
                            event_hash=ix.event_hash,
                            event_hash_seed="0" if ix.event_hash == "sha256_cbor" else None)
        for j in range(5):
            pc.insert([i, j] * 6)
        ix.apply(w, pc.take_events())
    ix.mark_degraded(7, "lost")
    return ix


QUERIES = [[i, j] * 6 for i in range(3) for j in range(6)]


@pytest.mark.parametrize("kw", [{}, {"max_bytes": 1 << 20},
                                {"event_hash": "sha256_cbor", "event_hash_seed": "0"}])
def test_a_checkpoint_loads_back_the_same_index_and_positions(tmp_path, kw):
    ix = filled(**kw)
    info = ck.save(tmp_path / "s", ck.snapshot(ix), {"a": (3, b"x"), ("b", 1): (0, b"")})
    assert info["bytes"] > 0
    back, positions, _ = ck.load(tmp_path / "s")
    assert positions == {"a": (3, b"x"), ("b", 1): (0, b"")}
    assert back.workers == ix.workers and back.degraded == ix.degraded
    assert [back.overlap_scores(q) for q in QUERIES] == [ix.overlap_scores(q) for q in QUERIES]
    assert all(back.blocks_of(w) == ix.blocks_of(w) for w in ix.workers)
    pc = rs.PrefixCache(page_size=PAGE, events=True, values=False, event_hash=ix.event_hash,
                        event_hash_seed="0" if ix.event_hash == "sha256_cbor" else None)
    pc.insert([9] * 8)
    evs = pc.take_events()
    ix.apply("a", evs)                        # it goes on as the original does
    back.apply("a", evs)
    assert back.overlap_scores([9] * 8) == ix.overlap_scores([9] * 8) != {}


def test_a_checkpoint_goes_on_like_the_original(tmp_path):
    ix = filled()
    ck.save(tmp_path / "s", ck.snapshot(ix))
    back = ck.load(tmp_path / "s")[0]
    pc = rs.PrefixCache(page_size=PAGE, events=True, values=False)
    for j in range(40):
        pc.insert([5, j] * 8)
    evs = pc.take_events()
    ix.apply("a", evs)
    back.apply("a", evs)
    assert [back.overlap_scores(q) for q in QUERIES + [[5, 3] * 8]] == \
        [ix.overlap_scores(q) for q in QUERIES + [[5, 3] * 8]]


def damage_array(path):
    name = max((f for f in os.listdir(path) if f.endswith(".npy")),
               key=lambda f: os.path.getsize(path / f))    # its data, not its .npy header
    data = bytearray((path / name).read_bytes())
    data[-1] ^= 0xFF
    (path / name).write_bytes(bytes(data))
    return name


@pytest.mark.parametrize("damage, says", [
    (damage_array, "checksum mismatch"),
    (lambda p: (p / "header.json").write_text((p / "header.json").read_text()
                                              .replace('"_page": 4', '"_page": 8')),
     "header.json is corrupted"),
    (lambda p: (p / "header.json").write_text("{"), "not valid JSON"),
    (lambda p: os.remove(p / "header.json"), "missing header.json"),
    (lambda p: os.remove(p / sorted(f for f in os.listdir(p) if f.endswith(".npy"))[0]),
     "missing a"),
])
def test_a_damaged_checkpoint_is_refused_saying_what(tmp_path, damage, says):
    ck.save(tmp_path / "s", ck.snapshot(filled()))
    damage(tmp_path / "s")
    with pytest.raises(ck.CheckpointError, match=says):
        ck.load(tmp_path / "s")


def test_a_foreign_directory_is_refused(tmp_path):
    rs.PrefixCache(page_size=PAGE).save(tmp_path / "tree")
    with pytest.raises(ck.CheckpointError, match="foreign"):
        ck.load(tmp_path / "tree")
    with pytest.raises(FileNotFoundError):
        ck.load(tmp_path / "nothing")


def test_a_checkpoint_killed_midway_leaves_the_previous_one(tmp_path, monkeypatch):
    ix = filled()
    ck.save(tmp_path / "s", ck.snapshot(ix), {"a": (1, b"p")})
    real = np.save

    def dies(f, *a, **kw):
        real(f, *a, **kw)
        raise KeyboardInterrupt  # a kill during the write: the rename never happens

    monkeypatch.setattr(ck.np, "save", dies)
    ix.apply("a", [rs.AllBlocksCleared()])
    with pytest.raises(KeyboardInterrupt):
        ck.save(tmp_path / "s", ck.snapshot(ix), {"a": (2, b"q")})
    monkeypatch.setattr(ck.np, "save", real)
    back, positions, _ = ck.load(tmp_path / "s")
    assert positions == {"a": (1, b"p")} and back.blocks_of("a") != []


def test_restore_starts_empty_from_a_bad_or_misfit_checkpoint(tmp_path):
    from radix_soa.service.app import restore
    ck.save(tmp_path / "s", ck.snapshot(filled()), {"a": (1, b"p")})
    ix, pos, err = restore(str(tmp_path / "s"), ["a", "z"], page_size=PAGE)
    assert err is None and ix.workers == ["a", "z"] and pos == {"a": (1, b"p")}
    ix, pos, err = restore(str(tmp_path / "s"), ["a"], page_size=8)
    assert "another index" in err and pos == {} and len(ix) == 0
    damage_array(tmp_path / "s")
    ix, pos, err = restore(str(tmp_path / "s"), ["a"], page_size=PAGE)
    assert "checksum mismatch" in err and pos == {} and len(ix) == 0
    assert restore(str(tmp_path / "none"), ["a"], page_size=PAGE)[2] is None


# ---------------------------------------------------------------- restarts and replicas

zmq = pytest.importorskip("zmq")
pytest.importorskip("uvicorn")

from radix_soa.integrations.vllm_wire import WirePublisher  # noqa: E402
from radix_soa.service import RouterService  # noqa: E402


def until(cond, timeout=60):
    import time
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def engine_steps(seed, n):
    import random
    rng = random.Random(seed)
    pc = rs.PrefixCache(capacity=200, page_size=PAGE, events=True, values=False)
    out = []
    for _ in range(n):
        pc.insert([rng.randint(0, 3) for _ in range(rng.randint(1, 24))])
        out.append(pc.take_events())
    return pc, out


def stats_of(svc, w):
    return svc.subscriber.stats(w)


def test_a_router_restarted_from_its_state_dir_is_exact_without_a_replay_from_0(tmp_path):
    pc, steps = engine_steps(3, 60)
    pub = WirePublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    state = str(tmp_path / "state")
    ep = {"w": (pub.endpoint, pub.replay_endpoint)}
    try:
        svc = RouterService.from_endpoints(ep, page_size=PAGE, state_dir=state,
                                           checkpoint_every=60).start()
        try:
            assert pub.wait_subscribers(1)
            until(lambda: svc.index.status("w") == "exact")
            for b in steps[:40]:
                pub.publish(b)
            until(lambda: stats_of(svc, "w")["last_seq"] == 39)
        finally:
            svc.stop()                         # a clean stop: checkpointed
        for b in steps[40:]:
            pub.publish(b)                     # the engine goes on meanwhile
        svc = RouterService.from_endpoints(ep, page_size=PAGE, state_dir=state).start()
        try:
            assert svc.load_error is None
            until(lambda: svc.index.status("w") == "exact"
                  and stats_of(svc, "w")["last_seq"] == 59)
            s = stats_of(svc, "w")
            assert s["replayed"] == 20 and s["restarts"] == 0   # 40..59 only, not from 0
            qs = [[a, b, c, d] * 3 for a in range(4) for b in range(4) for c in range(2)
                  for d in range(2)]
            assert [svc.index.overlap(q).tolist() for q in qs] == \
                [[pc.match_length(q)] for q in qs]
        finally:
            svc.stop()
    finally:
        pub.close()


def test_a_replica_from_a_peers_snapshot_answers_alike(tmp_path):
    import http.client
    pcs, pubs = {}, {}
    for i in range(2):
        pcs[f"w{i}"], steps = engine_steps(10 + i, 30)
        pubs[f"w{i}"] = WirePublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    eps = {w: (p.endpoint, p.replay_endpoint) for w, p in pubs.items()}
    a = RouterService.from_endpoints(eps, page_size=PAGE, state_dir=str(tmp_path / "a"),
                                     checkpoint_every=0.2).start()
    b = None
    try:
        for p in pubs.values():
            assert p.wait_subscribers(1)
        until(lambda: all(a.index.status(w) == "exact" for w in eps))
        runs = {w: engine_steps(10 + i, 30)[1] for i, w in enumerate(eps)}
        for w, p in pubs.items():
            for step in runs[w][:20]:
                p.publish(step)
        until(lambda: all(a.subscriber.stats(w)["last_seq"] == 19 for w in eps))
        until(lambda: a.checkpoint_info["count"] >= 2)
        path = ck.fetch(f"http://127.0.0.1:{a.port}", str(tmp_path / "boot"))
        b = RouterService.from_endpoints(eps, page_size=PAGE, state_dir=path).start()
        assert b.load_error is None
        for w, p in pubs.items():
            for step in runs[w][20:]:
                p.publish(step)
        for svc in (a, b):
            until(lambda: all(svc.index.status(w) == "exact"
                              and svc.subscriber.stats(w)["last_seq"] == 29 for w in eps))
        assert all(b.subscriber.stats(w)["replayed"] < 30 for w in eps)  # not from 0
        qs = [[x, y, z] * 4 for x in range(4) for y in range(4) for z in range(4)]

        def answers(svc):
            out = []
            for q in qs:
                c = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=20)
                c.request("POST", "/overlap", json.dumps({"tokens": q}))
                out.append(json.loads(c.getresponse().read()))
                c.close()
            return out
        assert answers(a) == answers(b)
        assert [answers(a)[i]["overlap"]["w0"] for i in range(len(qs))] == \
            [pcs["w0"].match_length(q) for q in qs]
    finally:
        a.stop()
        if b is not None:
            b.stop()
        for p in pubs.values():
            p.close()


# ---------------------------------------------------------------- the command, killed

def start_router(args):
    import re
    import subprocess
    import sys
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "radix_soa", "router", "--port", "0",
                             "--page-size", str(PAGE)] + args,
                            stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    for _ in range(5):
        line = proc.stderr.readline()
        lines.append(line)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            return proc, int(m.group(1)), lines
    proc.kill()
    proc.wait()
    raise AssertionError(lines)


def get(port, path, body=None):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        c.request("POST" if body is not None else "GET", path,
                  None if body is None else json.dumps(body))
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def stop(proc):
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    proc.stderr.close()


def test_the_router_killed_mid_stream_is_exact_again_from_its_state_dir(tmp_path):
    import signal
    import time
    engines, pubs = {}, {}
    for i in range(2):
        engines[f"w{i}"], _ = engine_steps(30 + i, 0)
        pubs[f"w{i}"] = WirePublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    runs = {w: engine_steps(30 + i, 80)[1] for i, w in enumerate(pubs)}
    final = {w: engine_steps(30 + i, 80)[0] for i, w in enumerate(pubs)}
    args = sum((["--worker", f"{w}={p.endpoint},replay={p.replay_endpoint}"]
                for w, p in pubs.items()), []) + [
        "--state-dir", str(tmp_path / "state"), "--checkpoint-every", "0.2"]
    qs = [[a, b, c] * 4 for a in range(4) for b in range(4) for c in range(4)]
    proc, port, _ = start_router(args)
    try:
        until(lambda: get(port, "/readyz")[0] == 200)
        for i in range(50):
            for w, p in pubs.items():
                p.publish(runs[w][i])
        until(lambda: all(x["events"]["last_seq"] == 49
                          for x in get(port, "/workers")[1]["workers"]))
        until(lambda: get(port, "/workers")[1]["checkpoint"]["count"] >= 2)
        proc.send_signal(signal.SIGKILL)               # no clean stop
        proc.wait(30)
    finally:
        stop(proc)
    for i in range(50, 80):
        for w, p in pubs.items():
            p.publish(runs[w][i])                      # the engines go on meanwhile
    proc, port, lines = start_router(args)
    try:
        t0 = time.monotonic()
        until(lambda: get(port, "/readyz")[0] == 200, timeout=30)
        assert time.monotonic() - t0 < 30
        ws = {x["id"]: x for x in get(port, "/workers")[1]["workers"]}
        for w in pubs:
            assert ws[w]["status"] == "exact" and ws[w]["events"]["last_seq"] == 79
            assert ws[w]["events"]["replayed"] < 80 and ws[w]["events"]["restarts"] == 0
        for q in qs:
            out = get(port, "/overlap", {"tokens": q})[1]
            assert out["overlap"] == {w: final[w].match_length(q) for w in pubs}
    finally:
        stop(proc)
        for p in pubs.values():
            p.close()


def test_the_router_refuses_a_damaged_state_dir_and_starts_syncing(tmp_path):
    ck.save(tmp_path / "state", ck.snapshot(rs.RouterIndex(page_size=PAGE, workers=["w"])))
    damage_array(tmp_path / "state")
    pub = WirePublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    proc, port, lines = start_router(["--worker", f"w={pub.endpoint},replay={pub.replay_endpoint}",
                                      "--state-dir", str(tmp_path / "state")])
    try:
        assert any("checksum mismatch" in x and "starting empty" in x for x in lines), lines
        until(lambda: get(port, "/readyz")[0] == 200)  # its replay answered: exact, empty
        assert "checksum mismatch" in get(port, "/workers")[1]["checkpoint"]["load_error"]
    finally:
        stop(proc)
        pub.close()


def test_snapshot_without_a_state_dir_is_a_fresh_checkpoint(tmp_path):
    ix = filled()
    svc = RouterService(ix).start()
    try:
        path = ck.fetch(f"http://127.0.0.1:{svc.port}/snapshot", str(tmp_path / "s"))
    finally:
        svc.stop()
    back = ck.load(path)[0]
    assert [back.overlap_scores(q) for q in QUERIES] == [ix.overlap_scores(q) for q in QUERIES]
    with pytest.raises(ck.CheckpointError, match="not an http"):
        ck.fetch("ftp://x/snapshot", str(tmp_path / "t"))


@pytest.mark.parametrize("argv, expect", [
    (["--checkpoint-every", "0"], "--checkpoint-every must be a number of seconds > 0"),
    (["--probe-every", "-1"], "--probe-every must be a number of seconds"),
    (["--replay-timeout", "x"], "--replay-timeout must be a number of seconds > 0"),
    (["--max-workers", "0"], "must be >= 1"),
    (["--state-dir", "/nonexistent-parent/state"], "its parent directory does not exist"),
    (["--bootstrap-from", "http://127.0.0.1:9"], "--bootstrap-from http://127.0.0.1:9"),
    (["--bootstrap-from", "ftp://h/x"], "not an http(s) address"),
])
def test_router_cli_refuses_bad_deployment_flags(capsys, argv, expect):
    from radix_soa.cli import main
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(["router", "--worker", "a", "--port", "0"] + argv))
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert exc.value.code == 2 and len(lines) == 1 and expect in lines[0], err
