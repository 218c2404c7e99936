"""Headline ratios, measured side by side in one run.

    python asv_bench/bench.py                 # every section (about 7 minutes)
    python asv_bench/bench.py core replay     # some sections
    python asv_bench/bench.py --quick         # every section on about 1/10 of the data, 1 repeat

Each line compares radix_soa with its named baseline on the same data in the
same process; ratios > 1 mean radix_soa is faster (or smaller). Progress
(each section as it starts, the long steps inside it, the time each took)
goes to stderr, the results to stdout. ``--quick`` answers "does it run, and
roughly" in about a minute; its ratios are noisier than a full run's, and
those of the per-call sections are smaller, since fixed costs weigh more on
small data.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchmarks import common  # noqa: E402

import radix_soa  # noqa: E402


#: Set by ``--quick``: every workload is cut to about 1/10 (see ``size``).
QUICK = False
_T0 = time.perf_counter()


def progress(msg):
    """One line to stderr, with the seconds since the run started."""
    print(f"[bench {time.perf_counter() - _T0:6.1f} s] {msg}", file=sys.stderr, flush=True)


def size(full, quick):
    return quick if QUICK else full


def sequences(name):
    """``common.sequences(name)``, cut to its first tenth under ``--quick``."""
    seqs = common.sequences(name)
    return seqs[:max(1, len(seqs) // 10)] if QUICK else seqs


def inputs(name, kind):
    seqs = sequences(name)
    return seqs if kind == "numpy" else tuple(s.tolist() for s in seqs)


def near_misses(name):
    return common.near_misses(name)[:len(sequences(name))]


def head(trace, n):
    """The first ``n`` requests of ``trace`` (all of it when shorter)."""
    if len(trace) <= n:
        return trace
    return radix_soa.traces.Trace.from_sequences(
        [trace[i] for i in range(n)], name=f"{trace.name} (first {n:,} requests)",
        timestamps=trace.timestamps[:n], input_tokens=trace.input_tokens[:n],
        output_tokens=trace.output_tokens[:n], namespace=trace.namespace[:n],
        block_size=trace.block_size)


def best_of(fn, repeat=3, setup=None):
    """Best wall time of ``fn`` over ``repeat`` runs (``setup`` untimed)."""
    best = float("inf")
    for _ in range(repeat):
        arg = setup() if setup else None
        t0 = time.perf_counter()
        fn(arg) if setup else fn()
        best = min(best, time.perf_counter() - t0)
    return best


def line(what, ours, base, base_name):
    print(f"  {what:<48} radix_soa {ours * 1e3:9.2f} ms   {base_name} {base * 1e3:9.2f} ms"
          f"   ratio {base / ours:7.2f}x")


def section_core(repeat):
    radix_soa.warmup()
    for wl in common.WORKLOADS:
        seqs = sequences(wl)
        ntok = sum(len(s) for s in seqs)
        progress(f"core: workload {wl}")
        print(f"\n[core] workload {wl}: {len(seqs):,} sequences, {ntok:,} tokens")
        for kind in ("numpy", "list"):
            data = inputs(wl, kind)

            def insert_all(tree, data=data):
                for s in data:
                    tree.insert(s)

            ours = best_of(insert_all, repeat, setup=lambda: common.make("radix_soa"))
            base = best_of(insert_all, repeat, setup=lambda: common.make("reference"))
            line(f"insert, one at a time ({kind} input)", ours, base, "reference")
            rc = common.build("radix_soa", seqs)
            ref = common.build("reference", seqs)
            ours = best_of(lambda: [rc.exists(s) for s in data], repeat)
            base = best_of(lambda: [ref.exists(s) for s in data], repeat)
            line(f"exists, one at a time ({kind} input)", ours, base, "reference")
            misses = near_misses(wl)
            if kind == "list":
                misses = [m.tolist() for m in misses]
            ours = best_of(lambda: [rc.match_prefix(s) for s in misses], repeat)
            base = best_of(lambda: [ref.match_prefix(s) for s in misses], repeat)
            line(f"match_prefix, near misses ({kind} input)", ours, base, "reference")
        for dtype in ("int64", "int32"):
            rc = radix_soa.RadixCache(dtype=dtype)
            for s in seqs:
                rc.insert(s)
            rep = rc.memory_report()
            tok = rep["arrays"]["tokens"]["used_bytes"]
            print(f"  memory {dtype}: {rep['bytes_per_stored_token']:.3f} used bytes per stored token; "
                  f"{tok / rc.num_tokens:.3f} token bytes per stored token + "
                  f"{rep['bytes_per_node']:.2f} bytes per node "
                  f"({rc.num_nodes:,} nodes, {rc.num_tokens:,} stored tokens)")
    code = ("import time; t=time.perf_counter(); import radix_soa; rc=radix_soa.RadixCache(); "
            "rc.insert([1,2,3]); rc.exists([1,2,3]); rc.match_prefix([1,2]); rc.remove([1,2,3]); "
            "print(time.perf_counter()-t)")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)  # warm the cache
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
        times.append((time.perf_counter() - t0, float(out.stdout)))
    wall, inproc = min(times)
    print(f"\n[core] fresh process, warm on-disk cache: import + first calls {inproc * 1e3:.0f} ms "
          f"(whole interpreter {wall * 1e3:.0f} ms)")


def section_batch(repeat):
    import numba

    radix_soa.warmup()
    try:
        import pyarrow as pa
    except ImportError:
        pa = None
    threads = numba.get_num_threads()
    for wl in ("shared_prefix", "multi_turn", "long_shared_prefix"):
        seqs = sequences(wl)
        progress(f"batch: workload {wl}")
        batch = radix_soa.pack(seqs)
        print(f"\n[batch] workload {wl}: {len(batch):,} sequences, {batch.num_tokens:,} tokens")
        ref = common.build("reference", seqs)
        rc = radix_soa.RadixCache()
        rc.insert_batch(batch)
        csr = (batch.flat, batch.offsets)
        for name, call, ref_call in (
                ("exists_batch", rc.exists_batch, ref.exists),
                ("match_prefix_batch", rc.match_prefix_batch, ref.match_prefix)):
            ours = best_of(lambda: call(csr, parallel=False), repeat)
            base = best_of(lambda: [ref_call(s) for s in seqs], max(1, repeat - 1))
            line(f"{name} (CSR, 1 thread)", ours, base, "reference loop")
            ours = best_of(lambda: call(csr), repeat)
            line(f"{name} (CSR, default parallel=None)", ours, base, "reference loop")
        copy = batch.flat.copy()
        floor = best_of(lambda: np.array_equal(batch.flat, copy), repeat)
        one = best_of(lambda: rc.exists_batch(csr, parallel=False), repeat)
        par = best_of(lambda: rc.exists_batch(csr, parallel=True), repeat)
        print(f"  exists_batch vs np.array_equal(flat, copy) {floor * 1e3:.2f} ms: "
              f"1 thread {one / floor:.2f}x, {threads} threads {par / floor:.2f}x of the floor")
        ours = best_of(lambda rc: rc.insert_batch(csr), repeat, setup=radix_soa.RadixCache)

        def ref_insert(tree):
            for s in seqs:
                tree.insert(s)

        base = best_of(ref_insert, max(1, repeat - 1), setup=lambda: common.make("reference"))
        line("insert_batch into an empty tree (numpy seqs)", ours, base, "reference loop")
        lists = inputs(wl, "list")
        base = best_of(lambda tree: [tree.insert(s) for s in lists],
                       max(1, repeat - 1), setup=lambda: common.make("reference"))
        line("insert_batch into an empty tree (list seqs)", ours, base, "reference loop")
        if pa is not None:
            arr = pa.ListArray.from_arrays(pa.array(batch.offsets.astype(np.int32)), pa.array(batch.flat))
            for name, call in (("exists_batch", rc.exists_batch), ("match_prefix_batch", rc.match_prefix_batch)):
                t_csr = best_of(lambda: call(csr, parallel=False), repeat)
                t_arrow = best_of(lambda: call(arr, parallel=False), repeat)
                print(f"  {name}: Arrow ListArray {t_arrow * 1e3:.2f} ms vs CSR {t_csr * 1e3:.2f} ms "
                      f"= {t_arrow / t_csr:.3f}x")
    print(f"\n[batch] parallel=None threshold check (serial vs {threads} threads, chat sequences):")
    seqs = sequences("shared_prefix")
    rc = radix_soa.RadixCache()
    rc.insert_batch(seqs)
    for n in (1, 4, 16, 64, 256, 1024):
        b = radix_soa.pack(seqs[:n])
        t_s = best_of(lambda: rc.exists_batch(b, parallel=False), repeat + 2)
        t_p = best_of(lambda: rc.exists_batch(b, parallel=True), repeat + 2)
        print(f"  {n:5d} sequences ({b.num_tokens:8,d} tokens): serial {t_s * 1e6:8.1f} us, "
              f"parallel {t_p * 1e6:8.1f} us, default picks "
              f"{'parallel' if radix_soa._input.batch.use_parallel(None, [b]) else 'serial'}")


def section_prefix(repeat):
    from radix_soa.baselines.reference_prefix import ReferencePrefixCache

    radix_soa.warmup()
    rng = np.random.default_rng(0)
    print("\n[prefix] match on long shared prefixes: 32 cached prefixes of 8,192 tokens; each query")
    print("  is a prefix + a fresh 64-token tail, built just before the call (hot in cache, like a")
    print("  freshly tokenized request); the sum of the match calls alone is timed")
    prefixes = [rng.integers(0, 32_000, size=8192) for _ in range(32)]
    for values in (True, False):
        pc = radix_soa.PrefixCache(values=values)
        ref = ReferencePrefixCache(values=values)
        for p in prefixes:
            pc.insert(p, values=p if values else None)
            ref.insert(p, values=p if values else None)
        picks = rng.integers(0, 32, size=400).tolist()
        tails = [rng.integers(0, 32_000, size=64) for _ in picks]

        def per_token(cache):
            best = float("inf")
            for _ in range(repeat):
                total = 0.0
                ntok = 0
                for w, tail in zip(picks, tails):
                    q = np.concatenate([prefixes[w], tail])
                    t0 = time.perf_counter()
                    cache.match(q)
                    total += time.perf_counter() - t0
                    ntok += q.shape[0]
                best = min(best, total / ntok)
            return best

        ours, base = per_token(pc), per_token(ref)
        print(f"  match per token (values={values}): radix_soa {ours * 1e9:.2f} ns, reference "
              f"{base * 1e9:.2f} ns, ratio {base / ours:.1f}x")

    print("\n[prefix] evict 100,000 tokens from a tree of ~2,000 leaves")
    seqs = radix_soa.workloads.shared_prefix(n_sequences=2000, n_prompts=20, prompt_len=400,
                                             tail_len=(50, 250), seed=1)

    def fill(cls):
        cache = cls()
        for s in seqs:
            cache.insert(s, values=s)
        return cache

    leaves = fill(radix_soa.PrefixCache)
    print(f"  {leaves.num_nodes:,} nodes, {leaves.total_tokens:,} tokens")
    ours = best_of(lambda c: c.evict(100_000), repeat + 2, setup=lambda: fill(radix_soa.PrefixCache))
    base = best_of(lambda c: c.evict(100_000), repeat, setup=lambda: fill(ReferencePrefixCache))
    line("evict(100_000)", ours, base, "reference heap-of-leaves")
    small = best_of(lambda c: c.evict(64), repeat + 2, setup=lambda: fill(radix_soa.PrefixCache))
    base_small = best_of(lambda c: c.evict(64), repeat, setup=lambda: fill(ReferencePrefixCache))
    line("evict(64) (cost follows what is evicted)", small, base_small, "reference heap-of-leaves")
    pc = fill(radix_soa.PrefixCache)
    handles = [pc.match(s).node for s in seqs[:500]]

    def lock_cycle():
        for h in handles:
            pc.lock(h)
        for h in handles:
            pc.unlock(h)

    t = best_of(lock_cycle, repeat)
    print(f"  lock + unlock: {t / len(handles) * 1e6:.2f} us per pair")

    print("\n[prefix] memory (used array bytes)")
    for values in (True, False):
        pc = radix_soa.PrefixCache(values=values)
        for s in seqs:
            pc.insert(s, values=s if values else None)
        rep = pc.memory_report()
        per_tok = rep["arrays"]["tokens"]["used_bytes"] + rep["arrays"]["values"]["used_bytes"]
        print(f"  values={values}: {per_tok / pc.total_tokens:.2f} bytes per token, "
              f"{rep['bytes_per_node']:.1f} bytes per node ({pc.num_nodes:,} nodes)")


def section_memory(repeat):
    import tempfile

    from radix_soa.baselines.reference import ReferenceRadixTree
    import tracemalloc

    radix_soa.warmup()
    seqs = sequences("shared_prefix")
    print(f"\n[memory] shared_prefix workload ({len(seqs):,} sequences)")
    for dtype, width in (("int64", 8), ("int32", 4)):
        rc = radix_soa.RadixCache(dtype=dtype)
        rc.insert_batch(seqs)
        rep = rc.memory_report()
        budget = width * rep["tokens_stored"] + 48 * rep["nodes"]
        print(f"  {dtype}: used {rep['used_bytes']:,} bytes = {rep['used_bytes'] / budget:.3f} of the "
              f"budget {width} B/token + 48 B/node ({rep['bytes_per_node']:.1f} B per node); "
              f"allocated {rep['total_bytes']:,} = {rep['total_bytes'] / rep['used_bytes']:.2f}x used")
        if dtype == "int64":
            ours = rep["used_bytes"]
    tracemalloc.start()
    ref = ReferenceRadixTree()
    for s in seqs:
        ref.insert(s)
    ref_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(f"  pure-Python object radix tree: {ref_bytes:,} bytes (tracemalloc) = "
          f"{ref_bytes / ours:.1f}x the int64 tree's used bytes")

    n_big = size(25_000, 2_500)
    progress(f"memory: load(mmap=True) of a tree of {n_big:,} sequences")
    print(f"\n[memory] load(mmap=True) of a tree with ~{n_big * 400:,} stored tokens")
    big = radix_soa.workloads.shared_prefix(n_sequences=n_big, tail_len=(300, 500), seed=3)
    batch = radix_soa.pack(big)
    rc = radix_soa.RadixCache()
    rc.insert_batch(batch)
    with tempfile.TemporaryDirectory() as tmp:
        rc.save(tmp + "/t")
        loads, ratios = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            mm = radix_soa.RadixCache.load(tmp + "/t", mmap=True)
            loads.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            mm.exists_batch(batch, parallel=False)
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            rc.exists_batch(batch, parallel=False)
            ratios.append(first / (time.perf_counter() - t0))
            del mm
        print(f"  {rc.num_tokens:,} stored tokens: mmap load {min(loads) * 1e3:.1f} ms; first "
              f"exists_batch on it {np.median(ratios):.2f}x the in-memory tree's (median of {repeat})")


def section_load_check(repeat):
    """What the structural check costs every load: the load (copied and
    memory-mapped) beside the check alone, and beside the bounds-only check
    loads ran before (``check_bounds``), per million nodes and per GB."""
    import tempfile

    from radix_soa._tree.invariants import check_bounds, check_tree

    n_short, n_chat = size(1_000_000, 100_000), size(200_000, 20_000)
    progress(f"load_check: a tree of {n_short:,} short sequences, a chat cache of {n_chat:,}")
    short = radix_soa.RadixCache()
    short.insert_batch(common.short_corpus(n_short))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 50_000, rng.integers(200, 2_000)) for _ in range(200)]
    chat = radix_soa.PrefixCache()
    for i in range(n_chat):
        q = np.concatenate([prompts[i % 200], rng.integers(0, 50_000, rng.integers(1, 200))])
        chat.insert(q, values=q)
    print("\n[load_check] every load runs the full structural check (check_invariants')")
    for name, tree, canonical in (("short sequences", short, True), ("chat", chat, False)):
        with tempfile.TemporaryDirectory() as tmp:
            tree.save(tmp + "/t")
            gb = sum(os.path.getsize(os.path.join(tmp, "t", f))
                     for f in os.listdir(tmp + "/t")) / 1e9
            mnodes = tree.num_nodes / 1e6
            cls = type(tree)
            cls.load(tmp + "/t")  # compiles what a load runs, outside the timing
            full = best_of(lambda: check_tree(tree._s, full=True, canonical=canonical), repeat)
            bounds = best_of(lambda: check_bounds(tree._s), repeat)
            print(f"  {name}: {tree.num_nodes:,} nodes, {gb:.3f} GB on disk; the check "
                  f"{full:.3f} s ({full / mnodes:.2f} s per M nodes) vs bounds only {bounds:.3f} s")
            for mmap in (False, True):
                t = best_of(lambda: cls.load(tmp + "/t", mmap=mmap), repeat)
                print(f"    load(mmap={mmap}): {t:.3f} s = {t / gb:.2f} s per GB, of which the "
                      f"check {full / t:.0%} (bounds only would be {(t - full + bounds):.3f} s)")


def section_replay(repeat):
    from radix_soa.baselines.replay_reference import replay_reference

    radix_soa.warmup()
    trace = common.mooncake_conversation()
    if trace is None:
        print("\n[replay] the Mooncake traces are not present; using the generated multi_turn workload")
        trace = radix_soa.workloads.as_trace(common.sequences("multi_turn"), "multi_turn")
    if QUICK:
        trace = head(trace, 1_000)
    full = radix_soa.replay(trace)
    caps = np.linspace(full.peak_ids / 40, full.peak_ids, 20).astype(int).tolist()
    print(f"\n[replay] {trace.name}: {len(trace):,} requests, {trace.num_blocks:,} ids; unbounded "
          f"hit rate {full.hit_rate:.4f}; 20 capacities up to {full.peak_ids:,}")
    radix_soa.replay(trace, capacity=caps[5])
    one = best_of(lambda: radix_soa.replay(trace, capacity=caps[5]), repeat + 2)
    print(f"  one replay at capacity {caps[5]:,}: {one * 1e3:.1f} ms")
    for threads in (1, 2):
        t = best_of(lambda: radix_soa.sweep(trace, caps, threads=threads), repeat)
        print(f"  20-point sweep, {threads} thread(s): {t * 1e3:.0f} ms")
    # the pure-Python replay takes ~80 s per capacity on the Mooncake trace:
    # compare on 4 of them (1 under --quick)
    few = caps[5:6] if QUICK else caps[::5]
    ours = best_of(lambda: radix_soa.sweep(trace, few, threads=1), repeat)
    t0 = time.perf_counter()
    for i, c in enumerate(few):
        progress(f"replay: pure-Python replay {i + 1} of {len(few)} (capacity {c:,})")
        replay_reference(trace, capacity=c)
    base = time.perf_counter() - t0
    line(f"sweep of {len(few)} capacities (1 thread)", ours, base, "pure-Python replay")
    for sched in ("lpm", "dfs"):
        t = best_of(lambda: radix_soa.replay(trace, capacity=caps[5], schedule=sched), repeat)
        print(f"  one replay, schedule={sched}: {t * 1e3:.1f} ms")
    t = best_of(lambda: radix_soa.replay(trace, capacity=caps[5], host_capacity=caps[10]), repeat)
    print(f"  one replay with a host tier: {t * 1e3:.1f} ms")


def section_cluster(repeat):
    """One replay against the same trace replayed over 8 workers behind each
    router (target: under 100 ms on the Mooncake conversation trace), and
    the compiled cluster replay against the pure-Python one."""
    from radix_soa.baselines.cluster_reference import cluster_reference

    trace = common.mooncake_conversation()
    if trace is None:
        print("\n[cluster] the Mooncake traces are not present; using the generated multi_turn "
              "workload")
        trace = radix_soa.workloads.as_trace(common.sequences("multi_turn"), "multi_turn")
    if QUICK:
        trace = head(trace, 1_000)
    cap = 20_000
    print(f"\n[cluster] {trace.name}: {len(trace):,} requests, capacity {cap:,} ids per worker")
    radix_soa.replay(trace, capacity=cap)
    one = best_of(lambda: radix_soa.replay(trace, capacity=cap), repeat + 2)
    print(f"  one replay: {one * 1e3:.1f} ms")
    from radix_soa.studies.cluster import ROUTERS

    for router in ROUTERS:
        radix_soa.replay_cluster(trace, workers=8, capacity=cap, router=router)  # compile
        t = best_of(lambda: radix_soa.replay_cluster(trace, workers=8, capacity=cap,
                                                     router=router), repeat + 2)
        r = radix_soa.replay_cluster(trace, workers=8, capacity=cap, router=router)
        print(f"  8 workers, {router:<12}: {t * 1e3:6.1f} ms ({t / one:4.1f}x one replay)"
              f"   hit rate {r.hit_rate:.4f}, load imbalance {r.load_imbalance:.3f}")
    small = head(trace, 500 if QUICK else 2_000)
    ours = best_of(lambda: radix_soa.replay_cluster(small, workers=8, capacity=cap), repeat)
    progress(f"cluster: pure-Python cluster replay of {len(small):,} requests")
    t0 = time.perf_counter()
    cluster_reference(small, workers=8, capacity=cap)
    base = time.perf_counter() - t0
    line(f"8 workers, cache_aware, {len(small):,} requests", ours, base, "pure-Python")


def section_threads(repeat):
    """Serial batch reads release the GIL: k threads reading one cache at
    once, against one thread doing 1/k of the work (throughput ratio)."""
    import threading

    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 50_000, size=int(k))
            for k in rng.integers(20, 100, size=size(200_000, 20_000))]
    rc = radix_soa.RadixCache()
    rc.insert_batch(seqs)
    batch = radix_soa.pack(seqs)
    rc.exists_batch(batch, parallel=False)

    def readers(k):
        threads = [threading.Thread(target=rc.exists_batch, args=(batch,),
                                    kwargs={"parallel": False}) for _ in range(k)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    print(f"\n[threads] exists_batch of {len(seqs):,} sequences per thread, {os.cpu_count()} cpus")
    one = best_of(lambda: readers(1), repeat + 2)
    for k in (2, os.cpu_count() or 2):
        many = best_of(lambda: readers(k), repeat + 2)
        print(f"  {k} reader threads: {many * 1e3:8.1f} ms for {k}x the work of one thread "
              f"({one * 1e3:.1f} ms): throughput {k * one / many:.2f}x one thread")
        if k == os.cpu_count():
            break


class SlotPool:
    """KV slot ids on a NumPy stack: take and give back runs at once."""

    def __init__(self, n):
        self.free = np.arange(n, dtype=np.int64)
        self.top = n

    def take(self, k):
        self.top -= k
        return self.free[self.top:self.top + k]

    def give(self, slots):
        k = slots.shape[0]
        self.free[self.top:self.top + k] = slots
        self.top += k


def serve(pc, requests, output_len, pool):
    """The toy serving loop with the lifecycle API: begin (match + lock),
    slots for the uncached tokens (evicting the shortfall), finish (insert,
    unlock, slots to free)."""
    outputs = np.arange(output_len, dtype=np.int64) + 1_000_000
    for q in requests:
        r = pc.begin(q)
        need = q.shape[0] - r.cached + output_len
        if need > pool.top:  # evicted slots land on the pool's free end in place
            pool.top += pc.evict(need - pool.top, out=pool.free[pool.top:]).num_tokens
        slots = np.concatenate([r.values, pool.take(need)])
        done = pc.finish(r, np.concatenate([q, outputs]), slots)
        pool.give(done.free)
        if done.evicted.num_tokens:
            pool.give(done.evicted.values)


def section_serving(repeat):
    """Requests per second of the toy serving loop, and insert_batch
    against a loop of insert."""
    radix_soa.warmup()
    requests = sequences("multi_turn")
    tokens = sum(len(q) for q in requests)
    print(f"\n[serving] multi_turn: {len(requests):,} requests, {tokens:,} tokens")
    # a twentieth of the tokens: below the working set, so the loop evicts
    # (a quarter never does on multi_turn); twice the tokens: it never must
    for pool_size in (tokens // 20, 2 * tokens):
        evicted = []

        def run(pool):
            pc = radix_soa.PrefixCache()
            serve(pc, requests, 16, pool)
            evicted.append(pc.stats["evicted_tokens"])

        t = best_of(run, repeat, setup=lambda: SlotPool(pool_size))
        print(f"  serving loop, slot pool {pool_size:,}: {len(requests) / t:,.0f} requests/s "
              f"({t / len(requests) * 1e6:.1f} µs per request; {evicted[-1]:,} tokens evicted)")
    vals = [np.arange(len(q), dtype=np.int64) for q in requests]

    def loop():
        pc = radix_soa.PrefixCache()
        for q, v in zip(requests, vals):
            pc.insert(q, values=v)

    batch = radix_soa.pack(requests)
    vbatch = radix_soa.pack(vals)
    ours = best_of(lambda: radix_soa.PrefixCache().insert_batch(batch, values=vbatch), repeat)
    base = best_of(loop, repeat)
    line("PrefixCache.insert_batch (multi_turn build)", ours, base, "loop of insert")
    # short requests, where the per-call cost is what a loop pays for
    rng = np.random.default_rng(0)
    n_short = size(100_000, 10_000)
    heads = [rng.integers(0, 32_000, size=int(k)) for k in rng.integers(20, 60, size=1000)]
    requests = [np.concatenate([heads[int(h)], rng.integers(0, 32_000, size=int(k))])
                for h, k in zip(rng.integers(0, 1000, size=n_short),
                                rng.integers(1, 40, size=n_short))]
    vals = [np.arange(len(q), dtype=np.int64) for q in requests]
    batch, vbatch = radix_soa.pack(requests), radix_soa.pack(vals)
    ours = best_of(lambda: radix_soa.PrefixCache().insert_batch(batch, values=vbatch), repeat)
    base = best_of(loop, repeat)
    line(f"PrefixCache.insert_batch ({n_short // 1000}k short requests)", ours, base,
         "loop of insert")


def short_requests(n, seed=0):
    """The serving section's short requests: one of 1,000 heads of 20..60
    tokens and a tail of 1..40."""
    rng = np.random.default_rng(seed)
    heads = [rng.integers(0, 32_000, size=int(k)) for k in rng.integers(20, 60, size=1000)]
    return [np.concatenate([heads[int(h)], rng.integers(0, 32_000, size=int(k))])
            for h, k in zip(rng.integers(0, 1000, size=n), rng.integers(1, 40, size=n))]


def scheduler_steps(requests, step=256, output_len=16):
    """The inputs of every step of ``step`` requests: the prompts (begin,
    then a checkpoint of the whole prompt) and prompt + output (finish),
    each with its values (one slot per token), as ``Batch`` es."""
    outputs = np.arange(output_len, dtype=np.int64) + 1_000_000
    steps = []
    slot = 0
    for a in range(0, len(requests), step):
        chunk = requests[a:a + step]
        full = [np.concatenate([q, outputs]) for q in chunk]
        vals = []
        for q in full:
            vals.append(np.arange(slot, slot + len(q), dtype=np.int64))
            slot += len(q)
        steps.append((radix_soa.pack(chunk), radix_soa.pack([v[:len(q)] for v, q in zip(vals, chunk)]),
                      radix_soa.pack(full), radix_soa.pack(vals)))
    return steps


def run_steps_batched(pc, steps):
    for prompts, pvals, full, fvals in steps:
        rb, _ = pc.begin_batch(prompts)
        pc.checkpoint_batch(rb, prompts, pvals)
        pc.finish_batch(rb, full, fvals)


def run_steps_per_request(pc, steps):
    for prompts, pvals, full, fvals in steps:
        rs_ = [pc.begin(q) for q in prompts]
        for r, q, v in zip(rs_, prompts, pvals):
            pc.checkpoint(r, q, v)
        for r, q, v in zip(rs_, full, fvals):
            pc.finish(r, q, v)


def floor_steps(steps, floor):
    """The Numba compare loop over every token each call of every step is
    handed (the prompts twice, prompt + output once), against a copy."""
    done = []
    for prompts, _, full, _ in steps:
        for b in (prompts, prompts, full):
            out = np.empty(len(b), np.bool_)
            floor(b.flat, b.flat.copy(), b.offsets, out)  # the copy is made outside the timing
            done.append(out)
    return done


def section_scheduler_step(repeat):
    """A scheduler step of 256 requests (begin_batch, checkpoint_batch,
    finish_batch, one kernel call each) against the loop of per-request
    calls, and against a Numba compare loop over the same tokens (the floor
    a step that reads its tokens once per call pays)."""
    radix_soa.warmup()
    floor = _compare_floor()
    for name, requests in (("multi_turn", list(sequences("multi_turn"))),
                           ("short", short_requests(size(20_000, 2000)))):
        steps = scheduler_steps(requests)
        n = len(requests)
        tokens = sum(len(q) for q in requests)
        copies = [[(b.flat, b.flat.copy(), b.offsets, np.empty(len(b), np.bool_))
                   for b in (p, p, f)] for p, _, f, _ in steps]

        def floor_run():
            for calls in copies:
                for args in calls:
                    floor(*args)

        floor_run()
        # the same requests twice per run: the first pass misses, the second hits
        calls = {
            "batched": lambda: run_steps_batched(radix_soa.PrefixCache(), steps + steps),
            "per-request": lambda: run_steps_per_request(radix_soa.PrefixCache(), steps + steps),
            "floor": lambda: (floor_run(), floor_run()),
        }
        for fn in calls.values():
            fn()
        best = _interleaved(calls, repeat + 2)
        per = {k: v / (2 * n) * 1e6 for k, v in best.items()}
        print(f"\n[scheduler_step] {name}: {n:,} requests ({tokens:,} prompt tokens) in steps of "
              f"256, each served twice (a miss, then a hit); per request:")
        print(f"  begin_batch + checkpoint_batch + finish_batch {per['batched']:8.2f} us   "
              f"loop of begin/checkpoint/finish {per['per-request']:8.2f} us   "
              f"ratio {per['per-request'] / per['batched']:5.2f}x")
        print(f"  Numba compare loop over the same tokens       {per['floor']:8.2f} us   "
              f"batched - floor {per['batched'] - per['floor']:+.2f} us per request "
              f"(target <= 0.5)")


def _interleaved(calls, repeat):
    """Best wall time of each named call, the calls taking turns in every
    round (so a noisy neighbour slows them alike)."""
    best = {name: float("inf") for name in calls}
    for _ in range(repeat):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def section_containers(repeat):
    """Batch lookups on the containers people hold (polars, pandas, Hugging
    Face datasets, DuckDB, nanoarrow, NumPy object arrays) against the plain
    pyarrow list<int64> path, and the default parallel=None against serial
    on every chunking of one column."""
    import tempfile

    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        print("\n[containers] needs pyarrow (the arrow extra); skipped")
        return
    radix_soa.warmup()
    t_start = time.perf_counter()
    n = int(os.environ.get("RADIX_BENCH_CONTAINER_ROWS", 200_000))
    rng = np.random.default_rng(0)
    lengths = rng.integers(4, 40, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = rng.integers(0, 30_000, int(offsets[-1]))
    arr = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(flat))
    rc = radix_soa.RadixCache()
    rc.insert_batch(arr.slice(0, n // 2))  # half the rows are hits
    print(f"\n[containers] {n:,} rows, {flat.shape[0]:,} tokens; exists_batch(container, "
          "parallel=False), conversion included, vs the same call on a pyarrow ListArray:")
    want = rc.exists_batch(arr, parallel=False)
    calls = {"pyarrow ListArray": lambda: rc.exists_batch(arr, parallel=False)}

    def add(name, make):
        try:
            obj = make()
        except ImportError as exc:
            print(f"  {name:<44} skipped ({exc})")
            return
        if not np.array_equal(rc.exists_batch(obj, parallel=False), want):
            raise AssertionError(f"{name} answers differ from the pyarrow path")
        calls[name] = lambda: rc.exists_batch(obj, parallel=False)

    def polars_series():
        import polars as pl
        return pl.from_arrow(arr)

    def pandas_arrow():
        import pandas as pd
        return pd.Series(arr.to_pandas(types_mapper=pd.ArrowDtype))

    def duckdb_result():
        import duckdb
        con = duckdb.connect()
        con.register("t", pa.table({"tokens": arr}))
        return con.sql("select tokens from t")

    def nanoarrow_array():
        import nanoarrow
        return nanoarrow.c_array(arr)

    tmp = tempfile.TemporaryDirectory()
    path = os.path.join(tmp.name, "tokens.parquet")
    pq.write_table(pa.table({"tokens": arr}), path, row_group_size=1000)

    def hf_dataset(fmt=None):
        import datasets
        datasets.disable_progress_bars()
        ds = datasets.Dataset.from_parquet(path, cache_dir=os.path.join(tmp.name, "hf"))
        return (ds.with_format(fmt) if fmt else ds)["tokens"]

    objects = np.empty(n, object)
    objects[:] = [flat[offsets[i]:offsets[i + 1]] for i in range(n)]
    lists = np.empty(n, object)
    lists[:] = [flat[offsets[i]:offsets[i + 1]].tolist() for i in range(n)]
    add("polars Series", polars_series)
    add("pandas ArrowDtype Series", pandas_arrow)
    add("DuckDB result (runs the query each call)", duckdb_result)
    add("nanoarrow array", nanoarrow_array)
    add("datasets ds['tokens'] (1,000-row chunks)", hf_dataset)
    add("datasets numpy format ds['tokens']", lambda: hf_dataset("numpy"))
    add("object array of int64 arrays (a copy)", lambda: objects)
    add("object array of lists of ints (a copy)", lambda: lists)
    plain = lists.tolist()
    add("list of lists of ints (a copy)", lambda: plain)

    def pandas_objects():
        import pandas as pd
        return pd.Series(plain)

    add("pandas object Series of lists (a copy)", pandas_objects)
    add("pyarrow ChunkedArray of 1,000 chunks", lambda: pa.chunked_array(
        [arr.slice(i, -(-n // 1000)) for i in range(0, n, -(-n // 1000))]))
    print(f"  (inputs built in {time.perf_counter() - t_start:.1f} s)")
    best = _interleaved(calls, repeat)
    base = best["pyarrow ListArray"]
    for name, t in best.items():
        print(f"  {name:<44} {t * 1e3:8.1f} ms   {t / base:5.2f}x the pyarrow path")
    tmp.cleanup()

    print("\n[containers] the same column in chunks: default parallel=None vs parallel=False, "
          f"median of {repeat + 2} paired rounds (best times shown):")
    for rows in (100, 1000, 10_000, 100_000, n):
        chunked = pa.chunked_array([arr.slice(i, rows) for i in range(0, n, rows)])
        ratios, best = [], {"serial": float("inf"), "default": float("inf")}
        for r in range(repeat + 2):
            t = {}
            for mode in (("serial", "default") if r % 2 else ("default", "serial")):
                t0 = time.perf_counter()
                rc.exists_batch(chunked, parallel=False if mode == "serial" else None)
                t[mode] = time.perf_counter() - t0
                best[mode] = min(best[mode], t[mode])
            ratios.append(t["default"] / t["serial"])
        # several chunks: one chunk table, threads when the column is large enough
        # (radix_soa._input.chunked); one chunk: that chunk's own choice
        picks = ("threads" if flat.shape[0] >= radix_soa._input.run.PARALLEL_MIN_TOKENS
                 else "serial") + (" for the table" if chunked.num_chunks > 1 else " for the chunk")
        print(f"  {chunked.num_chunks:5,d} chunks of {rows:7,d} rows ({picks:>21}): "
              f"serial {best['serial'] * 1e3:7.1f} ms, default {best['default'] * 1e3:7.1f} ms, "
              f"default/serial median {np.median(ratios):.3f}x")
    _chunk_counts(pa, max(5, repeat))
    print(f"  (section took {time.perf_counter() - t_start:.0f} s)")


def _chunk_counts(pa, repeat):
    """A column of 100,000 rows of 20-100 tokens as one ListArray and as 10,
    100 and 1,000 chunks, each chunk with buffers of its own (as pyarrow
    reads Parquet row groups): exists_batch, match_length_batch (serial) and
    insert_batch into an empty cache, best CPU time of ``repeat`` rounds
    (the calls take turns), chunked / one ListArray, with the chunk table
    (the chunks read in place: radix_soa._input.chunked) and without it
    (the per-chunk path: small chunks joined by a copy, the way before)."""
    from radix_soa._input import batch as batch_module

    n = size(100_000, 10_000)
    rng = np.random.default_rng(1)
    lengths = rng.integers(20, 101, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = rng.integers(0, 30_000, int(offsets[-1]))

    def list_array(lo, hi):
        rebased = (offsets[lo:hi + 1] - offsets[lo]).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(rebased), pa.array(flat[offsets[lo]:offsets[hi]]))

    one = list_array(0, n)
    columns = {"one ListArray": one}
    for k in (10, 100, 1000):
        rows = -(-n // k)
        columns[f"{k:,} chunks"] = pa.chunked_array(
            [list_array(i, min(n, i + rows)) for i in range(0, n, rows)])
    rc = radix_soa.RadixCache()
    rc.insert_batch(one.slice(0, n // 2))  # half the rows are hits
    ops = {"exists_batch": lambda c: rc.exists_batch(c, parallel=False),
           "match_length_batch": lambda c: rc.match_length_batch(c, parallel=False),
           "insert_batch": lambda c: radix_soa.RadixCache().insert_batch(c)}
    real_table = batch_module.chunk_table
    modes = {"chunk table": real_table, "per chunk": lambda data: None}
    want = {op: fn(one) for op, fn in ops.items()}
    best = {}
    for _ in range(repeat):
        for op, fn in ops.items():
            for mode, table in modes.items():
                batch_module.chunk_table = table
                try:
                    for name, col in columns.items():
                        if name == "one ListArray" and mode != "chunk table":
                            continue
                        t0 = time.process_time()
                        got = fn(col)
                        t = time.process_time() - t0
                        if not np.array_equal(got, want[op]):
                            raise AssertionError(f"{op} on {name} ({mode}) differs")
                        key = (op, mode, name)
                        best[key] = min(best.get(key, float("inf")), t)
                finally:
                    batch_module.chunk_table = real_table
    print(f"\n[containers] {n:,} rows of 20-100 tokens in chunks with buffers of their own, "
          f"best CPU time of {repeat}, chunked / one ListArray:")
    for op in ops:
        base = best[(op, "chunk table", "one ListArray")]
        cells = []
        for name in columns:
            if name == "one ListArray":
                continue
            cells.append(f"{name}: {best[(op, 'chunk table', name)] / base:4.2f}x "
                         f"(per chunk {best[(op, 'per chunk', name)] / base:4.2f}x)")
        print(f"  {op:<19} ({base * 1e3:6.1f} ms)  " + ", ".join(cells))


def section_sglang(repeat):
    """Per call against SGLang's RadixCache, and its default UnifiedRadixCache
    (both tree cores) beside the adapter and a bare PrefixCache (only where
    SGLang is importable)."""
    import sglang_side

    sglang_side.run(repeat)
    sglang_side.run_default(max(repeat, 5), quick=QUICK)


def section_sglang_loop(repeat):
    """A scheduler-shaped loop on SGLang's RadixCache and on radix_soa's SGLang
    cache (only where SGLang is importable: /tmp/sgl-venv, docs/guide/sglang.md)."""
    import sglang_side

    sglang_side.run_loop(repeat, quick=QUICK)


def section_sglang_policy(repeat):
    """SGLang's own SchedulePolicy.calc_priority (LPM) over 128, 1,024 and
    4,096 waiting requests on the adapter and on UnifiedRadixCache (Rust)."""
    import sglang_side

    sglang_side.run_policy(max(repeat, 3), quick=QUICK)


def _dask_corpus(n, seed=0):
    """n sequences of 8..40 tokens as a CSR pair; a third share one of 200
    12-token openings (a few system prompts), the rest start at random."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(8, 41, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = rng.integers(0, 32000, int(offsets[-1]))
    openings = rng.integers(0, 32000, (200, 12))
    shared = np.flatnonzero((np.arange(n) % 3 == 0) & (lengths >= 12))
    pos = offsets[shared][:, None] + np.arange(12)
    flat[pos] = openings[rng.integers(0, 200, shared.size)]
    return flat, offsets


