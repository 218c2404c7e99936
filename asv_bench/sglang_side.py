"""radix_soa against SGLang's RadixCache, side by side: ``PrefixCache`` per
call (section ``sglang``), and radix_soa's SGLang cache
(``radix_soa.integrations.sglang``) in a scheduler-shaped loop (section
``sglang_loop``, at the end of this file).

Needs SGLang 0.5.23 importable (its own ~2.5 GB environment; recipe in
``docs/guide/sglang.md``), so it is not part of CI:

    /tmp/sgl-venv/bin/python asv_bench/bench.py sglang sglang_loop

Same keys, values and order for both. SGLang's ``RadixKey`` and ``*Params``
are built inside the timed loop (that is its public API); its keys are
prepared as ``array('q')`` and its values as torch tensors beforehand, ours
as NumPy arrays. Each figure is the median over ``repeat`` interleaved runs
of the per-call time of a loop over every request.
"""

import importlib.machinery
import statistics
import sys
import time
import types
from array import array

import numpy as np

import radix_soa as rs


def import_sglang():
    """SGLang's RadixCache pieces, or None when SGLang is not importable."""
    try:
        import transformers.utils.import_utils  # noqa: F401  (records torchvision as absent)
    except ImportError:
        return None

    class InterpolationMode:
        BICUBIC, BILINEAR, NEAREST = "bicubic", "bilinear", "nearest"

    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
        if name in sys.modules:
            continue
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)
        m.__path__ = []
        if name != "torchvision":
            m.InterpolationMode = InterpolationMode
        sys.modules[name] = m
    try:
        import torch
        from sglang.srt.mem_cache.base_prefix_cache import (EvictParams, InsertParams,
                                                            MatchPrefixParams)
        from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    except ImportError:
        return None
    return types.SimpleNamespace(torch=torch, RadixCache=RadixCache, RadixKey=RadixKey,
                                 InsertParams=InsertParams, MatchPrefixParams=MatchPrefixParams,
                                 EvictParams=EvictParams)


class _FakeAlloc:
    device = "cpu"

    def free_segment(self, idx, start_pos=0):
        pass

    def free(self, idx):
        pass


def shared_requests(n=200, shared=1000, own=100, seed=0):
    """``n`` requests of ``shared + own`` tokens sharing their first ``shared``."""
    rng = np.random.default_rng(seed)
    head = rng.integers(0, 32_000, size=shared)
    return [np.concatenate([head, rng.integers(0, 32_000, size=own)]) for _ in range(n)]


def mooncake_requests(limit=3000):
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from benchmarks import common

    trace = common.mooncake_conversation()
    if trace is None:
        return None
    return [np.ascontiguousarray(trace[i]) for i in range(min(limit, len(trace)))]


class Sides:
    """Both caches built from the same requests, and the per-call loops."""

    def __init__(self, sg, requests):
        self.sg = sg
        self.requests = requests
        self.keys = [array("q", r.tolist()) for r in requests]
        offsets = np.cumsum([0] + [len(r) for r in requests])
        self.values = [np.arange(offsets[i], offsets[i + 1], dtype=np.int64)
                       for i in range(len(requests))]
        self.tvalues = [sg.torch.from_numpy(v.copy()) for v in self.values]

    # ---------------------------------------------------------------- builds
    def sglang_tree(self):
        return self.sg.RadixCache.create_simulated(mock_allocator=_FakeAlloc(), page_size=1)

    def sglang_insert(self, t):
        sg = self.sg
        for k, v in zip(self.keys, self.tvalues):
            t.insert(sg.InsertParams(key=sg.RadixKey(k), value=v))

    def ours_insert(self, pc):
        for q, v in zip(self.requests, self.values):
            pc.insert(q, values=v)

    def built(self):
        t = self.sglang_tree()
        self.sglang_insert(t)
        pc = rs.PrefixCache()
        self.ours_insert(pc)
        return t, pc

    # ---------------------------------------------------------------- loops
    def sglang_match(self, t, keys):
        sg = self.sg
        for k in keys:
            m = t.match_prefix(sg.MatchPrefixParams(key=sg.RadixKey(k)))
            t.path_device_indices(m.last_device_node)

    def ours_match(self, pc, queries):
        for q in queries:
            pc.match(q)

    def sglang_nodes(self, t):
        sg = self.sg
        return [t.match_prefix(sg.MatchPrefixParams(key=sg.RadixKey(k))).last_device_node
                for k in self.keys]

    def ours_nodes(self, pc):
        return [pc.match(q).node for q in self.requests]


def _per_call(fn, n, repeat):
    """Median per-call seconds of ``fn()`` (a loop of ``n`` calls) over
    ``repeat`` runs, with the CPU time of the best run."""
    walls, cpus = [], []
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        walls.append((time.perf_counter() - t0) / n)
        cpus.append((time.process_time() - c0) / n)
    return statistics.median(walls), min(cpus)


