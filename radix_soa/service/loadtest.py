"""The router service's bounded load test on loopback.

    python -m radix_soa.service.loadtest [--requests 20000] [--repeat 3]

Starts, each in its own process: 8 workers publishing KV events on vLLM's
wire (``WirePublisher``; each a ``PrefixCache`` under a capacity, so its
events are stores and the removals of evictions) at a steady rate, and
``radix-soa router`` subscribed to them; then, while the events stream,
sends a fixed count of ``POST /route`` requests (prompts of shared system
prompts and private tails, JSON lists of ints) over keep-alive
connections (``loadgen``), and reports routes/s, p50/p99 latency, and the
events/s the router applied meanwhile (from its ``/metrics``). Everything
stops by itself. Needs the ``router`` and ``vllm`` extras.

``--profile`` also times, in this process, what one route costs apart:
the JSON parse and token check, the index's overlap, the policy's rule
and the answer's JSON.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

from .loadgen import request_bytes, run_load

DEFAULTS = {"workers": 8, "requests": 20_000, "connections": 8, "tokens": 1024,
            "prefix": 768, "families": 16, "page_size": 16, "capacity": 16_384,
            "event_rate": 50.0, "policy": "cache_aware", "repeat": 3}


# ------------------------------------------------------------ the publishers
def publish(workers, rate, tokens, prefix, families, page, capacity, seed):
    """The publishers' process: bind ``workers`` publishers, print their
    endpoints as one JSON line, wait for ``go`` on stdin, then publish one
    batch per worker every ``1/rate`` s (the events of one request on its
    engine; none at rate 0) until stdin says ``stop``; print the batches and
    events sent."""
    import select

    import radix_soa as rs
    from radix_soa.integrations.vllm_wire import WirePublisher
    rng = np.random.default_rng(seed)
    fams = rng.integers(0, 1 << 20, (families, prefix))
    pubs = [WirePublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") for _ in range(workers)]
    engines = [rs.PrefixCache(capacity=capacity, page_size=page, events=True, values=False)
               for _ in range(workers)]
    print(json.dumps([[p.endpoint, p.replay_endpoint] for p in pubs]), flush=True)
    for p in pubs:
        p.wait_subscribers(1, timeout=60)
    sys.stdin.readline()  # go
    batches = events = 0
    period = 1.0 / rate if rate > 0 else None
    nxt = time.perf_counter()
    while period is not None:
        for w, (pub, pc) in enumerate(zip(pubs, engines)):
            f = int(rng.integers(0, families)) if rng.random() < 0.8 else \
                (w * families // workers)
            q = np.concatenate([fams[f], rng.integers(0, 1 << 20, tokens - prefix)])
            pc.insert(q)
            ev = pc.take_events()
            pub.publish(ev)
            batches += 1
            events += len(ev)
        nxt += period
        wait = max(0.0, nxt - time.perf_counter())
        if select.select([sys.stdin], [], [], wait)[0]:
            break
    if period is None:
        sys.stdin.readline()  # stop
    print(json.dumps({"batches": batches, "events": events}), flush=True)
    time.sleep(0.2)
    for p in pubs:
        p.close()


# ------------------------------------------------------------ the test
def _metrics(port):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    total = {}
    for ln in text.splitlines():
        m = re.match(r"(radix_soa_router_(?:events_applied_total|event_batches_total|"
                     r"event_gaps_total|degraded_workers))(?:\{[^}]*\})? (\S+)$", ln)
        if m:
            total[m.group(1)] = total.get(m.group(1), 0) + float(m.group(2))
    return total


def _await_events(port, workers, pubs, timeout=120.0):
    """Wait until the router has applied as many event batches as there are
    workers (the publishers' process may still be compiling its kernels when
    it is told to go), so that what is measured is routing with events
    streaming."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _metrics(port).get("radix_soa_router_event_batches_total", 0) >= workers:
            return
        if pubs.poll() is not None:
            raise RuntimeError(f"the publishers' process exited with {pubs.returncode}")
        time.sleep(0.05)
    raise RuntimeError(f"no event batch from each of the {workers} workers reached the "
                       f"router within {timeout:.0f} s")


def _cpu(pid):
    """User + system CPU seconds of process ``pid`` (Linux; NaN elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def bodies(n, tokens, prefix, families, seed):
    """``n`` route bodies: a family's system prompt then a private tail."""
    rng = np.random.default_rng(seed)
    fams = rng.integers(0, 1 << 20, (families, prefix))
    out = []
    for _ in range(n):
        q = np.concatenate([fams[int(rng.integers(0, families))],
                            rng.integers(0, 1 << 20, tokens - prefix)])
        out.append(json.dumps({"tokens": q.tolist()}).encode())
    return out