def section_dask(repeat):
    """radix_soa.dask on a 2-worker LocalCluster against one in-process tree."""
    try:
        import radix_soa.dask as rsd
        from dask.distributed import Client, LocalCluster
    except ImportError as exc:
        print(f"\n[dask] left out: {exc}")
        return

    radix_soa.warmup()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        rsd.build([[1, 2, 3]], shards=2, client=client, head=2).exists_batch([[1]])  # warm workers
        for n in size((10**5, 10**6), (10**4, 10**5)):
            flat, offsets = _dask_corpus(n)
            qflat, qoffsets = _dask_corpus(n, seed=1)  # half of the queries are misses
            queries = radix_soa.pack([flat[offsets[i]:offsets[i + 1] - (i % 2)] if i % 4 else
                                      qflat[qoffsets[i]:qoffsets[i + 1]] for i in range(n)])
            print(f"\n[dask] {n:,} sequences, {int(offsets[-1]):,} tokens; {len(queries):,} "
                  "queries (stored, strict prefixes, misses)")
            rc = radix_soa.RadixCache()
            base_build = best_of(lambda tree: tree.insert_batch((flat, offsets)), repeat,
                                 setup=radix_soa.RadixCache)
            rc.insert_batch((flat, offsets))
            base_q = best_of(lambda: rc.match_prefix_batch(queries, parallel=False), repeat)
            want = rc.match_prefix_batch(queries, parallel=False)
            for shards, head in ((2, 16), (8, 16)):
                built = []

                def make():
                    built[:] = [rsd.build((flat, offsets), shards=shards, client=client,
                                          head=head)]
                ours_build = best_of(make, repeat)
                sc = built[0]
                ours_q = best_of(lambda: sc.match_prefix_batch(queries), repeat)
                assert np.array_equal(sc.match_prefix_batch(queries), want)
                rep = sc.memory_report()
                tot, one = rep["total"], rc.memory_report()
                print(f"  shards={shards} head={head}: build {ours_build:.2f} s vs one tree "
                      f"{base_build:.2f} s = {ours_build / base_build:.1f}x slower; "
                      f"match_prefix_batch {n / ours_q / 1e3:.0f}k/s vs {n / base_q / 1e3:.0f}k/s "
                      f"= {ours_q / base_q:.1f}x slower")
                print(f"    bytes per token of the corpus's one tree: "
                      f"{tot['used_bytes'] / one['tokens_stored']:.1f} summed over shards + head "
                      f"tree vs {one['bytes_per_stored_token']:.1f} for one tree = "
                      f"{tot['used_bytes'] / one['used_bytes']:.2f}x the memory; stored tokens "
                      f"{tot['tokens_stored']:,} vs {one['tokens_stored']:,} (head tree "
                      f"{rep['head']['tokens_stored']:,}); skew {rep['skew']:.2f}")