def _row(what, ours, theirs):
    print(f"  {what:<46} SGLang {theirs[0] * 1e6:9.2f} µs   radix_soa {ours[0] * 1e6:7.2f} µs"
          f"   ratio {theirs[0] / ours[0]:7.1f}x   (cpu {theirs[1] / ours[1]:.1f}x)")


def compare(sg, name, requests, repeat):
    S = Sides(sg, requests)
    n = len(requests)
    print(f"\n  {name}: {n:,} requests, {sum(map(len, requests)):,} tokens")

    def fresh_insert_pair():
        t = S.sglang_tree()
        pc = rs.PrefixCache()
        return t, pc

    ours, theirs = [], []
    for _ in range(repeat):  # interleaved: one run of each per round
        t, pc = fresh_insert_pair()
        theirs.append(_per_call(lambda: S.sglang_insert(t), n, 1))
        ours.append(_per_call(lambda: S.ours_insert(pc), n, 1))
    _row("insert with values", _med(ours), _med(theirs))

    t, pc = S.built()
    ours, theirs = [], []
    for _ in range(repeat):
        theirs.append(_per_call(lambda: S.sglang_match(t, S.keys), n, 1))
        ours.append(_per_call(lambda: S.ours_match(pc, S.requests), n, 1))
    _row("match, full hit, with values", _med(ours), _med(theirs))

    # partial hits: each query leaves its request 10 tokens early and diverges,
    # so every match splits a node (fresh trees each round)
    cut = [max(1, len(r) - 10) for r in requests]
    pq = [np.concatenate([r[:c], [-1]]) for r, c in zip(requests, cut)]
    pk = [array("q", q.tolist()) for q in pq]
    ours, theirs = [], []
    for _ in range(repeat):
        t, pc = S.built()
        theirs.append(_per_call(lambda: S.sglang_match(t, pk), n, 1))
        ours.append(_per_call(lambda: S.ours_match(pc, pq), n, 1))
    _row("match, partial hit (splits), with values", _med(ours), _med(theirs))

    t, pc = S.built()
    tn, on = S.sglang_nodes(t), S.ours_nodes(pc)

    def sg_lock():
        for x in tn:
            t.inc_lock_ref(x)
            t.dec_lock_ref(x)

    def our_lock():
        for h in on:
            pc.lock(h)
            pc.unlock(h)

    ours, theirs = [], []
    for _ in range(repeat):
        theirs.append(_per_call(sg_lock, 2 * n, 1))
        ours.append(_per_call(our_lock, 2 * n, 1))
    _row("lock / unlock (per call)", _med(ours), _med(theirs))
    return S


def compare_evict(sg, S, repeat, first=100_000, later=64):
    ours_first, ours_pool, theirs_first, ours_later, theirs_later = [], [], [], [], []
    pool = np.arange(first, dtype=np.int64)  # a slot pool's free end: written before
    for _ in range(repeat):
        t, pc = S.built()
        theirs_first.append(_per_call(lambda: t.evict(sg.EvictParams(num_tokens=first)), 1, 1))
        ours_first.append(_per_call(lambda: pc.evict(first), 1, 1))
        pc = rs.PrefixCache()
        S.ours_insert(pc)
        ours_pool.append(_per_call(lambda: pc.evict(first, out=pool), 1, 1))
        theirs_later.append(_per_call(
            lambda: [t.evict(sg.EvictParams(num_tokens=later)) for _ in range(50)], 50, 1))
        ours_later.append(_per_call(lambda: [pc.evict(later) for _ in range(50)], 50, 1))
    _row(f"evict {first:,} tokens, first call after a build", _med(ours_first), _med(theirs_first))
    _row("  the same, into a slot pool (out=)", _med(ours_pool), _med(theirs_first))
    _row(f"evict {later} tokens, later calls", _med(ours_later), _med(theirs_later))


def _med(pairs):
    return statistics.median(p[0] for p in pairs), min(p[1] for p in pairs)


def run(repeat=3):
    sg = import_sglang()
    print("\n[sglang] PrefixCache vs SGLang 0.5.23 RadixCache, per call (median of "
          f"{repeat} interleaved runs)")
    if sg is None:
        print("  SGLang is not importable here: skipped (see ../shared/anchors/sglang-cpu.md "
              "for its environment)")
        return
    rs.warmup()
    S = compare(sg, "1,100-token requests sharing 1,000", shared_requests(), repeat)
    big = Sides(sg, shared_requests(n=1100, shared=0, own=100, seed=1))
    print("  evict on 1,100 requests of 100 unshared tokens (110,000 tokens)")
    compare_evict(sg, big, repeat)
    del S
    mc = mooncake_requests()
    if mc is None:
        print("  the Mooncake traces are not present: the conversation-id rows are skipped")
        return
    compare(sg, "Mooncake conversation trace (hash ids as tokens)", mc, repeat)


# ---------------------------------------------------------------------- the scheduler loop
# ``python asv_bench/bench.py sglang_loop``: requests served the way SGLang
# 0.5.23's scheduler serves them, on SGLang's RadixCache and on radix_soa's
# SGLang cache (radix_soa.integrations.sglang), same requests, same order.

