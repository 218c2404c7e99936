"""Which HTTP server the router service runs on: the same hello-world
JSON handler (parse a body of 64 tokens, or --tokens, answer one small JSON object) on
each candidate, in its own process, driven by radix_soa's keep-alive load
generator over loopback (8 connections, a fixed count of requests).

    python asv_bench/server_candidates.py [--requests 20000] [--repeat 3]

Candidates: the stdlib ThreadingHTTPServer (the floor: no dependency),
aiohttp's web server (on uvloop), a bare ASGI app and a Starlette app
under uvicorn with httptools and uvloop; and ``radix-soa-router``, the
service itself with 8 empty workers. The comparison needs aiohttp and
starlette beside the router extra (``pip install aiohttp starlette``).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from radix_soa.service.loadgen import request_bytes, run_load

SERVERS = {
    "stdlib": r'''
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else each answer waits for a delayed ACK (40 ms)
    def log_message(self, *a): pass
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        d = json.loads(body)
        out = json.dumps({"worker": len(d["tokens"]) % 8}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
''',
    "aiohttp": r'''
import json, sys
import uvloop
from aiohttp import web
async def route(request):
    d = json.loads(await request.read())
    return web.Response(body=json.dumps({"worker": len(d["tokens"]) % 8}).encode(),
                        content_type="application/json")
app = web.Application()
app.router.add_post("/route", route)
uvloop.install()
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
''',
    "asgi+uvicorn": r'''
import json, sys
import uvicorn
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    out = json.dumps({"worker": len(json.loads(body)["tokens"]) % 8}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
            log_level="warning", access_log=False)
''',
    "starlette+uvicorn": r'''
import json, sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
async def route(request):
    d = json.loads(await request.body())
    return Response(json.dumps({"worker": len(d["tokens"]) % 8}), media_type="application/json")
app = Starlette(routes=[Route("/route", route, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
            log_level="warning", access_log=False)
''',
    # the router service itself, 8 workers with nothing cached: what its
    # handler adds to the library's floor
    "radix-soa-router": r'''
import sys
import radix_soa as rs
from radix_soa.service import RouterService
ix = rs.RouterIndex(16, workers=[f"w{i}" for i in range(8)], strict=False)
RouterService(ix).serve_forever("127.0.0.1", int(sys.argv[1]))
''',
}
CANDIDATES = ["stdlib", "aiohttp", "asgi+uvicorn", "starlette+uvicorn"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """User + system CPU seconds of process ``pid`` (Linux; NaN elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def wait_port(port, proc, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the server did not start")


def measure(name, requests, connections, tokens=64):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVERS[name], str(port)])
    try:
        wait_port(port, proc)
        req = request_bytes("127.0.0.1", port, "/route",
                            json.dumps({"tokens": list(range(1000, 1000 + tokens))}).encode())
        run_load("127.0.0.1", port, lambda i: req, 500, connections)  # warm
        cpu0, me0 = cpu_seconds(proc.pid), time.process_time()
        r = run_load("127.0.0.1", port, lambda i: req, requests, connections)
        cpu1, me1 = cpu_seconds(proc.pid), time.process_time()
        assert r.statuses == {200: requests}, r.statuses
        return r, (cpu1 - cpu0) / requests, (me1 - me0) / requests
    finally:
        proc.terminate()
        proc.wait(10)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per request body")
    ap.add_argument("names", nargs="*", default=CANDIDATES,
                    help=f"of {', '.join(SERVERS)} (default: the four candidates)")
    args = ap.parse_args()
    print(f"{os.cpu_count()} cpus, {args.requests} requests of {args.tokens} tokens, "
          f"{args.connections} connections")
    runs = {n: [] for n in args.names}
    for _ in range(args.repeat):  # interleaved
        for n in args.names:
            runs[n].append(measure(n, args.requests, args.connections, args.tokens))
    print(f"{'server':<20} {'best req/s':>11} {'median':>9} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'server cpu us/req':>18} {'client':>7}")
    for n, rs in runs.items():
        best, cpu, me = max(rs, key=lambda r: r[0].rate)
        print(f"{n:<20} {best.rate:>11,.0f} {statistics.median(r[0].rate for r in rs):>9,.0f} "
              f"{best.p(50) * 1e3:>7.2f} {best.p(99) * 1e3:>7.2f} "
              f"{statistics.median(r[1] for r in rs) * 1e6:>18.0f} "
              f"{statistics.median(r[2] for r in rs) * 1e6:>7.0f}")


if __name__ == "__main__":
    main()