def section_events(repeat):
    """KV events on vs off for inserts under a capacity, and the router
    index's overlap against a worker's match_length on a 1,100-token request."""
    radix_soa.warmup()
    requests = sequences("multi_turn")
    tokens = sum(len(q) for q in requests)
    vals = [np.arange(len(q), dtype=np.int64) for q in requests]
    print(f"\n[events] multi_turn: {len(requests):,} requests, {tokens:,} tokens, page_size 16, "
          "capacity 1/4 of the tokens (inserts evict)")

    def build(events, drain):
        def run():
            pc = radix_soa.PrefixCache(capacity=tokens // 4, page_size=16, events=events)
            for i, (q, v) in enumerate(zip(requests, vals)):
                pc.insert(q, values=v)
                if drain and i % 64 == 63:
                    pc.take_events()
            if drain:
                pc.take_events()
        return run

    best = _interleaved({"off": build(False, False), "on": build(True, False),
                         "on+take": build(True, True)}, repeat + 2)
    line("loop of insert, events on (queued)", best["on"], best["off"], "events off")
    line("loop of insert, events on + take_events", best["on+take"], best["off"], "events off")

    rng = np.random.default_rng(0)
    n_calls = size(500, 200)
    for page in (16, 1):
        system = rng.integers(0, 32_000, size=600)
        workers = [radix_soa.PrefixCache(page_size=page, events=True, values=False)
                   for _ in range(8)]
        ix = radix_soa.RouterIndex(page_size=page)
        convs = [np.concatenate([system, rng.integers(0, 32_000, size=500)]) for _ in range(64)]
        for i, c in enumerate(convs):
            workers[i % 8].insert(c)
            workers[(i + 3) % 8].insert(c[:800])
        for w, pc in enumerate(workers):
            ix.apply(w, pc.take_events())
        q = np.concatenate([convs[5][:1000], rng.integers(0, 32_000, size=100)])  # 1,100 tokens
        assert ix.overlap(q)[5 % 8] == workers[5].match_length(q)

        def overlaps():
            for _ in range(n_calls):
                ix.overlap(q)

        def matches():
            for _ in range(n_calls):
                workers[5].match_length(q)

        # many short rounds, best of each: a shared machine's noise hits both alike
        best = _interleaved({"overlap": overlaps, "match_length": matches}, 10 * repeat)
        print(f"  page_size {page:2}: RouterIndex.overlap (8 workers, {len(ix):,} pages) "
              f"{best['overlap'] / n_calls * 1e6:6.2f} us, PrefixCache.match_length "
              f"{best['match_length'] / n_calls * 1e6:6.2f} us per 1,100-token request: overlap "
              f"costs {best['overlap'] / best['match_length']:.2f}x a match_length (target <= 2)")


TRACES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data",
                      "traces", "mooncake-fast25")


