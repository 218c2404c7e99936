"""The serving API: the request lifecycle in a toy serving loop,
``insert_batch`` beside a loop of ``insert``, and eviction under every
policy beside the pure-Python reference."""

import numpy as np

import radix_soa
from radix_soa._kernels.layout import POLICIES
from radix_soa.baselines.reference_prefix import ReferencePrefixCache


def short_requests(n=20_000, seed=0):
    rng = np.random.default_rng(seed)
    heads = [rng.integers(0, 32_000, size=int(k)) for k in rng.integers(20, 60, size=200)]
    return [np.concatenate([heads[int(h)], rng.integers(0, 32_000, size=int(k))])
            for h, k in zip(rng.integers(0, 200, size=n), rng.integers(1, 40, size=n))]


class ServingLoop:
    """begin -> slots for the uncached tokens -> finish, 2,000 requests."""
    params = (POLICIES,)
    param_names = ("policy",)

    def setup(self, policy):
        radix_soa.warmup()
        self.requests = short_requests(2000)
        self.outputs = np.arange(8, dtype=np.int64) + 10**6

    def time_serving_loop(self, policy):
        pc = radix_soa.PrefixCache(capacity=30_000, eviction_policy=policy)
        next_slot = 0
        for q in self.requests:
            r = pc.begin(q)
            need = q.shape[0] - r.cached + 8
            slots = np.concatenate([r.values, np.arange(next_slot, next_slot + need)])
            next_slot += need
            pc.finish(r, np.concatenate([q, self.outputs]), slots)


class InsertBatch:
    """Building a cache of 20,000 short requests with values."""
    params = (("insert_batch", "loop of insert"),)
    param_names = ("how",)

    def setup(self, how):
        radix_soa.warmup()
        self.requests = short_requests()
        self.values = [np.arange(len(q), dtype=np.int64) for q in self.requests]
        self.batch = radix_soa.pack(self.requests)
        self.vbatch = radix_soa.pack(self.values)

    def time_build(self, how):
        pc = radix_soa.PrefixCache()
        if how == "insert_batch":
            pc.insert_batch(self.batch, values=self.vbatch)
        else:
            for q, v in zip(self.requests, self.values):
                pc.insert(q, values=v)


class EvictByPolicy:
    """Evicting 50,000 of ~110,000 cached tokens under each policy (a fresh
    cache per sample: with ``number = 1`` asv runs setup before each)."""
    params = (("radix_soa", "reference"), POLICIES)
    param_names = ("impl", "policy")
    number = 1
    repeat = 5
    warmup_time = 0

    def setup(self, impl, policy):
        radix_soa.warmup()
        cls = radix_soa.PrefixCache if impl == "radix_soa" else ReferencePrefixCache
        self.cache = cls(eviction_policy=policy)
        for i, q in enumerate(short_requests(3000, seed=1)):
            self.cache.insert(q, values=np.arange(len(q)), priority=i % 3)

    def time_evict(self, impl, policy):
        self.cache.evict(50_000)


class SchedulerStep:
    """Steps of 256 short requests (2,048 in all, each served twice: a miss,
    then a hit): ``begin_batch`` + ``checkpoint_batch`` + ``finish_batch``,
    one kernel call each, beside the loop of per-request calls."""
    params = (("batched", "per-request"),)
    param_names = ("how",)

    def setup(self, how):
        radix_soa.warmup()
        requests = short_requests(2048, seed=3)
        outputs = np.arange(16, dtype=np.int64) + 10**6
        self.steps = []
        for a in range(0, len(requests), 256):
            chunk = requests[a:a + 256]
            full = [np.concatenate([q, outputs]) for q in chunk]
            vals = [np.arange(len(q), dtype=np.int64) + 10**7 * i for i, q in enumerate(full)]
            self.steps.append((radix_soa.pack(chunk), radix_soa.pack([v[:len(q)] for v, q in
                                                                      zip(vals, chunk)]),
                               radix_soa.pack(full), radix_soa.pack(vals)))

    def time_step(self, how):
        pc = radix_soa.PrefixCache()
        for _ in range(2):
            for prompts, pvals, full, fvals in self.steps:
                if how == "batched":
                    rb, _ = pc.begin_batch(prompts)
                    pc.checkpoint_batch(rb, prompts, pvals)
                    pc.finish_batch(rb, full, fvals)
                else:
                    reqs = [pc.begin(q) for q in prompts]
                    for r, q, v in zip(reqs, prompts, pvals):
                        pc.checkpoint(r, q, v)
                    for r, q, v in zip(reqs, full, fvals):
                        pc.finish(r, q, v)


class EvictIntoPool:
    """``evict(n, out=)``: 50,000 freed slot ids written into a slot pool's
    free end (no allocation), beside ``evict(n)``, on a fresh cache."""
    params = (("out=", "allocating"),)
    param_names = ("how",)
    number = 1
    repeat = 5
    warmup_time = 0

    def setup(self, how):
        radix_soa.warmup()
        self.cache = radix_soa.PrefixCache()
        for q in short_requests(3000, seed=1):
            self.cache.insert(q, values=np.arange(len(q)))
        self.pool = np.zeros(60_000, np.int64)

    def time_evict(self, how):
        if how == "out=":
            self.cache.evict(50_000, out=self.pool)
        else:
            self.cache.evict(50_000)
