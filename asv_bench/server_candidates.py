"""Which HTTP server the router service runs on: the same hello-world
JSON handler (parse a body of 64 tokens, answer one small JSON object) on
each candidate, in its own process, driven by radix_soa's keep-alive load
generator over loopback (8 connections, a fixed count of requests).

    python asv_bench/server_candidates.py [--requests 20000] [--repeat 3]

Candidates: the stdlib ThreadingHTTPServer (the floor: no dependency),
aiohttp's web server (on uvloop), a bare ASGI app and a Starlette app
under uvicorn with httptools and uvloop.
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
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def measure(name, requests, connections):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVERS[name], str(port)])
    try:
        wait_port(port, proc)
        req = request_bytes("127.0.0.1", port, "/route",
                            json.dumps({"tokens": list(range(64))}).encode())
        run_load("127.0.0.1", port, lambda i: req, 500, connections)  # warm
        r = run_load("127.0.0.1", port, lambda i: req, requests, connections)
        assert r.statuses == {200: requests}, r.statuses
        return r
    finally:
        proc.terminate()
        proc.wait(10)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("names", nargs="*", default=list(SERVERS))
    args = ap.parse_args()
    print(f"{os.cpu_count()} cpus, {args.requests} requests, {args.connections} connections")
    runs = {n: [] for n in args.names}
    for _ in range(args.repeat):  # interleaved
        for n in args.names:
            runs[n].append(measure(n, args.requests, args.connections))
    print(f"{'server':<20} {'best req/s':>11} {'median':>9} {'p50 ms':>7} {'p99 ms':>7}")
    for n, rs in runs.items():
        best = max(rs, key=lambda r: r.rate)
        print(f"{n:<20} {best.rate:>11,.0f} {statistics.median(r.rate for r in rs):>9,.0f} "
              f"{best.p(50) * 1e3:>7.2f} {best.p(99) * 1e3:>7.2f}")


if __name__ == "__main__":
    main()
