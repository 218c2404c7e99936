#!/usr/bin/env python
"""python asv_bench/route_floor.py (from the repository root): server CPU per request: POST /route of 1,024 tokens vs POST /overlap of an
empty list, on one `radix-soa router` (8 workers fed by POST /events), interleaved."""
import http.client, json, os, random, subprocess, sys, time
import numpy as np
import radix_soa as rs
port = 18000 + os.getpid() % 1000
cmd = [sys.executable, "-m", "radix_soa", "router", "--port", str(port), "--page-size", "16"]
for w in range(8):
    cmd += ["--worker", f"w{w}"]
srv = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
line = srv.stderr.readline(); print(line.strip())
c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
def post(path, body):
    c.request("POST", path, body, {"Content-Type": "application/json"})
    r = c.getresponse(); d = r.read(); assert r.status == 200, d; return d
rng = np.random.default_rng(0)
fams = [rng.integers(0, 32000, 1024) for _ in range(16)]
for w in range(8):
    pc = rs.PrefixCache(page_size=16, events=True, values=False)
    for j in range(6):
        f = fams[(w * 3 + j) % 16]; pc.insert(f[:int(rng.integers(1, 64)) * 16])
    post("/events", json.dumps({"worker": f"w{w}", "events": [e.to_dict() for e in pc.take_events()]}))
reqs = []
for i in range(500):
    q = fams[int(rng.integers(0, 16))].copy(); q[int(rng.integers(0, 1024)):] = 7
    reqs.append(json.dumps({"tokens": q.tolist()}).encode())
empty = b'{"tokens": []}'
def cpu():
    with open(f"/proc/{srv.pid}/stat") as f:
        p = f.read().split(")")[1].split()
    return (int(p[11]) + int(p[12])) / os.sysconf("SC_CLK_TCK")
for b in reqs[:50]: post("/route", b); post("/overlap", empty)
best = {"route": 1e9, "floor": 1e9}
for rnd in range(6):
    for name in ("route", "floor"):
        t = cpu()
        for b in reqs:
            post("/route", b) if name == "route" else post("/overlap", empty)
        best[name] = min(best[name], (cpu() - t) / len(reqs))
print(f"server CPU per request (best of 6 rounds of 500): POST /route 1,024 tokens {best['route']*1e6:.0f} us, "
      f"POST /overlap [] {best['floor']*1e6:.0f} us: ratio {best['route']/best['floor']:.2f}")
srv.terminate(); srv.wait()
