"""PrefixCache (RadixAttention semantics) beside the pure-Python object-tree
reference with the same semantics."""

import numpy as np

import radix_soa
from radix_soa._warmup import warmup_prefix
from radix_soa.baselines.reference_prefix import ReferencePrefixCache

from .common import short_corpus

IMPLS = ("radix_soa", "reference")


def make(impl, **kwargs):
    return radix_soa.PrefixCache(**kwargs) if impl == "radix_soa" else ReferencePrefixCache(**kwargs)


def long_prefixes(seed=0, n=32, length=8192):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 32_000, size=length) for _ in range(n)]


def chat(seed=1):
    return radix_soa.workloads.shared_prefix(n_sequences=2000, n_prompts=20, prompt_len=400,
                                             tail_len=(50, 250), seed=seed)


class Match:
    """Requests of a cached 8,192-token prefix plus a 64-token tail."""
    params = (IMPLS, (True, False))
    param_names = ("impl", "values")

    def setup(self, impl, values):
        warmup_prefix(values=values)  # the kernels this class runs, not all of them:
        # a cold first run then fits asv's timeout
        prefixes = long_prefixes()
        self.cache = make(impl, values=values)
        for p in prefixes:
            self.cache.insert(p, values=p if values else None)
        rng = np.random.default_rng(2)
        self.queries = [np.concatenate([prefixes[int(rng.integers(0, 32))],
                                        rng.integers(0, 32_000, size=64)]) for _ in range(200)]

    def time_match_200_requests(self, impl, values):
        m = self.cache.match
        for q in self.queries:
            m(q)


class Insert:
    params = (IMPLS,)
    param_names = ("impl",)
    number = 1
    repeat = (1, 5, 30.0)
    warmup_time = 0

    def setup(self, impl):
        warmup_prefix(values=True)  # the kernels this class runs
        self.seqs = chat()
        self.cache = make(impl, capacity=200_000)

    def time_insert_with_capacity_eviction(self, impl):
        ins = self.cache.insert
        for s in self.seqs:
            ins(s, values=s)


class Evict:
    params = (IMPLS, (64, 100_000))
    param_names = ("impl", "tokens")
    number = 1
    repeat = (3, 10, 30.0)
    warmup_time = 0

    def setup(self, impl, tokens):
        warmup_prefix(values=True)  # the kernels this class runs
        self.cache = make(impl)
        for s in chat():
            self.cache.insert(s, values=s)

    def time_evict(self, impl, tokens):
        self.cache.evict(tokens)


class LockUnlock:
    params = (IMPLS,)
    param_names = ("impl",)

    def setup(self, impl):
        warmup_prefix(values=True)  # the kernels this class runs
        seqs = chat()
        self.cache = make(impl)
        for s in seqs:
            self.cache.insert(s, values=s)
        self.handles = [self.cache.match(s).node for s in seqs[:500]]

    def time_lock_unlock_500(self, impl):
        for h in self.handles:
            self.cache.lock(h)
        for h in self.handles:
            self.cache.unlock(h)


class MatchBatch:
    def setup(self):
        warmup_prefix(values=False)  # the kernels this class runs
        seqs = chat()
        self.cache = radix_soa.PrefixCache(values=False)
        for s in seqs:
            self.cache.insert(s)
        self.batch = radix_soa.pack(seqs)

    def time_match_batch(self):
        self.cache.match_batch(self.batch)


class CachedShortRequests:
    """100,000 short requests (``common.short_corpus``: 1,000 prompts of
    20-100 tokens plus tails of 1-45), all cached: a batch match or a batch
    insert of them again. Under
    lru every request refreshes its leaf's key; under fifo none does, so the
    two differ by what a refreshed key costs the eviction heap."""
    params = (("lru", "fifo"),)
    param_names = ("policy",)
    timeout = 180

    def setup(self, policy):
        warmup_prefix(values=False)  # the kernels this class runs
        self.batch = short_corpus(100_000)
        self.cache = radix_soa.PrefixCache(values=False, eviction_policy=policy)
        self.cache.insert_batch(self.batch)

    def time_match_batch(self, policy):
        self.cache.match_batch(self.batch)

    def time_insert_batch_again(self, policy):
        self.cache.insert_batch(self.batch)


class Memory:
    params = ((True, False),)
    param_names = ("values",)

    def setup(self, values):
        self.cache = radix_soa.PrefixCache(values=values)
        for s in chat():
            self.cache.insert(s, values=s if values else None)
        self.rep = self.cache.memory_report()

    def track_bytes_per_token(self, values):
        arrays = self.rep["arrays"]
        per_token = arrays["tokens"]["used_bytes"] + arrays["values"]["used_bytes"]
        return per_token / self.rep["tokens_stored"]

    def track_bytes_per_node(self, values):
        return self.rep["bytes_per_node"]

    track_bytes_per_token.unit = "bytes"
    track_bytes_per_node.unit = "bytes"