def _router_workload(page, workers, rng):
    """~200k cached blocks over ``workers`` caches with events: conversations
    of ~128 pages under 50 shared system prompts, each cached by one worker
    (a quarter by a second one too); and 128-block queries that follow a
    conversation for a while, then leave it."""
    systems = [rng.integers(0, 32_000, size=page * int(k)) for k in rng.integers(8, 40, size=50)]
    n_conv = size(1_400, 140)
    caches = [radix_soa.PrefixCache(page_size=page, events=True, values=False)
              for _ in range(workers)]
    convs = []
    for c in range(n_conv):
        sysp = systems[int(rng.integers(0, len(systems)))]
        conv = np.concatenate([sysp, rng.integers(0, 32_000, size=page * int(rng.integers(80, 120)))])
        convs.append(conv)
        caches[c % workers].insert(conv)
        if c % 4 == 0:
            caches[(c * 7 + 3) % workers].insert(conv[:len(conv) * 3 // 4])
    queries = []
    for _ in range(size(400, 100)):
        conv = convs[int(rng.integers(0, n_conv))]
        keep = int(rng.integers(0, 129)) * page
        q = np.concatenate([conv[:keep], rng.integers(0, 32_000, size=128 * page)])[:128 * page]
        queries.append(q)
    return caches, queries


def _mooncake_workload(path, workers):
    """A Mooncake trace's hash ids as tokens (page size 1: an id is a 512-token
    block), requests dealt round robin to ``workers`` caches of 3,000 blocks
    each (so they evict: removals in the stream); the queries are the last
    fifth of the requests, asked before they are cached."""
    tr = radix_soa.traces.load_trace(path)
    caches = [radix_soa.PrefixCache(capacity=3_000, page_size=1, events=True, values=False)
              for _ in range(workers)]
    n = len(tr)
    cut = n * 4 // 5
    for i in range(cut):
        caches[i % workers].insert(tr[i])
    return caches, [np.asarray(tr[i]) for i in range(cut, n)]


def _router_dynamo_workloads():
    """``(title, page, build)`` of the router_dynamo workloads, 16 workers:
    the synthetic one (seeded), and each Mooncake trace found under
    ``TRACES`` (one not found is said and skipped)."""
    rng = np.random.default_rng(0)
    workloads = [("synthetic, page 16", 16, lambda: _router_workload(16, 16, rng))]
    for name in ("conversation_trace.jsonl", "synthetic_trace.jsonl"):
        path = os.path.join(TRACES, name)
        if os.path.exists(path):
            workloads.append((f"Mooncake {name.split('_')[0]}, block ids", 1,
                              lambda path=path: _mooncake_workload(path, 16)))
        else:
            print(f"  (Mooncake {name} not found under {TRACES}: skipped)")
    return workloads


def _warm_router():
    """Compile (or load) RouterIndex's kernels: stored and removed events,
    strict and not, overlap and overlap_batch, with and without a budget."""
    pc = radix_soa.PrefixCache(capacity=8, page_size=2, events=True, values=False)
    for q in ([1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 9, 9]):
        pc.insert(q)
    evs = pc.take_events()
    for kw in ({}, {"strict": False}, {"max_bytes": 1 << 14}):
        ix = radix_soa.RouterIndex(page_size=2, **kw)
        ix.apply(0, evs)
        ix.apply(1, [radix_soa.BlockRemoved([1])], strict=False)
        ix.overlap([1, 2, 3, 4])
        ix.overlap_batch([[1, 2], [3, 4]])
    from radix_soa.integrations.vllm_wire import encode_batch
    for strict in (True, False):  # apply_wire's reader and kernel
        ix = radix_soa.RouterIndex(page_size=2, strict=strict)
        ix.apply_wire(0, encode_batch(evs))
        ix.apply_wire(0, encode_batch([{"type": "BlockStored", "block_hashes": [7, 8],
                                        "parent_block_hash": None, "token_ids": [5, 5, 6, 6],
                                        "block_size": 2}]))


def section_router_dynamo(repeat):
    """RouterIndex against NVIDIA Dynamo's RadixTree (dynamo._core, from
    ai-dynamo-runtime): the same events and queries, per query time from
    Python, events applied per stored block, bytes per block, equal scores."""
    import dynamo_side as DS

    print("\n[router_dynamo] RouterIndex vs Dynamo's RadixTree (ai-dynamo-runtime), 16 workers")
    RadixTree = DS.available()
    if RadixTree is None:
        return
    os.environ.setdefault("RUST_LOG", "error")
    _warm_router()
    workloads = _router_dynamo_workloads()
    for title, page, build in workloads:
        progress(f"router_dynamo: {title}")
        caches, queries = build()
        streams = [(w, pc.take_events()) for w, pc in enumerate(caches)]
        dyn_streams = [(w, DS.to_dynamo(evs, page)) for w, evs in streams]
        n_stored = sum(len(e.block_hashes) for _, evs in streams for e in evs
                       if isinstance(e, radix_soa.BlockStored))
        n_events = sum(len(evs) for _, evs in streams)
        wire = [(w, json.dumps([e.to_dict() for e in evs]).encode()) for w, evs in streams]
        from radix_soa.integrations.vllm_wire import encode_batch
        packed = [(w, [encode_batch(evs[i:i + 32], ts=0.0) for i in range(0, len(evs), 32)])
                  for w, evs in streams]  # vLLM's msgpack batches, 32 events each
        q_local = [DS.local_hashes(q, page) for q in queries]
        state = {}

        def ours():
            ix = radix_soa.RouterIndex(page_size=page, workers=range(16))
            for w, evs in streams:
                ix.apply(w, evs)
            state["ix"] = ix

        def ours_json():
            ix = radix_soa.RouterIndex(page_size=page, workers=range(16))
            for w, b in wire:
                ix.apply(w, json.loads(b))

        def ours_wire():
            ix = radix_soa.RouterIndex(page_size=page, workers=range(16))
            for w, batches in packed:
                for b in batches:
                    ix.apply_wire(w, b)

        def dynamo():  # its JSON built in the timing: its API takes bytes
            t = RadixTree()
            DS.apply_all(t, DS.dumps_all(dyn_streams))
            state["dyn"] = t

        best = _interleaved({"ours": ours, "ours_json": ours_json, "ours_wire": ours_wire,
                             "dynamo": dynamo}, repeat)
        ix, dyn = state["ix"], state["dyn"]
        held = sum(len(ix.blocks_of(w)) for w in range(16))
        print(f"  {title}: {n_events:,} events, {n_stored:,} stored blocks; {held:,} cached "
              f"(worker, block) pairs, {len(ix):,} distinct blocks; {len(queries)} queries of "
              f"{np.mean([len(q) // page for q in queries]):.0f} blocks on average")
        per = {k: v / n_stored * 1e9 for k, v in best.items()}
        print(f"    events applied, per stored block: radix_soa {per['ours']:.0f} ns (event "
              f"objects), {per['ours_json']:.0f} ns (from JSON, json.loads included); Dynamo "
              f"{per['dynamo']:.0f} ns (json.dumps + apply_event): {per['dynamo'] / per['ours']:.2f}x"
              f" / {per['dynamo'] / per['ours_json']:.2f}x; radix_soa apply_wire (vLLM's msgpack "
              f"batches of 32 events) {per['ours_wire']:.0f} ns: "
              f"{per['dynamo'] / per['ours_wire']:.2f}x Dynamo")
        mismatched = 0
        for q, loc in zip(queries, q_local):
            ours_blocks = (ix.overlap(q) // page).tolist()
            if ours_blocks != DS.as_blocks(dyn.find_matches(loc).scores, range(16)):
                mismatched += 1
        print(f"    scores equal on {len(queries) - mismatched} of {len(queries)} queries")

        def q_ours():
            for q in queries:
                ix.overlap(q)

        def q_dyn():
            for loc in q_local:
                dyn.find_matches(loc)

        bq = _interleaved({"ours": q_ours, "dyn": q_dyn}, 5 * repeat)
        a, b = bq["ours"] / len(queries) * 1e6, bq["dyn"] / len(queries) * 1e6
        print(f"    per query from Python: radix_soa overlap(tokens) {a:.2f} us (hashing the "
              f"tokens included), Dynamo find_matches(local hashes) {b:.2f} us (hashed "
              f"beforehand): {b / a:.2f}x")
        ours_rss = DS.rss_growth("radix_soa", streams, page)
        dyn_rss = DS.rss_growth("dynamo", dyn_streams, page)
        rep = ix.memory_report()
        print(f"    bytes per cached (worker, block) pair: radix_soa {rep['bytes'] / held:.1f} "
              f"(memory_report, its arrays as allocated; RSS growth {ours_rss / held:.1f}), "
              f"Dynamo {dyn_rss / held:.1f} (RSS growth in a fresh process): "
              f"{dyn_rss / rep['bytes']:.2f}x (RSS vs RSS {dyn_rss / max(ours_rss, 1):.2f}x); "
              f"per distinct block {rep['bytes_per_page']:.1f} vs {dyn_rss / len(ix):.1f}")


def _engine_hashed(streams, seeds):
    """``streams`` (a ``PrefixCache``'s own events per worker) with every
    block hash replaced by an engine-like one: a keyed 64-bit hash of the
    chained key, keyed by ``seeds[w]`` (one seed for every engine: vLLM
    0.34.0's ``sha256`` (its default) and ``sha256_cbor``, or
    ``PYTHONHASHSEED`` set; a seed each: its ``xxhash``/``xxhash_cbor``
    without ``PYTHONHASHSEED``, a random ``NONE_HASH`` per process), so
    engine hash != the index's key."""
    import xxhash

    def eh(h, seed):
        return xxhash.xxh64_intdigest(int(h).to_bytes(8, "little"), seed) >> 1  # Dynamo: < 2**63

    out = []
    for w, evs in streams:
        s = seeds[w]
        conv = []
        for e in evs:
            if isinstance(e, radix_soa.BlockStored):
                conv.append(radix_soa.BlockStored(
                    [eh(h, s) for h in e.block_hashes],
                    None if e.parent_block_hash is None else eh(e.parent_block_hash, s),
                    e.token_ids, e.block_size, e.lora_id, e.medium, e.lora_name, e.extra_keys))
            elif isinstance(e, radix_soa.BlockRemoved):
                conv.append(radix_soa.BlockRemoved([eh(h, s) for h in e.block_hashes]))
            else:
                conv.append(e)
        out.append((w, conv))
    return out


def section_router_memory(repeat):
    """Bytes per cached (worker, page) pair of RouterIndex (memory_report,
    handle maps included) on the router_dynamo workloads, with the events'
    own hashes (engine hash == key: no handle entries) and with engine
    hashes (one seed for all engines; a seed per engine), unbounded and
    under a budget; Dynamo's RSS growth per pair beside it."""
    import dynamo_side as DS

    _warm_router()
    print("\n[router_memory] bytes per cached (worker, page) pair, 16 workers, "
          "memory_report (handle maps included)")
    workloads = _router_dynamo_workloads()
    have_dynamo = DS.available() is not None
    seed_rng = np.random.default_rng(1)
    for title, page, build in workloads:
        progress(f"router_memory: {title}")
        caches, _ = build()
        streams = [(w, pc.take_events()) for w, pc in enumerate(caches)]
        shared = [12345] * 16
        own = [int(s) for s in seed_rng.integers(0, 2**63, 16)]
        cases = [("own hashes (key)", streams),
                 ("engine, one seed", _engine_hashed(streams, shared)),
                 ("engine, seed each", _engine_hashed(streams, own))]
        row = []
        held = None
        for label, st in cases:
            ix = radix_soa.RouterIndex(page_size=page, workers=range(16))
            for w, evs in st:
                ix.apply(w, evs)
            if held is None:
                held = sum(len(ix.blocks_of(w)) for w in range(16))
                print(f"  {title}: {held:,} cached (worker, page) pairs, {len(ix):,} pages "
                      f"({held / len(ix):.2f} workers a page)")
            rep = ix.memory_report()
            hb = rep["arrays"]["handles"]
            row.append(f"{label} {rep['bytes'] / held:.1f} (handles {hb / held:.1f}; "
                       + ", ".join(f"{k} {v / held:.1f}" for k, v in rep["arrays"].items()
                                   if v / held >= 0.05) + ")")
            budget = rep["bytes"] // 2
            bx = radix_soa.RouterIndex(page_size=page, workers=range(16), max_bytes=budget,
                                       strict=False)
            for w, evs in st:
                bx.apply(w, evs)
            brep = bx.memory_report()
            row.append(f"  max_bytes {budget:,}: {brep['bytes']:,} B "
                       f"({'within' if brep['bytes'] <= budget else 'OVER'}), handles "
                       f"{brep['arrays']['handles']:,} B, {brep['pages']:,} pages")
        for r in row:
            print(f"    {r}")
        if have_dynamo:
            for label, st in cases[1:]:
                try:
                    dyn_rss = DS.rss_growth("dynamo", [(w, DS.to_dynamo(evs, page))
                                                       for w, evs in st], page)
                except subprocess.CalledProcessError as exc:
                    err = (exc.stderr or "").strip().splitlines()
                    print(f"    Dynamo RadixTree ({label}): refused the stream "
                          f"({err[-1] if err else exc})")
                    continue
                print(f"    Dynamo RadixTree ({label}): {dyn_rss / held:.1f} B per pair (RSS "
                      "growth in a fresh process)")


def _vllm_shaped_batches(rng, page, n_batches, keep):
    """vLLM-shaped msgpack batches: per step 8 requests, each a chunked
    prefill run of 1..32 blocks and a decode block after it, then
    single-block removals of the newest blocks past ``keep`` cached; engine
    hashes random 64-bit ints (vLLM's low 64 bits of a hash no router
    reproduces)."""
    from radix_soa.integrations.vllm_wire import encode_batch
    batches, held, stored = [], [], 0
    for _ in range(n_batches):
        evs = []
        for _ in range(8):
            k = int(rng.integers(1, 33))
            hs = [int(h) for h in rng.integers(0, 2**63, k)]
            evs.append({"type": "BlockStored", "block_hashes": hs, "parent_block_hash": None,
                        "token_ids": rng.integers(0, 32_000, k * page).tolist(),
                        "block_size": page, "lora_id": None, "medium": "GPU", "lora_name": None})
            h = int(rng.integers(0, 2**63))
            evs.append({"type": "BlockStored", "block_hashes": [h], "parent_block_hash": hs[-1],
                        "token_ids": rng.integers(0, 32_000, page).tolist(), "block_size": page,
                        "lora_id": None, "medium": "GPU", "lora_name": None})
            stored += k + 1
            held += hs + [h]
        while len(held) > keep:
            evs.append({"type": "BlockRemoved", "block_hashes": [held.pop()], "medium": "GPU"})
        batches.append(encode_batch(evs))
    return batches, stored


def section_router_wire(repeat):
    """apply_wire on vLLM-shaped batches (stored pages per second, one
    thread), and overlap_batch of a waiting queue (256 requests x 1,024
    tokens x 64 workers: the cost per (request, page, worker))."""
    _warm_router()
    page = 16
    rng = np.random.default_rng(0)
    batches, stored = _vllm_shaped_batches(rng, page, size(400, 40), 20_000)
    state = {}

    def wire():
        ix = radix_soa.RouterIndex(page_size=page, workers=[0], strict=False)
        for b in batches:
            ix.apply_wire(0, b)
        state["ix"] = ix

    best = {"wire": float("inf")}
    for _ in range(max(repeat, 3)):  # CPU time: the 2-core machine is shared
        t0 = time.process_time()
        wire()
        best["wire"] = min(best["wire"], time.process_time() - t0)
    ix = state["ix"]
    print(f"\n[router_wire] {stored:,} stored pages in {len(batches)} vLLM-shaped batches "
          f"({sum(map(len, batches)) / 1e6:.1f} MB): apply_wire "
          f"{stored / best['wire'] / 1e6:.2f} M stored pages/s from one thread (CPU time); "
          f"{ix.memory_report()['bytes'] / len(ix):.1f} B per cached page with its handle")
    workers, n_req, toks = 64, 256, 1024
    ix = radix_soa.RouterIndex(page_size=page, workers=range(workers))
    base = rng.integers(0, 32_000, (16, toks))
    for w in range(workers):
        pc = radix_soa.PrefixCache(page_size=page, events=True, values=False)
        for j in range(4):
            row = base[(w + j) % 16]
            pc.insert(row[:int(rng.integers(1, toks // page)) * page])
        ix.apply(w, pc.take_events())
    reqs = [base[int(rng.integers(0, 16))].copy() for _ in range(n_req)]
    for r in reqs:
        r[int(rng.integers(0, toks)):] = rng.integers(0, 32_000, 1)
    packed = radix_soa.pack(reqs)
    ix.overlap_batch(packed)
    bq = _interleaved({"batch": lambda: ix.overlap_batch(packed)}, 5 * repeat)
    cells = n_req * (toks // page) * workers
    print(f"  overlap_batch: {n_req} requests x {toks} tokens x {workers} workers in "
          f"{bq['batch'] * 1e3:.2f} ms, {bq['batch'] / cells * 1e9:.3f} ns per (request, page, "
          f"worker)")


def section_router_churn(repeat):
    """10^6 stored/removed events at a steady cached set: the index's bytes
    stay flat (memory_report after each tenth), with and without a budget."""
    _warm_router()
    n = size(1_000_000, 100_000)
    rng = np.random.default_rng(0)
    print(f"\n[router_churn] {n:,} stored/removed events, 16 workers, a steady 64 chains of 16 "
          "blocks per worker (random block hashes, page size 1)")
    for budget in (None, 1 << 19):  # the second holds about half the steady set
        ix = radix_soa.RouterIndex(page_size=1, max_bytes=budget)
        held = {w: [] for w in range(16)}
        sizes = []
        t0 = time.perf_counter()
        events = 0
        step = 0
        toks = list(range(16))
        while events < n:
            w = step % 16
            hs = rng.integers(0, 2**63, size=16).tolist()
            batch = [radix_soa.BlockStored(hs, None, toks, 1)]
            held[w].append(hs)
            if len(held[w]) > 64:
                batch.append(radix_soa.BlockRemoved(held[w].pop(0)))
            ix.apply(w, batch)
            events += len(batch)
            step += 1
            if step % max(1, n // 20) == 0:
                sizes.append(ix.memory_report()["bytes"])
        dt = time.perf_counter() - t0
        warm = sizes[len(sizes) // 5:]
        rep = ix.memory_report()
        print(f"  max_bytes {budget}: {events:,} events in {dt:.1f} s ({dt / events * 1e6:.2f} us "
              f"per event); bytes after the first fifth: min {min(warm):,} max {max(warm):,} "
              f"({max(warm) / min(warm) - 1:+.1%}); {rep['pages']:,} pages, "
              f"{rep['bytes_per_page']:.1f} B per page, forgotten {rep['forgotten_pages']:,}")


def section_router_service(repeat):
    """The router service (radix-soa router: ASGI under uvicorn) under load
    on loopback while 8 workers stream KV events on vLLM's wire, beside the
    floor of its server library: a bare ASGI hello-world under uvicorn
    parsing the same bodies with json.loads, driven by the same client, no
    events. Interleaved, best and median."""
    import argparse as _argparse
    import statistics

    import server_candidates
    from radix_soa.service import loadtest
    requests = size(20_000, 4_000)
    opts = _argparse.Namespace(**{**loadtest.DEFAULTS, "requests": requests})
    print(f"\n[router_service] {requests:,} POST /route of {opts.tokens} tokens ({opts.prefix} "
          f"shared), {opts.connections} keep-alive connections, policy {opts.policy}; 8 workers "
          f"publishing {opts.event_rate:g} event batches/s each; {os.cpu_count()} cpus")
    svc, floor = [], []
    for i in range(repeat):
        progress(f"router_service run {i + 1} of {repeat}")
        svc.append(loadtest.run(opts))
        floor.append(server_candidates.measure("asgi+uvicorn", requests, opts.connections,
                                               opts.tokens)[0])
    best = max(svc, key=lambda r: r["routes_per_s"])
    fbest = max(floor, key=lambda r: r.rate)
    med = statistics.median(r["routes_per_s"] for r in svc)
    fmed = statistics.median(r.rate for r in floor)
    print(f"  radix-soa router: best {best['routes_per_s']:,.0f} routes/s (p50 "
          f"{best['p50_ms']:.2f} ms, p99 {best['p99_ms']:.2f} ms), median {med:,.0f}; "
          f"{best['events_per_s']:,.0f} events/s applied meanwhile, degraded "
          f"{best['degraded']:.0f}; server CPU {best['server_cpu_us_per_route']:.0f} us/route")
    print(f"  ASGI hello-world under uvicorn, no events: best {fbest.rate:,.0f} requests/s (p50 "
          f"{fbest.p(50) * 1e3:.2f} ms, p99 {fbest.p(99) * 1e3:.2f} ms), median {fmed:,.0f}")
    print(f"  router / hello-world: best {best['routes_per_s'] / fbest.rate:.2f}x, median "
          f"{med / fmed:.2f}x; goal 5,000 routes/s: "
          f"{'met' if best['routes_per_s'] >= 5000 else 'not met'} (best), "
          f"{'met' if med >= 5000 else 'not met'} (median)")


def _compare_floor():
    """A Numba loop comparing each query's tokens with a copy of them, in
    CSR order: the memory floor of a lookup that reads every query token
    once against stored tokens."""
    import numba

    @numba.njit(nogil=True, cache=False)
    def floor(flat, copy, offsets, out):
        for i in range(offsets.shape[0] - 1):
            a = offsets[i]
            diff = 0
            for j in range(offsets[i + 1] - a):  # unsigned indices vectorize
                diff |= flat[np.uintp(a + j)] ^ copy[np.uintp(a + j)]
            out[i] = diff == 0

    return floor


def _xxh64_set(flat, offsets, qflat, qoffsets):
    """Exact membership the plain Python way: a set of xxh64 digests of each
    sequence's bytes, then one digest and set lookup per query. Returns the
    hits (as a bool array)."""
    import xxhash

    h = xxhash.xxh64_intdigest
    mv = memoryview(flat).cast("B")
    off = (offsets * 8).tolist()
    digests = {h(mv[a:b]) for a, b in zip(off[:-1], off[1:])}
    qmv = memoryview(qflat).cast("B")
    qoff = (qoffsets * 8).tolist()
    return np.fromiter((h(qmv[a:b]) in digests for a, b in zip(qoff[:-1], qoff[1:])), np.bool_,
                       len(qoff) - 1)


def _scale_row(n, repeat, floor, rng):
    """One size of the scale section: build, then serial lookups of up to
    10^6 stored sequences in insertion order and shuffled (ns figures)."""
    flat, offsets = common.short_corpus(n)
    built = []

    def build(_):
        built[:] = [radix_soa.RadixCache()]
        built[0].insert_batch((flat, offsets))

    t_ins = best_of(build, repeat, setup=built.clear)
    tree = built[0]
    nq = min(n, 10**6)
    idx = np.sort(rng.choice(n, nq, replace=False)) if nq < n else np.arange(n)
    ordered = common.take_csr(flat, offsets, idx)
    shuffled = common.take_csr(flat, offsets, rng.permutation(idx))
    qtok = int(ordered[1][-1])
    copy = ordered[0].copy()
    hits = np.empty(nq, np.bool_)
    floor(ordered[0], copy, ordered[1], hits)
    t_floor = best_of(lambda: floor(ordered[0], copy, ordered[1], hits), repeat + 2)
    row = {"n": n, "insert": t_ins / n * 1e9, "floor": t_floor / qtok * 1e9,
           "tok_per_seq": int(offsets[-1]) / n, "mib": tree.memory_report()["used_bytes"] / 2**20}
    for name, q in (("ins", ordered), ("rnd", shuffled)):
        if not tree.exists_batch(q, parallel=False).all():
            raise AssertionError("a stored sequence was not found")
        if not np.array_equal(tree.match_prefix_batch(q, parallel=False), np.diff(q[1])):
            raise AssertionError("a stored sequence did not match in full")
        t = best_of(lambda: tree.exists_batch(q, parallel=False), repeat)
        row[f"exists_{name}"] = t / qtok * 1e9
        t = best_of(lambda: tree.match_prefix_batch(q, parallel=False), repeat)
        row[f"match_{name}"] = t / qtok * 1e9
    return row


def section_scale(repeat):
    """Cost per sequence and per query token as the short workload grows
    past the last-level cache (issue 12): 1,000 prompts of 20-100 tokens
    plus tails of 1-45 (about 83 tokens per sequence). Lookups run serially
    on up to 10^6 stored sequences (all of them below 10^6, a sample
    above), in insertion order and shuffled, against a Numba loop comparing
    the same tokens with a copy (the floor). ``RADIX_BENCH_SCALE_MAX`` sets
    the largest size (default 10^6; 10^7 needs about 12 GB)."""
    radix_soa.warmup()
    top = int(os.environ.get("RADIX_BENCH_SCALE_MAX", 10**6))
    sizes = [n for n in (10**4, 10**5, 10**6, 10**7) if n <= size(top, min(top, 10**5))]
    floor = _compare_floor()
    rng = np.random.default_rng(1)
    print("\n[scale] short workload (1,000 prompts of 20-100 tokens + tails of 1-45), serial; "
          "ns per sequence (insert) and per query token (lookups)")
    rows = []
    for n in sizes:
        progress(f"scale: {n:,} sequences")
        row = _scale_row(n, repeat, floor, rng)
        print(f"  {n:>10,} seqs ({row['tok_per_seq']:.1f} tok/seq, tree {row['mib']:,.0f} MiB): "
              f"insert_batch {row['insert']:6.0f} ns/seq; per query token: floor "
              f"{row['floor']:.2f} ns, exists {row['exists_ins']:.2f} "
              f"({row['exists_ins'] / row['floor']:.1f}x) / shuffled {row['exists_rnd']:.2f} "
              f"({row['exists_rnd'] / row['exists_ins']:.2f}x order), match {row['match_ins']:.2f} "
              f"({row['match_ins'] / row['floor']:.1f}x) / shuffled {row['match_rnd']:.2f} "
              f"({row['match_rnd'] / row['match_ins']:.2f}x order)")
        rows.append(row)
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        print(f"  {b['n']:,} vs {a['n']:,}: insert_batch ns/seq {b['insert'] / a['insert']:.2f}x, "
              f"exists ns/token {b['exists_ins'] / a['exists_ins']:.2f}x, "
              f"match ns/token {b['match_ins'] / a['match_ins']:.2f}x")

    n = size(10**6, 10**5)
    try:
        import xxhash
    except ImportError:
        print("\n[scale] exact membership: the xxh64 baseline needs xxhash (pip install xxhash)")
        return
    progress(f"scale: exact membership of {n:,} sequences (xxhash {xxhash.VERSION})")
    flat, offsets = common.short_corpus(n)
    # every stored sequence in shuffled order, every other one with its last
    # token changed (a near miss: the descent reads it in full)
    queries = common.take_csr(flat, offsets, rng.permutation(n))
    queries[0][queries[1][2::2] - 1] += 1_000_000

    def ours():
        rc = radix_soa.RadixCache()
        rc.insert_batch((flat, offsets))
        return rc.exists_batch(queries, parallel=False)

    want = _xxh64_set(flat, offsets, *queries)
    if not np.array_equal(ours(), want):
        raise AssertionError("radix_soa and the xxh64 set disagree")
    t_ours = best_of(ours, repeat)
    t_set = best_of(lambda: _xxh64_set(flat, offsets, *queries), repeat)
    print(f"\n[scale] exact membership, {n:,} short sequences stored + {n:,} queries (half near misses):")
    line("build + exists_batch (1 thread)", t_ours, t_set, "set of xxh64")


def _kvcache_sim_runner(trace):
    """A function running kvcache-simulator 0.1.3's C++ backend (LRU) on
    ``trace`` (its own binary, fed our ids) at one capacity and returning
    its wall seconds, or None when the package is absent. The binary is
    built and the trace converted to the package's ``TraceData`` before,
    outside the time; the time is one ``run_cpp_sweep`` call: writing its
    binary trace files, starting its process, reading them, the run."""
    try:
        from kvcache_sim.cpp_backend import ensure_cpp_simulator, run_cpp_sweep
        from kvcache_sim.trace import TraceData, block_tokens
    except ImportError:
        return None
    ensure_cpp_simulator()
    bs = trace.block_size
    lengths = np.diff(trace.offsets)
    weights = [block_tokens(int(n_in), bs, j, int(k)) for n_in, k in
               zip(trace.input_tokens.tolist(), lengths.tolist()) for j in range(k)]
    data = TraceData(ids=trace.flat.tolist(), tokens=weights, request_starts=trace.offsets.tolist(),
                     block_size=bs, request_count=len(trace),
                     unique_raw_blocks=int(np.unique(trace.flat).size),
                     total_input_tokens=int(trace.input_tokens.sum()),
                     average_input_tokens=float(trace.input_tokens.mean()), parse_errors=0,
                     skipped_records=0)

    def run(capacity):
        t0 = time.perf_counter()
        run_cpp_sweep(data, capacities=[int(capacity)], policies=["lru"], warmup_requests=0)
        return time.perf_counter() - t0

    return run


def section_replay_scale(repeat):
    """Replay time per request as the trace grows: the Mooncake conversation
    trace run 1, 10 and 100 times back to back (each copy's ids offset, so
    the copies share nothing), at 5 capacities from 1/40 of each trace's
    unbounded peak to the peak; beside kvcache-simulator 0.1.3's C++ backend
    at every size and capacity when it is installed (pip install
    kvcache-simulator==0.1.3), the two interleaved capacity by capacity.
    Our time is ``radix_soa.replay(trace, capacity=c)`` from a ``Trace`` in
    memory (validation, the kernel, the result); the simulator's is one run
    of its binary at that capacity, its file writing and process start
    included (``_kvcache_sim_runner``)."""
    radix_soa.warmup()
    base = common.mooncake_conversation()
    if base is None:
        print("\n[replay_scale] the Mooncake traces are not present; skipped")
        return
    per_request = {}
    print("\n[replay_scale] Mooncake conversation trace copied k times; us per request per capacity "
          "(fraction of the unbounded peak: time)")
    for k in size((1, 10, 100), (1, 10)):
        progress(f"replay_scale: x{k}")
        trace = common.copied_trace(base, k)
        full = radix_soa.replay(trace)
        fracs = np.linspace(1 / 40, 1, 5)
        caps = [max(1, int(full.peak_ids * f)) for f in fracs]
        sim = _kvcache_sim_runner(trace)
        reps = repeat if k < 100 else 1
        ours, theirs = [], []
        for c in caps:
            ours.append(best_of(lambda: radix_soa.replay(trace, capacity=c), reps))
            if sim is not None:
                theirs.append(min(sim(c) for _ in range(reps)))
        per_request[k] = [t / len(trace) for t in ours]
        row = "  ".join(f"{f:.2f}: {t * 1e6:6.2f}" for f, t in zip(fracs, per_request[k]))
        print(f"  x{k:<3} ({len(trace):>9,} requests, {trace.num_blocks:>11,} ids) radix_soa {row}")
        if theirs:
            row = "  ".join(f"{f:.2f}: {t / len(trace) * 1e6:6.2f}" for f, t in zip(fracs, theirs))
            ratios = ", ".join(f"{a / b:.2f}x" for a, b in zip(theirs, ours))
            print(f"       kvcache-simulator C++ {row}\n"
                  f"       its time over ours per capacity: {ratios}")
        else:
            print("       kvcache-simulator not installed: baseline skipped")
        if k > 1:
            worst = max(a / b for a, b in zip(per_request[k], per_request[1]))
            print(f"       radix_soa per request vs x1, worst capacity: {worst:.2f}x")


def section_vllm(repeat):
    """The vLLM KV-event subscriber: batches of vLLM's wire decoded and
    applied to a RouterIndex, over loopback ZMQ from 2 publishers, against
    applying the same events (already decoded) to the index directly."""
    import zmq
    from radix_soa.integrations.vllm import KVEventSubscriber
    from radix_soa.integrations.vllm_wire import WirePublisher, decode_events, encode_batch

    _warm_router()
    rng = np.random.default_rng(0)
    n = size(5000, 500)
    system = rng.integers(0, 32_000, size=512)
    streams = []
    for _ in range(2):
        pc = radix_soa.PrefixCache(capacity=64 * 1024, page_size=16, events=True, values=False)
        batches = []
        for _ in range(n):  # an engine step: one request of 512 + 256..767 tokens
            pc.insert(np.concatenate([system, rng.integers(0, 32_000, size=rng.integers(256, 768))]))
            batches.append([e.to_dict() for e in pc.take_events()])
        streams.append(batches)
    payloads = [[encode_batch(b, ts=1.0) for b in bs] for bs in streams]
    events = sum(len(b) for bs in streams for b in bs)
    print(f"\n[vllm] 2 workers x {n:,} batches, {events:,} events (page 16, map encoding, "
          f"{sum(map(len, payloads[0])) / n:,.0f} bytes a batch)")

    def direct():
        ix = radix_soa.RouterIndex(page_size=16)
        for w, bs in enumerate(streams):
            for seq, b in enumerate(bs):
                ix.apply(w, b, strict=False, seq=seq + 1)

    def decoded():
        ix = radix_soa.RouterIndex(page_size=16)
        for w, ps in enumerate(payloads):
            for seq, p in enumerate(ps):
                ix.apply(w, [e for _, e in decode_events(p)[1]], strict=False, seq=seq + 1)

    ctx = zmq.Context()

    def wire():
        ix = radix_soa.RouterIndex(page_size=16)
        pubs = [WirePublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", context=ctx)
                for _ in streams]
        sub = KVEventSubscriber(ix, {w: (p.endpoint, p.replay_endpoint)
                                     for w, p in enumerate(pubs)}).start()
        assert all(p.wait_subscribers(1) for p in pubs)
        t0 = time.perf_counter()
        for seq in range(n):
            for p, ps in zip(pubs, payloads):
                p.send_raw([b"", seq.to_bytes(8, "big"), ps[seq]])
        assert sub.wait(lambda: all(s["last_seq"] == n - 1 for s in sub.stats().values()), 600)
        took = time.perf_counter() - t0
        assert all(s["gaps"] == 0 and s["errors"] == 0 for s in sub.stats().values())
        sub.close()
        for p in pubs:
            p.close()
        return took

    best = {"direct": float("inf"), "decoded": float("inf"), "wire": float("inf")}
    for _ in range(repeat):  # taking turns: a noisy neighbour slows them alike
        for name, fn in (("direct", direct), ("decoded", decoded)):
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
        best["wire"] = min(best["wire"], wire())
    ctx.destroy(0)
    line("decode + apply, no sockets", best["decoded"], best["direct"], "apply alone")
    line("KVEventSubscriber over loopback ZMQ", best["wire"], best["direct"], "apply alone")
    print(f"  subscriber: {2 * n / best['wire']:,.0f} batches/s, {events / best['wire']:,.0f} "
          "events/s into the index (one thread, 2 workers)")


SECTIONS = {"core": section_core, "batch": section_batch, "prefix": section_prefix,
            "memory": section_memory, "load_check": section_load_check,
            "replay": section_replay, "scale": section_scale,
            "replay_scale": section_replay_scale, "cluster": section_cluster,
            "threads": section_threads, "serving": section_serving,
            "scheduler_step": section_scheduler_step,
            "containers": section_containers,
            "sglang": section_sglang, "sglang_loop": section_sglang_loop,
            "sglang_policy": section_sglang_policy,
            "dask": section_dask, "events": section_events,
            "router_dynamo": section_router_dynamo, "router_churn": section_router_churn,
            "router_wire": section_router_wire,
            "router_memory": section_router_memory,
            "router_service": section_router_service,
            "vllm": section_vllm}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="*",
                        help=f"sections to run, of {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="best of how many runs (default 3; 1 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="about 1/10 of every workload and 1 repeat: a run of about a minute")
    args = parser.parse_args()
    global QUICK
    QUICK = args.quick
    repeat = args.repeat if args.repeat is not None else (1 if QUICK else 3)
    if repeat < 1:
        parser.error(f"--repeat must be >= 1; got {repeat}")
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {list(SECTIONS)}")
    print(f"radix_soa {radix_soa.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cpus")
    names = args.sections or list(SECTIONS)
    for i, name in enumerate(names):
        progress(f"section {name} ({i + 1} of {len(names)}){' --quick' if QUICK else ''}")
        t0 = time.perf_counter()
        SECTIONS[name](repeat)
        sys.stdout.flush()
        progress(f"section {name} done in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