def run(opts, out=sys.stdout):
    """One load test; a dict of what it measured."""
    py = sys.executable
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    pubs = subprocess.Popen(
        [py, "-m", "radix_soa.service.loadtest", "--publishers", str(opts.workers),
         "--event-rate", str(opts.event_rate), "--tokens", str(opts.tokens), "--prefix",
         str(opts.prefix), "--families", str(opts.families), "--page-size",
         str(opts.page_size), "--capacity", str(opts.capacity)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    server = None
    try:
        eps = json.loads(pubs.stdout.readline())
        argv = [py, "-m", "radix_soa", "router", "--port", "0", "--page-size",
                str(opts.page_size), "--policy", opts.policy]
        for i, (pub, rep) in enumerate(eps):
            argv += ["--worker", f"w{i}={pub},replay={rep}"]
        server = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
        line = server.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not m:
            raise RuntimeError(f"the router did not start: {line.strip()}")
        port = int(m.group(1))
        reqs = [request_bytes("127.0.0.1", port, "/route", b)
                for b in bodies(512, opts.tokens, opts.prefix, opts.families, 1)]
        pubs.stdin.write("go\n")
        pubs.stdin.flush()
        if opts.event_rate > 0:
            _await_events(port, opts.workers, pubs)
        run_load("127.0.0.1", port, lambda i: reqs[i % len(reqs)], 2000, opts.connections)
        before, t0 = _metrics(port), time.perf_counter()
        cpu0 = (_cpu(server.pid), _cpu(pubs.pid), time.process_time())
        r = run_load("127.0.0.1", port, lambda i: reqs[i % len(reqs)], opts.requests,
                     opts.connections)
        cpu1 = (_cpu(server.pid), _cpu(pubs.pid), time.process_time())
        after, t1 = _metrics(port), time.perf_counter()
        pubs.stdin.write("stop\n")
        pubs.stdin.flush()
        sent = json.loads(pubs.stdout.readline())
        if r.statuses != {200: opts.requests}:
            raise RuntimeError(f"statuses {r.statuses}: {r.bodies}")
        applied = after.get("radix_soa_router_events_applied_total", 0) - \
            before.get("radix_soa_router_events_applied_total", 0)
        if opts.event_rate > 0 and applied == 0:
            raise RuntimeError("the router applied no events while it was measured: the figure "
                               "would not be one with events streaming")
        return {"routes_per_s": r.rate, "p50_ms": r.p(50) * 1e3, "p99_ms": r.p(99) * 1e3,
                "events_per_s": applied / (t1 - t0),
                "batches_per_s": (after.get("radix_soa_router_event_batches_total", 0) -
                                  before.get("radix_soa_router_event_batches_total", 0))
                / (t1 - t0),
                "gaps": after.get("radix_soa_router_event_gaps_total", 0),
                "degraded": after.get("radix_soa_router_degraded_workers", 0),
                "server_cpu_us_per_route": (cpu1[0] - cpu0[0]) / opts.requests * 1e6,
                "publishers_cpu_share": (cpu1[1] - cpu0[1]) / (t1 - t0),
                "client_cpu_us_per_route": (cpu1[2] - cpu0[2]) / opts.requests * 1e6,
                "published": sent}
    finally:
        for p in (server, pubs):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def profile(opts):
    """Microseconds per route of each part, timed here on one index holding
    ``opts.workers`` workers' pages."""
    import timeit

    import radix_soa as rs
    from .app import RouterService, _dumps
    from .app import ROUTE_FIELDS
    from .schema import has_bool, parse_body, read_tokens, tokens_of
    ix = rs.RouterIndex(opts.page_size, workers=[f"w{i}" for i in range(opts.workers)],
                        strict=False)
    rng = np.random.default_rng(0)
    fams = rng.integers(0, 1 << 20, (opts.families, opts.prefix))
    for w in range(opts.workers):
        pc = rs.PrefixCache(capacity=opts.capacity, page_size=opts.page_size, events=True,
                            values=False)
        for f in range(w, opts.families, 2):
            pc.insert(np.concatenate([fams[f], rng.integers(0, 1 << 20, 64)]))
        ix.apply(f"w{w}", pc.take_events())
    svc = RouterService(ix, policy=opts.policy)
    svc._warm()
    raw = bodies(1, opts.tokens, opts.prefix, opts.families, 1)[0]
    body = parse_body(raw)
    t = tokens_of(body, maybe_bool=has_bool(raw))
    rep = ix.overlap_report(t)
    v = svc._current(list(rep.scores))
    rows = [svc._load_row(w) for w in v.ids]
    ov = list(rep.scores.values())
    resp = {"worker": "w0", "policy": opts.policy, "mode": "hit",
            "overlap": dict(zip(v.names, ov)), "load": dict(zip(("requests", "tokens",
                                                                  "active_blocks",
                                                                  "prefill_tokens"), rows[0])),
            "degraded": []}
    parts = {"read_tokens (the service's)": lambda: read_tokens(raw, ROUTE_FIELDS),
             "json.loads + np.array (instead)": lambda: tokens_of(parse_body(raw),
                                                                  maybe_bool=has_bool(raw)),
             "overlap_report": lambda: ix.overlap_report(t),
             "policy rule": lambda: svc.choose(opts.policy, t, None, v, ov, rows),
             "answer json": lambda: _dumps(resp)}
    out = {}
    for name, fn in parts.items():
        n = 2000
        out[name] = min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
    return out


def parser():
    ap = argparse.ArgumentParser(prog="python -m radix_soa.service.loadtest",
                                 description=__doc__.splitlines()[0])
    d = DEFAULTS
    ap.add_argument("--workers", type=int, default=d["workers"])
    ap.add_argument("--requests", type=int, default=d["requests"])
    ap.add_argument("--connections", type=int, default=d["connections"])
    ap.add_argument("--tokens", type=int, default=d["tokens"], help="tokens per request")
    ap.add_argument("--prefix", type=int, default=d["prefix"], help="shared prefix tokens")
    ap.add_argument("--families", type=int, default=d["families"], help="distinct prefixes")
    ap.add_argument("--page-size", type=int, default=d["page_size"])
    ap.add_argument("--capacity", type=int, default=d["capacity"],
                    help="tokens each worker's cache holds")
    ap.add_argument("--event-rate", type=float, default=d["event_rate"],
                    help="event batches per second per worker (0: none)")
    ap.add_argument("--policy", default=d["policy"])
    ap.add_argument("--repeat", type=int, default=d["repeat"])
    ap.add_argument("--profile", action="store_true", help="also time a route's parts")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--publishers", type=int, default=None, help=argparse.SUPPRESS)
    return ap


def main(argv=None):
    opts = parser().parse_args(argv)
    if not 0 < opts.prefix <= opts.tokens:
        parser().error("--prefix must be in [1, --tokens]")
    if not opts.event_rate >= 0:  # NaN too
        parser().error("--event-rate must be >= 0 (0: no events, the routes alone)")
    if opts.publishers is not None:
        publish(opts.publishers, opts.event_rate, opts.tokens, opts.prefix, opts.families,
                opts.page_size, opts.capacity, 0)
        return 0
    runs = []
    for i in range(opts.repeat):
        r = run(opts)
        runs.append(r)
        if not opts.json:
            print(f"run {i + 1}: {r['routes_per_s']:,.0f} routes/s, p50 {r['p50_ms']:.2f} ms, "
                  f"p99 {r['p99_ms']:.2f} ms, {r['events_per_s']:,.0f} events/s applied "
                  f"({r['batches_per_s']:,.0f} batches/s), gaps {r['gaps']:.0f}, degraded "
                  f"{r['degraded']:.0f}; CPU per route: server {r['server_cpu_us_per_route']:.0f} "
                  f"us, client {r['client_cpu_us_per_route']:.0f} us; publishers "
                  f"{r['publishers_cpu_share']:.0%} of a core", flush=True)
    rates = [r["routes_per_s"] for r in runs]
    best = max(runs, key=lambda r: r["routes_per_s"])
    summary = {"best": best, "median_routes_per_s": statistics.median(rates), "runs": runs,
               "options": {k: getattr(opts, k) for k in DEFAULTS}, "cpus": os.cpu_count()}
    if opts.profile:
        summary["profile_us"] = profile(opts)
    if opts.json:
        print(json.dumps(summary))
    else:
        print(f"{opts.workers} publishing workers, {opts.requests} routes of {opts.tokens} "
              f"tokens over {opts.connections} connections, policy {opts.policy}, "
              f"{os.cpu_count()} cpus: best {best['routes_per_s']:,.0f} routes/s (p50 "
              f"{best['p50_ms']:.2f} ms, p99 {best['p99_ms']:.2f} ms), median "
              f"{summary['median_routes_per_s']:,.0f}")
        if opts.profile:
            print("one route's parts, us: " + ", ".join(
                f"{k} {v:.1f}" for k, v in summary["profile_us"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
