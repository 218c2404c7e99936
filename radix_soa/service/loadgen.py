"""A small HTTP/1.1 load generator: a fixed count of requests over a few
keep-alive connections, each request's latency recorded.

Written on asyncio's protocol layer (no HTTP client library) so that the
client, which shares the machine's cores with the server under test, costs
a few microseconds per request: with a general client (aiohttp's, urllib)
the client would be the bottleneck of a loopback test.

>>> percentile([1.0, 2.0, 3.0, 4.0], 50)
2.0
"""

import asyncio
import math
import time
from typing import Callable, List, NamedTuple

__all__ = ["LoadResult", "run_load", "percentile"]


class LoadResult(NamedTuple):
    """``requests`` sent and answered, ``seconds`` from the first sent to the
    last answered, ``latencies`` (seconds, one per request), ``statuses``
    (HTTP status -> count) and the last ``body`` of each status."""
    requests: int
    seconds: float
    latencies: List[float]
    statuses: dict
    bodies: dict

    @property
    def rate(self):
        """Requests per second."""
        return self.requests / self.seconds if self.seconds > 0 else math.inf

    def p(self, q):
        """The ``q``-th percentile of the latencies, in seconds."""
        return percentile(sorted(self.latencies), q)


def percentile(ordered, q):
    """The ``q``-th percentile (nearest rank) of an ascending list."""
    if not ordered:
        return math.nan
    k = max(0, math.ceil(q / 100 * len(ordered)) - 1)
    return ordered[min(k, len(ordered) - 1)]


def request_bytes(host, port, path, body, method="POST"):
    """One HTTP/1.1 keep-alive request with a JSON body."""
    head = (f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode("ascii") + body


class _Conn(asyncio.Protocol):
    """One connection: sends a request, waits for its whole response."""

    def __init__(self):
        self.buf = bytearray()
        self.waiter = None  # the future of the request in flight
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.buf += data
        self._check()

    def connection_lost(self, exc):
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc or ConnectionError("the server closed the connection"))

    def _check(self):
        w = self.waiter
        if w is None or w.done():
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buf[:end]).decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if len(self.buf) < end + 4 + length:
            return
        status = int(head.split(" ", 2)[1])
        body = bytes(self.buf[end + 4:end + 4 + length])
        del self.buf[:end + 4 + length]
        w.set_result((status, body))

    async def send(self, data):
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        self._check()
        return await self.waiter


async def _run(host, port, make, count, connections):
    loop = asyncio.get_running_loop()
    conns = [(await loop.create_connection(_Conn, host, port))[1] for _ in range(connections)]
    latencies = []
    statuses = {}
    bodies = {}
    left = [count]

    async def worker(c):
        while left[0] > 0:
            left[0] -= 1
            data = make(count - left[0] - 1)
            t = time.perf_counter()
            status, body = await c.send(data)
            latencies.append(time.perf_counter() - t)
            statuses[status] = statuses.get(status, 0) + 1
            bodies[status] = body

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    seconds = time.perf_counter() - t0
    for c in conns:
        c.transport.close()
    return LoadResult(len(latencies), seconds, latencies, statuses, bodies)


def run_load(host: str, port: int, make: Callable[[int], bytes], count: int,
             connections: int = 8, uvloop: bool = True) -> LoadResult:
    """Send ``count`` requests (``make(i)``: the bytes of request ``i``, as
    ``request_bytes`` builds them) over ``connections`` keep-alive
    connections, each waiting for its answer before sending the next; stops
    by itself once all are answered."""
    if uvloop:
        try:
            import uvloop as _uvloop
            return _uvloop.run(_run(host, port, make, count, connections))
        except ImportError:
            pass
    return asyncio.run(_run(host, port, make, count, connections))
