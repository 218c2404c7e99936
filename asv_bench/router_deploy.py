"""Two figures of the router service in a deployment (issue 35).

    python asv_bench/router_deploy.py checkpoint [--pairs 1000000]
    python asv_bench/router_deploy.py upload [--events 250000] [--repeat 2]

``checkpoint``: an index of ``--pairs`` cached (worker, page) pairs (8
workers, runs of 32 pages) checkpointed three times: the copy taken under
the index's lock (the only pause routing sees), the write of that copy
(its own thread), the bytes, and the load back; medians.

``upload``: ``GET /healthz`` asked in a loop (one connection each, 10 ms
apart) while one ``POST /events`` of ``--events`` single-page stored runs
(~58 MB of JSON for 250,000) is read, parsed and applied; the longest and
median ``/healthz`` answer, per run. Run it on two checkouts
(``PYTHONPATH=...``) to compare them.
"""

import argparse
import http.client
import json
import os
import statistics
import tempfile
import threading
import time

import numpy as np

import radix_soa as rs

PAGE = 16


def checkpoint(pairs):
    from radix_soa.service import checkpoint as ck
    ix = rs.RouterIndex(page_size=PAGE, workers=[f"w{i}" for i in range(8)], strict=False)
    rng = np.random.default_rng(0)
    n, run = 0, 0
    while n < pairs:
        hashes = [int(x) for x in rng.integers(1, 2**62, 32)]
        ix.apply(f"w{run % 8}", [rs.BlockStored(hashes, None, [int(x) for x in rng.integers(
            0, 50_000, 32 * PAGE)], PAGE)])
        n += 32
        run += 1
    d = os.path.join(tempfile.mkdtemp(), "state")
    copies, writes, loads, size = [], [], [], 0
    for _ in range(3):
        t0 = time.perf_counter()
        state = ck.snapshot(ix)
        copies.append(time.perf_counter() - t0)
        info = ck.save(d, state, {})
        writes.append(info["seconds"])
        size = info["bytes"]
        t0 = time.perf_counter()
        ck.load(d)
        loads.append(time.perf_counter() - t0)
    print(json.dumps({"pairs": n, "copy_ms": round(statistics.median(copies) * 1e3, 1),
                      "write_s": round(statistics.median(writes), 3), "bytes": size,
                      "bytes_per_pair": round(size / n, 1),
                      "load_s": round(statistics.median(loads), 3)}))


def upload(events, repeat):
    from radix_soa.service import RouterService
    body = json.dumps({"worker": "w0", "events": [
        {"type": "BlockStored", "block_hashes": [i + 1], "parent_block_hash": None,
         "token_ids": list(range(i, i + PAGE)), "block_size": PAGE} for i in range(events)]
    }).encode()
    for _ in range(repeat):
        svc = RouterService(rs.RouterIndex(page_size=PAGE, workers=["w0"], strict=False))
        svc.start()
        took = []

        def post():
            c = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=600)
            t0 = time.perf_counter()
            c.request("POST", "/events", body)
            c.getresponse().read()
            took.append(time.perf_counter() - t0)

        t = threading.Thread(target=post)
        t.start()
        lat = []
        while t.is_alive():
            c = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=600)
            t0 = time.perf_counter()
            c.request("GET", "/healthz")
            c.getresponse().read()
            lat.append(time.perf_counter() - t0)
            c.close()
            time.sleep(0.01)
        svc.stop()
        print(json.dumps({"body_mb": round(len(body) / 1e6, 1), "post_s": round(took[0], 2),
                          "healthz": len(lat),
                          "healthz_median_ms": round(statistics.median(lat) * 1e3, 1),
                          "healthz_max_ms": round(max(lat) * 1e3, 1)}))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["checkpoint", "upload"])
    p.add_argument("--pairs", type=int, default=1_000_000)
    p.add_argument("--events", type=int, default=250_000)
    p.add_argument("--repeat", type=int, default=2)
    a = p.parse_args()
    if a.what == "checkpoint":
        checkpoint(a.pairs)
    else:
        upload(a.events, a.repeat)


if __name__ == "__main__":
    main()