def import_sglang_loop():
    """What the loop needs beyond ``import_sglang``, or None without SGLang."""
    sg = import_sglang()
    if sg is None:
        return None
    from sglang.srt.managers.schedule_batch import ReqKvInfo
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    from radix_soa.integrations.sglang import SGLangPrefixCache

    sg.__dict__.update(import_default().__dict__)
    sg.__dict__.update(ReqKvInfo=ReqKvInfo, PagedAllocator=PagedTokenToKVPoolAllocator,
                       TokenAllocator=TokenToKVPoolAllocator, CacheInitParams=CacheInitParams,
                       ReqToTokenPool=ReqToTokenPool, SGLangPrefixCache=SGLangPrefixCache)
    return sg


class SchedulerLoop:
    """One cache driven as SGLang's scheduler drives it, with SGLang's own
    ``ReqToTokenPool`` and token allocator (its size is the capacity):

    a request arrives -> ``match_prefix`` -> ``lock`` its node -> a row, the
    prefix's slots into it (``prefix_device_indices``) -> the prompt computed
    in chunks, new slots from the allocator (which evicts through the cache
    when full: SGLang's ``evict_to_free_tokens``), a ``checkpoint`` after each
    chunk but the last (chunked prefill: ``cache_unfinished_req``) -> the
    outputs decoded -> finished: ``checkpoint`` of prompt + outputs, its own
    slots freed (``free_kv_row``), ``unlock``, the row freed
    (``cache_finished_req``). ``window`` requests are in flight at a time."""

    def __init__(self, sg, kind, page_size, capacity, window, chunk, max_len):
        self.sg, self.page_size, self.window, self.chunk = sg, page_size, window, chunk
        torch = sg.torch
        self.pool = sg.ReqToTokenPool(size=window + 1, max_context_len=max_len, device="cpu",
                                      enable_memory_saver=False)
        if page_size == 1:
            self.alloc = sg.TokenAllocator(size=capacity, dtype=torch.float16, device="cpu",
                                           kvcache=None, need_sort=False)
        else:
            self.alloc = sg.PagedAllocator(size=capacity, page_size=page_size,
                                           dtype=torch.float16, device="cpu", kvcache=None,
                                           need_sort=False)
        params = sg.CacheInitParams(disable=False, req_to_token_pool=self.pool,
                                    token_to_kv_pool_allocator=self.alloc, page_size=page_size)
        if kind.startswith("unified-"):  # SGLang's default: UnifiedRadixCache on a tree core
            self.cache = default_cache(sg, kind, page_size, self.alloc, self.pool)
        else:
            cls = sg.RadixCache if kind == "sglang" else sg.SGLangPrefixCache
            self.cache = cls(params)
        self.hit = self.asked = self._rid = 0
        self.in_cache = 0.0  # seconds inside the cache's methods (outermost calls)
        self._depth = 0
        for name in ("match_prefix", "lock", "unlock", "prefix_device_indices", "checkpoint",
                     "free_kv_row", "evict", "evict_for_alloc"):
            setattr(self.cache, name, self._timed(getattr(self.cache, name)))

    def _timed(self, method):
        """``method`` with its time added to ``in_cache`` (a call made from
        inside another timed call is not counted twice): the same wrapper on
        both caches, so both pay its ~0.3 µs a call."""
        clock = time.perf_counter

        def timed(*args, **kwargs):
            self._depth += 1
            t0 = clock()
            try:
                return method(*args, **kwargs)
            finally:
                self._depth -= 1
                if not self._depth:
                    self.in_cache += clock() - t0
        return timed

    def _slots(self, n):
        slots = self.alloc.alloc(n)
        if slots is None:
            self.alloc.evict_to_free_tokens(self.cache, n)
            slots = self.alloc.alloc(n)
            if slots is None:
                raise RuntimeError("the capacity cannot hold the requests in flight")
        return slots

    def _fill(self, req, start, end):
        """New slots for positions [start, end) of the request's row: the
        rest of its partial last page first, then whole new pages."""
        row = self.pool.req_to_token[req.kv.req_pool_idx]
        ps, pos = self.page_size, start
        if ps > 1 and pos % ps and pos < end:
            k = min(end, pos + ps - pos % ps) - pos
            base = int(row[pos - 1]) + 1
            row[pos:pos + k] = self.sg.torch.arange(base, base + k)
            pos += k
        if pos < end:
            n = end - pos
            row[pos:end] = self._slots(-(-n // ps) * ps)[:n]

    def admit(self, prompt):
        sg, cache = self.sg, self.cache
        req = types.SimpleNamespace(kv=sg.ReqKvInfo(), full_untruncated_fill_ids=array("q", prompt),
                                    origin_input_ids=prompt, extra_key=None, cache_salt=None,
                                    priority=0, lock=None, last_node=None, prefix_len=0,
                                    session=None, rid=str(self._rid), session_id=None,
                                    kv_rotation_base=None, done=False)
        req.finished = lambda: req.done  # UnifiedRadixCache reads these of SGLang's Req
        self._rid += 1
        m = cache.match_prefix(sg.MatchPrefixParams(key=sg.RadixKey(req.full_untruncated_fill_ids)))
        req.prefix_len, req.last_node = m.device_prefix_len, m.last_device_node
        req.kv.cache_protected_len = req.prefix_len
        req.lock = cache.lock(req.last_node)
        req.kv.req_pool_idx = self.pool.alloc_rows(1)[0]
        if req.prefix_len:
            self.pool.req_to_token[req.kv.req_pool_idx, :req.prefix_len] = \
                cache.prefix_device_indices(req)
        self.hit += req.prefix_len
        self.asked += len(prompt)
        n, pos = len(prompt), req.prefix_len
        while pos < n:
            end = min(pos + self.chunk, n)
            self._fill(req, pos, end)
            pos = end
            if end < n:
                cache.checkpoint(req, up_to=end)
        return req

    def finish(self, req, outputs):
        cache = self.cache
        req.full_untruncated_fill_ids.extend(outputs)
        n = len(req.origin_input_ids) + len(outputs) - 1  # the last output's KV is never computed
        self._fill(req, len(req.origin_input_ids), n)
        req.done = True
        cache.checkpoint(req, up_to=n)
        cache.free_kv_row(req.kv, [(req.kv.cache_protected_len, n)])
        cache.unlock(req.lock)
        req.lock = None
        self.pool.free_rows([req.kv.req_pool_idx])

    def run(self, prompts, outputs):
        running = []
        for prompt, out in zip(prompts, outputs):
            running.append((self.admit(prompt), out))
            if len(running) == self.window:
                self.finish(*running.pop(0))
        for req, out in running:
            self.finish(req, out)

    def leak_free(self):
        """SGLang's idle check: every slot free, evictable or protected."""
        return (self.alloc.available_size() + self.cache.evictable_size()
                + self.cache.protected_size() == self.alloc.size)


def _distinct_tokens(prompts, outputs, page_size):
    """Tokens an unbounded cache would end up holding: every request's prompt
    and computed outputs, shared prefixes once, whole pages."""
    import radix_soa as rs

    pc = rs.PrefixCache(values=False, page_size=page_size)
    for p, o in zip(prompts, outputs):
        pc.insert(np.concatenate([np.asarray(p, np.int64), np.asarray(o[:-1], np.int64)]))
    return pc.total_tokens


def _loop_row(sg, name, prompts, outputs, page_size, fraction, repeat, window=8, chunk=256):
    unique = _distinct_tokens(prompts, outputs, page_size)
    longest = max(len(p) + len(o) for p, o in zip(prompts, outputs))
    # the requests in flight must fit, whatever the fraction
    capacity = max(int(unique * fraction), window * (longest + 2 * page_size))
    capacity -= capacity % page_size
    for kind in LOOP_KINDS:  # compile (or load) the kernels before timing
        SchedulerLoop(sg, kind, page_size, capacity, window, chunk,
                      longest + page_size).run(prompts[:20], outputs[:20])
    walls = {k: [] for k in LOOP_KINDS}
    cpus = {k: [] for k in LOOP_KINDS}
    inside = {k: [] for k in LOOP_KINDS}
    hits = {}
    for r in range(repeat):
        order = LOOP_KINDS[r % len(LOOP_KINDS):] + LOOP_KINDS[:r % len(LOOP_KINDS)]
        for kind in order:
            loop = SchedulerLoop(sg, kind, page_size, capacity, window, chunk, longest + page_size)
            c0, t0 = time.process_time(), time.perf_counter()
            loop.run(prompts, outputs)
            walls[kind].append(time.perf_counter() - t0)
            cpus[kind].append(time.process_time() - c0)
            inside[kind].append(loop.in_cache)
            if not loop.leak_free():
                raise AssertionError(f"{kind}: slots leaked in the {name} loop")
            hits[kind] = loop.hit / loop.asked
    n = len(prompts)
    wall = {k: statistics.median(v) for k, v in walls.items()}
    cache_s = {k: statistics.median(v) for k, v in inside.items()}
    print(f"\n  {name}: {n:,} requests, page size {page_size}, capacity {capacity:,} tokens "
          f"({capacity / unique:.0%} of the {unique:,} an unbounded cache holds), {window} in "
          f"flight, chunks of {chunk}")
    for kind in LOOP_KINDS:
        print(f"    {LOOP_LABELS[kind]:<30} {n / wall[kind]:9,.0f} requests/s   "
              f"{cache_s[kind] / n * 1e6:8.1f} µs a request in the cache   hit rate "
              f"{hits[kind]:.3f}")
    for other in LOOP_KINDS[:-1]:
        print(f"    radix_soa vs {LOOP_LABELS[other]}: {wall[other] / wall['radix_soa']:.2f}x "
              f"requests/s (cpu {min(cpus[other]) / min(cpus['radix_soa']):.2f}x), "
              f"{cache_s[other] / cache_s['radix_soa']:.2f}x time in the cache")
    print(f"    median of {repeat} interleaved runs. The rest of the loop is SGLang's own "
          "allocator and request-pool tensor work, the same on every side")


LOOP_KINDS = ["unified-rust", "sglang", "radix_soa"]
LOOP_LABELS = {"unified-rust": "UnifiedRadixCache (Rust core)", "sglang": "SGLang RadixCache",
               "radix_soa": "radix_soa"}


def _generated(n, seed=0, out_len=16):
    import radix_soa as rs

    seqs = rs.workloads.generate("multi_turn", n=n)
    rng = np.random.default_rng(seed)
    prompts = [array("q", np.asarray(s, np.int64).tolist()) for s in seqs]
    outputs = [rng.integers(0, 32_000, out_len).tolist() for _ in prompts]
    return prompts, outputs


def _mooncake(limit):
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from benchmarks import common

    trace = common.mooncake_conversation()
    if trace is None:
        return None
    n = min(limit, len(trace))
    prompts = [array("q", np.asarray(trace[i], np.int64).tolist()) for i in range(n)]
    # outputs in blocks of 512 tokens, as the trace's ids are; ids of their own (negative)
    blocks = [max(1, int(trace.output_tokens[i]) // 512) for i in range(n)]
    outputs = [[-(i * 64 + k) - 1 for k in range(b)] for i, b in enumerate(blocks)]
    return prompts, outputs


def run_loop(repeat=3, quick=False):
    sg = import_sglang_loop()
    print("\n[sglang_loop] a scheduler-shaped loop on SGLang 0.5.23's UnifiedRadixCache (Rust core), RadixCache and on "
          "radix_soa.integrations.sglang (requests/s, higher is better)")
    if sg is None:
        print("  SGLang is not importable here: skipped (see docs/guide/sglang.md)")
        return
    gen = _generated(30 if quick else 150)
    _loop_row(sg, "generated multi-turn chat", *gen, page_size=1, fraction=0.25, repeat=repeat)
    _loop_row(sg, "generated multi-turn chat", *gen, page_size=16, fraction=0.25, repeat=repeat)
    mc = _mooncake(600 if quick else 4000)
    if mc is None:
        print("  the Mooncake traces are not present: the trace row is skipped")
        return
    _loop_row(sg, "Mooncake conversation trace (hash ids as tokens)", *mc, page_size=1,
              fraction=0.25, repeat=repeat)


# ---------------------------------------------------------------------- against the default
# ``python asv_bench/bench.py sglang`` (second part): SGLang 0.5.23's
# default tree cache, ``UnifiedRadixCache`` (what it builds when
# --radix-cache-backend is unset), on both of its tree cores, beside
# ``RadixCache``, radix_soa's SGLang cache (``SGLangPrefixCache``, what
# --radix-cache-backend radix_soa builds) and a bare ``PrefixCache``. The
# four SGLang-interface caches take the same SGLang objects built in the
# loop (``RadixKey``, ``*Params``) and the same torch index tensors.

def import_default():
    """``import_sglang`` plus what building the default cache needs."""
    sg = import_sglang()
    if sg is None:
        return None
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from radix_soa.integrations.sglang import SGLangPrefixCache

    sg.__dict__.update(CacheInitParams=CacheInitParams, ComponentType=ComponentType,
                       UnifiedRadixCache=UnifiedRadixCache, SGLangPrefixCache=SGLangPrefixCache)
    return sg


def default_cache(sg, kind, page_size=1, allocator=None, pool=None):
    """A cache as SGLang builds it: ``unified-rust`` / ``unified-python``
    (``UnifiedRadixCache`` on that tree core: SGLang reads
    ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`` when it builds one),
    ``radix`` (``RadixCache``), ``radix_soa`` (the adapter)."""
    import os

    allocator = _FakeAlloc() if allocator is None else allocator
    params = sg.CacheInitParams(disable=False, req_to_token_pool=pool,
                                token_to_kv_pool_allocator=allocator, page_size=page_size,
                                tree_components=(sg.ComponentType.FULL,))
    if kind.startswith("unified-"):
        old = os.environ.get("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND")
        os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = kind.split("-", 1)[1]
        try:
            return sg.UnifiedRadixCache(params)
        finally:
            if old is None:
                del os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"]
            else:
                os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = old
    if kind == "radix":
        return sg.RadixCache(params)
    return sg.SGLangPrefixCache(params)


DEFAULT_LABELS = {"unified-rust": "UnifiedRadixCache (Rust core)",
                  "unified-python": "UnifiedRadixCache (Python core)",
                  "radix": "RadixCache", "radix_soa": "radix_soa SGLangPrefixCache",
                  "bare": "bare PrefixCache"}


class DefaultSides:
    """Each cache's insert / match / evict over the same requests: SGLang's
    interface for the four SGLang caches, NumPy views of the same keys and
    value tensors for the bare ``PrefixCache``."""

    def __init__(self, sg, requests):
        self.sg = sg
        self.requests = [np.ascontiguousarray(r, np.int64) for r in requests]
        self.keys = [array("q", r.tolist()) for r in self.requests]
        offsets = np.cumsum([0] + [len(r) for r in self.requests])
        self.values = [np.arange(offsets[i], offsets[i + 1], dtype=np.int64)
                       for i in range(len(self.requests))]
        self.tvalues = [sg.torch.from_numpy(v.copy()) for v in self.values]
        cut = [max(1, len(r) - 10) for r in self.requests]  # partial hits: 10 tokens early
        partial = [np.concatenate([r[:c], [1 << 30]]) for r, c in zip(self.requests, cut)]
        self.partial_keys = [array("q", q.tolist()) for q in partial]
        # the bare PrefixCache reads the same memory as the SGLang caches (NumPy
        # views of the keys' array('q') and of the value tensors, made here):
        # one flat buffer of requests would be faster to read than 2,000
        # separate keys, by up to 0.4 µs a match, and that is not the adapter's
        self.requests = [np.frombuffer(k, np.int64) for k in self.keys]
        self.values = [v.numpy() for v in self.tvalues]
        self.partial = [np.frombuffer(k, np.int64) for k in self.partial_keys]

    def new(self, kind):
        return rs.PrefixCache() if kind == "bare" else default_cache(self.sg, kind)

    def insert(self, kind, c):
        if kind == "bare":
            for q, v in zip(self.requests, self.values):
                c.insert(q, values=v)
            return
        sg = self.sg
        for k, v in zip(self.keys, self.tvalues):
            c.insert(sg.InsertParams(key=sg.RadixKey(k), value=v))

    def built(self, kind):
        c = self.new(kind)
        self.insert(kind, c)
        return c

    def match(self, kind, c, partial=False):
        if kind == "bare":
            for q in (self.partial if partial else self.requests):
                c.match(q)
            return
        sg = self.sg
        for k in (self.partial_keys if partial else self.keys):
            m = c.match_prefix(sg.MatchPrefixParams(key=sg.RadixKey(k)))
            c.path_device_indices(m.last_device_node)

    def evict(self, kind, c, n):
        if kind == "bare":
            return c.evict(n).num_tokens
        return c.evict(self.sg.EvictParams(num_tokens=n)).num_tokens_evicted


def _cpu_call(fn, calls):
    """CPU seconds per call of ``fn()`` (a loop of ``calls`` calls)."""
    c0 = time.process_time()
    fn()
    return (time.process_time() - c0) / calls


DEFAULT_KINDS = ("unified-rust", "unified-python", "radix", "radix_soa", "bare")


def compare_default(sg, requests, repeat, kinds=DEFAULT_KINDS, evict_n=100_000):
    """Per-call CPU time of each cache on insert, full-hit match with its
    indices, partial-hit match (a split each) and one evict(evict_n) on a
    fresh tree: best of ``repeat`` rounds, the kinds interleaved (their
    order rotates each round)."""
    S = DefaultSides(sg, requests)
    n = len(requests)
    ops = ("insert", "match, full hit, with indices", "match, partial hit (splits)",
           f"evict({evict_n:,}) on a fresh tree")
    best = {(k, op): float("inf") for k in kinds for op in ops}
    evicted = {}
    for k in kinds:  # compile / warm each once
        S.match(k, S.built(k))
    for r in range(repeat):
        order = list(kinds[r % len(kinds):]) + list(kinds[:r % len(kinds)])
        for k in order:
            c = S.new(k)
            t = _cpu_call(lambda: S.insert(k, c), n)
            best[k, ops[0]] = min(best[k, ops[0]], t)
            t = _cpu_call(lambda: S.match(k, c), n)
            best[k, ops[1]] = min(best[k, ops[1]], t)
            c = S.built(k)
            t = _cpu_call(lambda: S.match(k, c, partial=True), n)
            best[k, ops[2]] = min(best[k, ops[2]], t)
            c = S.built(k)
            got = []
            t = _cpu_call(lambda: got.append(S.evict(k, c, evict_n)), 1)
            best[k, ops[3]] = min(best[k, ops[3]], t)
            evicted[k] = got[0]
    print(f"\n  {n:,} requests, {sum(map(len, requests)):,} tokens, page size 1: CPU µs a "
          f"call, best of {repeat} interleaved rounds")
    print("  " + " " * 34 + "".join(f"{DEFAULT_LABELS[k][:22]:>24}" for k in kinds))
    for op in ops:
        print(f"  {op:<34}" + "".join(f"{best[k, op] * 1e6:24.1f}" for k in kinds))
    if "radix_soa" in kinds:
        for other in kinds:
            if other == "radix_soa":
                continue
            rat = [best[other, op] / best["radix_soa", op] for op in ops]
            if other == "bare":
                rat = [1 / x for x in rat]
            what = "the adapter's time / bare" if other == "bare" else f"{other} / adapter"
            print(f"  {what:<34}" + "".join(f"{x:8.2f}x" for x in rat)
                  + ("  (<= 1.25 wanted)" if other == "bare" else ""))
    print("  tokens evicted: " + ", ".join(f"{DEFAULT_LABELS[k]} {evicted[k]:,}" for k in kinds))
    if "radix_soa" in kinds and "bare" in kinds:
        _where_the_time_goes(S, best, ops, repeat)
    return best


def _where_the_time_goes(S, best, ops, repeat):
    """Where an adapter call's time goes, step by step on the same requests
    (each step adds one piece to the one before; interleaved, best of
    ``repeat``, CPU µs a call): a bare ``PrefixCache`` call on NumPy
    arrays, the same on the ``array('q')`` keys' NumPy views, the torch
    conversions SGLang's types need (``.numpy()`` of the value tensor,
    ``torch.from_numpy`` of the matched indices), the adapter's own Python
    (its call with ``RadixKey`` / ``*Params`` built beforehand), and those
    objects built in the loop, as the scheduler does."""
    sg, n = S.sg, len(S.keys)
    torch = sg.torch
    frombuffer, i64 = np.frombuffer, np.int64
    ins_params = [sg.InsertParams(key=sg.RadixKey(k), value=v) for k, v in zip(S.keys, S.tvalues)]
    full_params = [sg.MatchPrefixParams(key=sg.RadixKey(k)) for k in S.keys]
    part_params = [sg.MatchPrefixParams(key=sg.RadixKey(k)) for k in S.partial_keys]

    def each(call, *columns):
        """A loop of ``call`` over the columns, each result dropped at once
        (a list of them would keep every matched array alive)."""
        def loop(c):
            for args in zip(*columns):
                call(c, *args)
        return loop

    def pc_insert(c, q, v):
        c.prefix_cache.insert(q, v)

    ins = [
        ("bare PrefixCache.insert, NumPy key and values", each(pc_insert, S.requests, S.values)),
        ("+ the key as a view of its array('q')",
         each(lambda c, k, v: c.prefix_cache.insert(frombuffer(k, i64), v), S.keys, S.values)),
        ("+ the value tensor as NumPy (.numpy())",
         each(lambda c, k, v: c.prefix_cache.insert(frombuffer(k, i64), v.numpy()),
              S.keys, S.tvalues)),
        ("adapter.insert, Params built beforehand", each(lambda c, p: c.insert(p), ins_params)),
        ("adapter.insert, RadixKey + Params in the loop",
         each(lambda c, k, v: c.insert(sg.InsertParams(key=sg.RadixKey(k), value=v)),
              S.keys, S.tvalues)),
    ]
    full = [
        ("bare PrefixCache.match, NumPy key",
         each(lambda c, q: c.prefix_cache.match(q), S.requests)),
        ("+ the key as a view of its array('q')",
         each(lambda c, k: c.prefix_cache.match(frombuffer(k, i64)), S.keys)),
        ("+ a torch tensor over the indices",
         each(lambda c, k: torch.from_numpy(c.prefix_cache.match(frombuffer(k, i64)).values),
              S.keys)),
        ("adapter match_prefix + path_device_indices, Params built beforehand",
         each(lambda c, p: c.path_device_indices(c.match_prefix(p).last_device_node),
              full_params)),
        ("the same, RadixKey + Params in the loop",
         each(lambda c, k: c.path_device_indices(c.match_prefix(
             sg.MatchPrefixParams(key=sg.RadixKey(k))).last_device_node), S.keys)),
    ]
    part = [
        ("bare PrefixCache.match, NumPy key",
         each(lambda c, q: c.prefix_cache.match(q), S.partial)),
        ("+ the key as a view of its array('q')",
         each(lambda c, k: c.prefix_cache.match(frombuffer(k, i64)), S.partial_keys)),
        ("adapter match_prefix, Params built beforehand",
         each(lambda c, p: c.match_prefix(p), part_params)),
        ("the same, RadixKey + Params in the loop",
         each(lambda c, k: c.match_prefix(sg.MatchPrefixParams(key=sg.RadixKey(k))),
              S.partial_keys)),
    ]
    # each step on a cache of its own, just built, as compare_default times them
    groups = (("insert (on a fresh cache)", ins, lambda: S.new("radix_soa")),
              ("match, full hit, with indices", full, lambda: S.built("radix_soa")),
              ("match, partial hit (splits)", part, lambda: S.built("radix_soa")))
    times = {(g, i): float("inf") for g, steps, _ in groups for i in range(len(steps))}
    for r in range(repeat):
        for g, steps, make in groups:
            order = list(range(len(steps)))
            order = order[r % len(order):] + order[:r % len(order)]
            for i in order:
                c = make()
                times[g, i] = min(times[g, i], _cpu_call(lambda: steps[i][1](c), n))
    print(f"\n  where an adapter call's time goes, step by step (CPU µs a call, best of "
          f"{repeat}, interleaved; each step adds one piece):")
    for g, steps, _ in groups:
        print(f"  {g}")
        prev = None
        for i, (what, _) in enumerate(steps):
            t = times[g, i] * 1e6
            step = "" if prev is None else f"  (+{t - prev:.2f})"
            print(f"    {what:<70}{t:7.2f}{step}")
            prev = t


def multi_turn_requests(n=2000, conversations=300):
    """The first ``n`` sequences of the generated multi-turn chat workload
    (turns of conversations interleaved)."""
    seqs = rs.workloads.generate("multi_turn", n=conversations)
    return [np.asarray(s, np.int64) for s in seqs[:n]]


def run_default(repeat=5, quick=False, kinds=None):
    sg = import_default()
    print("\n[sglang] against SGLang 0.5.23's default tree cache, UnifiedRadixCache (both tree "
          "cores), RadixCache, the adapter and a bare PrefixCache, per call")
    if sg is None:
        print("  SGLang is not importable here: skipped")
        return
    rs.warmup()
    reqs = multi_turn_requests(200 if quick else 2000)
    compare_default(sg, reqs, repeat, kinds=tuple(kinds) if kinds else DEFAULT_KINDS,
                    evict_n=10_000 if quick else 100_000)


# ---------------------------------------------------------------------- the scheduler's policy
# ``python asv_bench/bench.py sglang_policy``: SGLang 0.5.23's own
# ``SchedulePolicy.calc_priority`` (LPM) over a waiting queue, on the
# adapter and on UnifiedRadixCache (Rust core), per waiting request.

def _clocked(method, spent):
    """``method`` with its CPU time added to ``spent[0]``."""
    clock = time.process_time

    def clocked(*args, **kwargs):
        t0 = clock()
        try:
            return method(*args, **kwargs)
        finally:
            spent[0] += clock() - t0
    return clocked


def run_policy(repeat=5, quick=False, sizes=(128, 1024, 4096)):
    sg = import_default()
    print("\n[sglang_policy] SGLang's SchedulePolicy.calc_priority (LPM) over waiting Reqs, "
          "CPU µs per waiting request (best of rounds)")
    if sg is None:
        print("  SGLang is not importable here: skipped")
        return
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.runtime_context import create_context, use_context
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    rs.warmup()
    seqs = multi_turn_requests(6000 if not quick else 1500, conversations=1200)
    cached, later = seqs[:len(seqs) // 3], seqs[len(seqs) // 3:]
    kinds = ("unified-rust", "radix_soa")
    ctx = create_context(ServerArgs(model_path="dummy", device="cpu"), role="scheduler")
    with use_context(ctx):
        caches = {}
        for kind in kinds:
            c = default_cache(sg, kind)
            for i, q in enumerate(cached):
                c.insert(sg.InsertParams(key=sg.RadixKey(array("q", q.tolist())),
                                         value=sg.torch.arange(i * 5000, i * 5000 + len(q))))
            caches[kind] = c
        for n in sizes:
            if quick:
                n = min(n, 512)
            prompts = [array("q", later[i % len(later)].tolist()) for i in range(n)]
            best, matched, inside = {}, {}, {}
            for r in range(repeat):
                for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                    c = caches[kind]
                    policy = SchedulePolicy("lpm", c, False, False, False)
                    waiting = [Req(str(i), "", p, SamplingParams(max_new_tokens=8))
                               for i, p in enumerate(prompts)]
                    spent = [0.0]
                    c.match_prefix = _clocked(type(c).match_prefix.__get__(c), spent)
                    try:
                        t = _cpu_call(lambda: policy.calc_priority(waiting), n)
                    finally:
                        del c.match_prefix
                    if t < best.get(kind, float("inf")):
                        best[kind], inside[kind] = t, spent[0] / n
                    matched[kind] = sum(req.prefix_len for req in waiting) / sum(map(len, prompts))
            pc = caches["radix_soa"].prefix_cache
            batch = [np.frombuffer(p, np.int64).copy() for p in prompts]
            hook = min(_cpu_call(lambda: pc.match_batch(batch, with_values=True), n)
                       for _ in range(repeat))
            print(f"  {n:5,d} waiting: " + "   ".join(
                f"{DEFAULT_LABELS[k]} {best[k] * 1e6:6.2f} µs ({inside[k] * 1e6:5.2f} in its "
                f"match_prefix; matched {matched[k]:.0%} of the tokens)" for k in kinds)
                + f"   ratio {best['unified-rust'] / best['radix_soa']:.2f}x; a batch hook "
                f"(PrefixCache.match_batch with values, one call) {hook * 1e6:.2f} µs")
    print("  past 128 waiting, LPM falls back to first-come order; a cache answering "
          "supports_fast_match_prefix() (the adapter) still gets every request matched "
          "(its prefix length and node), UnifiedRadixCache (Rust) answers False and is not "
          "asked")
