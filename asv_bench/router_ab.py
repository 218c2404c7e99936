"""``RouterIndex``'s per-call speed for two checkouts, interleaved in one
process (as ``percall_ab.py``), so that the load of a shared machine falls
on both alike::

    python asv_bench/router_ab.py /work/main /path/to/branch [rounds] [row]

Rows (CPU time, best of the rounds, the side going first alternating):
``apply`` of 16 workers' events from ``PrefixCache``s (own hashes, and
engine hashes of a seed per engine) per stored block; ``apply_wire`` of
vLLM-shaped msgpack batches (random engine hashes) per stored page, without
and with a byte budget; ``overlap`` of a 128-page query on the built index.
Printed: each side's best and the ratio b / a of the bests and medians
(``row``: only the rows whose label holds it, e.g. ``overlap``).
"""

import importlib
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from percall_ab import HOME  # noqa: E402  (sets NUMBA_CACHE_DIR before Numba loads)


def workload(rs, seed=0, n_conv=300, page=16, workers=16):
    """Conversations under shared system prompts over ``workers`` caches
    (bench.py's router workload, smaller), the events per worker."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 32_000, size=page * int(k)) for k in rng.integers(8, 40, 50)]
    caches = [rs.PrefixCache(page_size=page, events=True, values=False) for _ in range(workers)]
    convs = []
    for c in range(n_conv):
        conv = np.concatenate([systems[int(rng.integers(0, 50))],
                               rng.integers(0, 32_000, page * int(rng.integers(80, 120)))])
        convs.append(conv)
        caches[c % workers].insert(conv)
        if c % 4 == 0:
            caches[(c * 7 + 3) % workers].insert(conv[:len(conv) * 3 // 4])
    queries = [np.concatenate([convs[int(rng.integers(0, n_conv))][:int(rng.integers(0, 129))
                                                                   * page],
                               rng.integers(0, 32_000, 128 * page)])[:128 * page]
               for _ in range(100)]
    return [(w, pc.take_events()) for w, pc in enumerate(caches)], queries


def engine(rs, streams):
    """The streams with each block hash replaced by a keyed hash of a seed per engine."""
    def eh(h, s):
        return ((h * 0x9E3779B97F4A7C15 + s) & ((1 << 64) - 1)) ^ (s << 7 & ((1 << 64) - 1))
    out = []
    for w, evs in streams:
        s = 1000 + w
        conv = []
        for e in evs:
            if isinstance(e, rs.BlockStored):
                conv.append(rs.BlockStored([eh(h, s) for h in e.block_hashes],
                                           None if e.parent_block_hash is None
                                           else eh(e.parent_block_hash, s),
                                           e.token_ids, e.block_size))
            elif isinstance(e, rs.BlockRemoved):
                conv.append(rs.BlockRemoved([eh(h, s) for h in e.block_hashes]))
            else:
                conv.append(e)
        out.append((w, conv))
    return out


def rows(rs, batches):
    streams, queries = workload(rs)
    eng = engine(rs, streams)
    n_stored = sum(len(e.block_hashes) for _, evs in streams for e in evs
                   if isinstance(e, rs.BlockStored))
    wire_pages = batches[1]
    built = rs.RouterIndex(page_size=16, workers=range(16))
    for w, evs in eng:
        built.apply(w, evs)

    def apply_all(st):
        def run():
            ix = rs.RouterIndex(page_size=16, workers=range(16))
            for w, evs in st:
                ix.apply(w, evs)
        return run

    def wire(max_bytes):
        def run():
            ix = rs.RouterIndex(page_size=16, workers=[0], strict=False, max_bytes=max_bytes)
            for b in batches[0]:
                ix.apply_wire(0, b)
            assert ix.status(0) == "exact", ix.degraded  # lenient: a wrong lookup would degrade
        return run

    def overlap():
        for q in queries:
            built.overlap(q)

    return [("apply, own hashes (ns per stored block)", apply_all(streams), n_stored),
            ("apply, engine hashes (ns per stored block)", apply_all(eng), n_stored),
            ("apply_wire (ns per stored page)", wire(None), wire_pages),
            ("apply_wire, max_bytes 1 MB (ns per stored page)", wire(1 << 20), wire_pages),
            ("overlap, 128 pages (ns per query)", overlap, len(queries))]


def main(argv):
    if len(argv) not in (2, 3, 4):
        print(__doc__.split("::")[1].strip().splitlines()[0], file=sys.stderr)
        return 2
    rounds = int(argv[2]) if len(argv) >= 3 else 5
    only = argv[3] if len(argv) == 4 else ""
    for name, checkout in zip(("radix_soa_a", "radix_soa_b"), argv[:2]):
        shutil.rmtree(HOME / name, ignore_errors=True)
        shutil.copytree(Path(checkout) / "radix_soa", HOME / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(HOME))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench import _vllm_shaped_batches
    mods = {n: importlib.import_module(n) for n in ("radix_soa_a", "radix_soa_b")}
    batches = _vllm_shaped_batches(np.random.default_rng(0), 16, 200, 20_000)
    sides = {n: [r for r in rows(m, batches) if only in r[0]] for n, m in mods.items()}
    for rs_rows in sides.values():
        for _, fn, _ in rs_rows:
            fn()  # compiled (or loaded) before any timing
    times = {n: [[] for _ in r] for n, r in sides.items()}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for i in range(len(sides["radix_soa_a"])):
            for n in order:
                label, fn, count = sides[n][i]
                t0 = time.process_time()
                fn()
                times[n][i].append((time.process_time() - t0) / count * 1e9)
    print(f"{'row (CPU time; a, b)':<50} {'a':>9} {'b':>9} {'b/a best':>8} {'median':>6}")
    for i, (label, _, _) in enumerate(sides["radix_soa_a"]):
        a, b = times["radix_soa_a"][i], times["radix_soa_b"][i]
        print(f"{label:<50} {min(a):9.1f} {min(b):9.1f} {min(b) / min(a):8.3f} "
              f"{statistics.median(b) / statistics.median(a):6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
