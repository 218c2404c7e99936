"""radix_soa's SGLang cache beside SGLang 0.5.23's own ``RadixCache``.

Every scenario runs on both classes (``kind``) and checks the same
observable results: prefix lengths, KV indices, evictable / protected /
total sizes, the slots handed back to the allocator, lock deltas, page sizes
1 and > 1. The scenarios are the behaviours SGLang's radix-cache unit tests
(``test/registered/unit/mem_cache/test_radix_cache_unit.py``) check, written
anew, plus SGLang's own request lifecycle (``Req``, ``ReqToTokenPool``, its
allocators and ``sglang.srt.mem_cache.common``'s ``match_kv_cache`` /
``checkpoint_kv_cache`` / ``release_kv_cache``, the functions its scheduler
calls), a random differential run, and switching the cache on through
SGLang's registry and plugin loader.

Needs SGLang (CPU torch): skipped without it; the SGLang leg of ``.ci/run``
installs it and runs this file.
"""

import importlib
import random
import unittest.mock
from array import array

import pytest

import sglang_env

sglang_env.require_sglang()

import torch  # noqa: E402
from sglang.srt.disaggregation.kv_events import (AllBlocksCleared, BlockRemoved,  # noqa: E402
                                                  BlockStored)
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req  # noqa: E402
from sglang.srt.mem_cache import common, registry  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (BasePrefixCache, EvictParams,  # noqa: E402
                                                    EvictResult, InsertParams,
                                                    MatchPrefixParams)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from radix_soa.integrations import sglang as adapter  # noqa: E402
from radix_soa.integrations.sglang import Node, SGLangPrefixCache  # noqa: E402

KINDS = ["sglang", "radix_soa"]
kinds = pytest.mark.parametrize("kind", KINDS)


# ------------------------------------------------------------------ helpers
def simulated(kind, **kw):
    cls = RadixCache if kind == "sglang" else SGLangPrefixCache
    return cls.create_simulated(**kw)


def key(tokens, extra_key=None, cache_salt=None):
    return RadixKey(array("q", tokens), extra_key, cache_salt=cache_salt)


def insert(cache, tokens, values=None, **tags):
    value = None if values is None else torch.tensor(values, dtype=torch.int64)
    return cache.insert(InsertParams(key=key(tokens, **tags), value=value))


def match(cache, tokens, **tags):
    """``(prefix length, its KV indices, the node)``."""
    m = cache.match_prefix(MatchPrefixParams(key=key(tokens, **tags)))
    return m.device_prefix_len, cache.path_device_indices(m.last_device_node).tolist(), \
        m.last_device_node


def sizes(cache):
    return cache.evictable_size(), cache.protected_size(), cache.total_size()


class Frees:
    """An allocator that records the KV slots handed back to it."""

    device = torch.device("cpu")

    def __init__(self):
        self.freed = []

    def free_segment(self, idx, start_pos=0):
        assert start_pos == 0
        self.freed.extend(idx.tolist())

    def free(self, idx):
        self.freed.extend(idx.tolist())


# ------------------------------------------------------------------ SGLang's unit scenarios
def test_the_adapter_is_an_sglang_prefix_cache():
    assert issubclass(SGLangPrefixCache, BasePrefixCache)
    assert adapter.RadixKey is RadixKey and adapter.InsertParams is InsertParams
    assert not SGLangPrefixCache.__abstractmethods__


@kinds
@pytest.mark.parametrize("page_size, disable, events", [(1, False, False), (4, False, True),
                                                        (1, True, False)])
def test_construction(kind, page_size, disable, events):
    c = simulated(kind, disable=disable, page_size=page_size, enable_kv_cache_events=events)
    assert (c.page_size, c.disable, c.device) == (page_size, disable, torch.device("cpu"))
    assert c.supports_prefix_sharing() is (not disable)
    assert c.root_node is not None and sizes(c) == (0, 0, 0)


@kinds
def test_reset_empties_the_cache(kind):
    c = simulated(kind)
    insert(c, [1, 2, 3], [10, 20, 30])
    assert c.total_size() == 3
    c.reset()
    assert sizes(c) == (0, 0, 0)
    assert match(c, [1, 2, 3])[0] == 0


@kinds
@pytest.mark.parametrize("disable", [False, True])
def test_insert_then_match(kind, disable):
    c = simulated(kind, disable=disable)
    assert insert(c, [1, 2, 3], [10, 20, 30]).prefix_len == 0
    if disable:
        assert sizes(c) == (0, 0, 0) and match(c, [1, 2, 3])[:2] == (0, [])
        return
    assert sizes(c) == (3, 0, 3)
    assert match(c, [1, 2, 3])[:2] == (3, [10, 20, 30])
    assert match(c, [1, 2])[:2] == (2, [10, 20])
    assert insert(c, [1, 2, 3, 4], [11, 21, 31, 41]).prefix_len == 3
    assert match(c, [1, 2, 3, 4, 5])[:2] == (4, [10, 20, 30, 41])  # first writer wins


@kinds
def test_insert_without_values_caches_the_token_ids(kind):
    c = simulated(kind)
    assert insert(c, [1, 2, 3]).prefix_len == 0
    assert c.total_size() == 3 and match(c, [1, 2, 3])[:2] == (3, [1, 2, 3])


@kinds
def test_total_size_adds_up(kind):
    c = simulated(kind)
    insert(c, [1, 2, 3], [10, 20, 30])
    assert c.total_size() == 3
    insert(c, [4, 5], [40, 50])
    assert c.total_size() == 5


@kinds
def test_namespaces_by_extra_key_and_cache_salt(kind):
    c = simulated(kind)
    insert(c, [1, 2, 3], [10, 20, 30], extra_key="key1")
    insert(c, [1, 2, 3], [40, 50, 60], extra_key="key2")
    insert(c, [1, 2, 3], [70, 80, 90])
    insert(c, [1, 2, 3], [11, 21, 31], extra_key="bc", cache_salt="a")
    insert(c, [1, 2, 3], [41, 51, 61], extra_key="c", cache_salt="ab")
    assert match(c, [1, 2, 3], extra_key="key1")[:2] == (3, [10, 20, 30])
    assert match(c, [1, 2, 3], extra_key="key2")[:2] == (3, [40, 50, 60])
    assert match(c, [1, 2, 3])[:2] == (3, [70, 80, 90])
    assert match(c, [1, 2, 3], extra_key="nonexistent")[:2] == (0, [])
    assert match(c, [1, 2, 3], extra_key="bc", cache_salt="a")[:2] == (3, [11, 21, 31])
    assert match(c, [1, 2, 3], extra_key="c", cache_salt="ab")[:2] == (3, [41, 51, 61])
    assert match(c, [1, 2, 3], extra_key="", cache_salt=None)[:2] == (0, [])


@kinds
def test_lock_refs_move_tokens_between_evictable_and_protected(kind):
    c = simulated(kind)
    insert(c, [1, 2, 3], [10, 20, 30])
    insert(c, [1, 2, 7, 8], [10, 20, 70, 80])
    node = match(c, [1, 2, 3])[2]
    assert c.inc_lock_ref(node).delta == -3
    assert sizes(c) == (2, 3, 5)
    assert c.inc_lock_ref(node).delta == 0  # already protected
    assert c.dec_lock_ref(node).delta == 0
    assert c.dec_lock_ref(node).delta == 3
    assert sizes(c) == (5, 0, 5)
    lock = c.lock(match(c, [1, 2])[2])  # the scheduler's form: a TreeLock
    assert sizes(c) == (3, 2, 5)
    c.unlock(lock)
    assert sizes(c) == (5, 0, 5)


@kinds
def test_evict_hands_the_least_recent_leaf_to_the_allocator(kind):
    frees = Frees()
    c = simulated(kind, mock_allocator=frees)
    insert(c, [1, 2], [10, 20])
    insert(c, [3, 4], [30, 40])
    r = c.evict(EvictParams(num_tokens=2))
    assert isinstance(r, EvictResult) and r.num_tokens_evicted == 2
    assert frees.freed == [10, 20] and c.total_size() == 2
    assert match(c, [3, 4])[:2] == (2, [30, 40])


@kinds
def test_evict_works_with_sglangs_mock_allocator(kind):
    alloc = unittest.mock.Mock()
    alloc.device = torch.device("cpu")
    c = simulated(kind, mock_allocator=alloc)
    insert(c, [1, 2], [10, 20])
    insert(c, [3, 4], [30, 40])
    assert c.evict(EvictParams(num_tokens=2)).num_tokens_evicted >= 2
    alloc.free_segment.assert_called()
    assert c.total_size() < 4


@kinds
def test_locked_paths_are_not_evicted(kind):
    frees = Frees()
    c = simulated(kind, mock_allocator=frees)
    insert(c, [1, 2, 3, 4], [1, 2, 3, 4])
    insert(c, [1, 2, 9], [1, 2, 9])
    lock = c.lock(match(c, [1, 2, 9])[2])
    assert c.evict(EvictParams(num_tokens=100)).num_tokens_evicted == 2
    assert sorted(frees.freed) == [3, 4] and sizes(c) == (0, 3, 3)
    c.unlock(lock)
    assert c.evict(EvictParams(num_tokens=100)).num_tokens_evicted == 3
    assert sorted(frees.freed) == [1, 2, 3, 4, 9] and sizes(c) == (0, 0, 0)


@kinds
def test_evicting_less_than_a_leaf(kind):
    """The one documented difference: SGLang frees whole leaves, radix_soa
    trims the leaf's tail to what was asked (both free at least that)."""
    frees = Frees()
    c = simulated(kind, mock_allocator=frees)
    insert(c, [1, 2, 3], [10, 20, 30])
    n = c.evict(EvictParams(num_tokens=1)).num_tokens_evicted
    if kind == "sglang":
        assert n == 3 and sorted(frees.freed) == [10, 20, 30] and c.total_size() == 0
    else:
        assert n == 1 and frees.freed == [30] and match(c, [1, 2, 3])[:2] == (2, [10, 20])


@kinds
@pytest.mark.parametrize("page_size, length", [(1, 5), (2, 5), (4, 6), (4, 3)])
def test_matches_and_inserts_keep_whole_pages(kind, page_size, length):
    c = simulated(kind, page_size=page_size)
    tokens = list(range(length))
    r = insert(c, tokens, [100 + t for t in tokens][:length - length % page_size])
    aligned = length - length % page_size
    assert r.prefix_len == 0 and c.total_size() == aligned
    got, indices, _ = match(c, tokens)
    assert got == aligned and indices == [100 + t for t in range(aligned)]
    # a query that leaves the cached path inside a page matches the pages before it
    diverge = tokens[:aligned - 1] + [999] if aligned else [999]
    assert match(c, diverge)[0] == max(0, aligned - page_size)


@kinds
@pytest.mark.parametrize("page_size", [1, 2])
def test_matches_split_nodes_without_changing_what_is_cached(kind, page_size):
    c = simulated(kind, page_size=page_size)
    seq1 = [1, 2, 3, 4, 5, 6, 7, 8]
    val1 = [x * 10 for x in seq1]
    seq2 = [1, 2, 9, 10]
    val2 = [x * 10 for x in seq2]
    insert(c, seq1, val1)
    insert(c, seq2, val2)
    assert c.total_size() == 10
    assert match(c, [1, 2, 3, 4, 999, 1000])[:2] == (4, val1[:4])
    assert match(c, seq1)[:2] == (8, val1)
    assert match(c, [1, 2, 3, 4, 5, 6, 777, 888])[:2] == (6, val1[:6])
    assert match(c, seq2)[:2] == (4, val2)
    assert c.total_size() == 10


@kinds
def test_insert_results_name_the_node_the_key_ends_at(kind):
    c = simulated(kind, page_size=2)
    r = insert(c, [1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    assert c.path_device_indices(r.last_device_node).tolist() == [10, 20, 30, 40]
    r = insert(c, [1, 2, 7, 8], [11, 21, 71, 81])
    assert r.prefix_len == 2
    assert c.path_device_indices(r.last_device_node).tolist() == [10, 20, 71, 81]


@kinds
def test_pretty_print_and_all_values(kind, capsys):
    c = simulated(kind)
    insert(c, [1, 2], [10, 20])
    insert(c, [3, 4], [30, 40])
    c.pretty_print()
    assert "#tokens: 4" in capsys.readouterr().out
    assert sorted(c.all_values_flatten().tolist()) == [10, 20, 30, 40]


# ------------------------------------------------------------------ KV events
def _pages(events):
    """Stored pages' tokens in order, removed page count, cleared count,
    and whether every removed hash was stored (each class's own hashes)."""
    stored, removed, cleared, hashes = [], 0, 0, set()
    ok = True
    for e in events:
        if isinstance(e, BlockStored):
            assert len(e.token_ids) == e.block_size * len(e.block_hashes)
            for i, h in enumerate(e.block_hashes):
                stored.append(tuple(e.token_ids[i * e.block_size:(i + 1) * e.block_size]))
                hashes.add(h)
        elif isinstance(e, BlockRemoved):
            removed += len(e.block_hashes)
            ok &= set(e.block_hashes) <= hashes
        else:
            cleared += 1
    return stored, removed, cleared, ok


@kinds
@pytest.mark.parametrize("page_size, enabled", [(1, True), (2, True), (1, False)])
def test_events_of_an_insert(kind, page_size, enabled):
    c = simulated(kind, page_size=page_size, enable_kv_cache_events=enabled)
    insert(c, [1, 2, 3, 4, 5])
    events = c.take_events()
    if not enabled:
        assert events == []
        return
    stored, removed, cleared, _ = _pages(events)
    assert cleared == 1  # the construction's reset, as SGLang
    full = [1, 2, 3, 4, 5][:5 - 5 % page_size]
    assert stored == [tuple(full[i:i + page_size]) for i in range(0, len(full), page_size)]
    assert removed == 0 and c.take_events() == []


@kinds
def test_events_of_an_eviction_name_the_stored_pages(kind):
    c = simulated(kind, mock_allocator=Frees(), page_size=2, enable_kv_cache_events=True)
    insert(c, [1, 2, 3, 4], [10, 20, 30, 40])
    insert(c, [1, 2, 5, 6], [10, 20, 50, 60], extra_key="lora", cache_salt="t")
    assert c.evict(EvictParams(num_tokens=8)).num_tokens_evicted == 8
    events = c.take_events()
    stored, removed, cleared, ok = _pages(events)
    assert stored == [(1, 2), (3, 4), (1, 2), (5, 6)] and removed == 4 and ok
    salted = [e for e in events if isinstance(e, BlockStored) and e.cache_salt == "t"]
    assert sum(len(e.block_hashes) for e in salted) == 2
    c.reset()
    assert _pages(c.take_events())[2] == 1


def _leaves_unordered(events):
    return [BlockRemoved(block_hashes=sorted(e.block_hashes), medium=e.medium)
            if isinstance(e, BlockRemoved) else e for e in events]


def _evented(kind, page_size, dynamo):
    """A cache with events on, SGLang's LoRA name table knowing "lora-a"."""
    from types import SimpleNamespace

    from sglang.srt.mem_cache.events import KvEventLoraNames

    names = KvEventLoraNames()
    names.register(SimpleNamespace(lora_id="a" * 32, extra_key="lora-a"), "adapter-a")
    params = CacheInitParams(disable=False, req_to_token_pool=None,
                             token_to_kv_pool_allocator=Frees(), page_size=page_size,
                             enable_kv_cache_events=True, kv_event_lora_names=names,
                             dynamo_kv_event_format=dynamo)
    return RadixCache(params) if kind == "sglang" else SGLangPrefixCache(params)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("dynamo", [False, True])
def test_the_event_stream_is_sglangs_event_by_event(page_size, dynamo):
    """The same inserts, matches (splits), locks and evictions on SGLang's
    RadixCache and the adapter, events taken after every step: equal event
    by event (kinds, page hashes and parents, tokens, grouping, salts, LoRA
    names), in the default namespace, under an extra_key, a LoRA's
    extra_key and a cache_salt. Evictions take everything evictable, so
    both free whole leaves (the documented difference is partial leaves)."""
    rng = random.Random(page_size * 2 + dynamo)
    caches = {k: _evented(k, page_size, dynamo) for k in KINDS}
    locks = {k: [] for k in KINDS}
    tags = [{}, {"extra_key": "x"}, {"extra_key": "lora-a"}, {"cache_salt": "s"},
            {"extra_key": "lora-a", "cache_salt": "s"}]
    ps = page_size
    # tokens above 2^32 too: SGLang hashes those pages in their wide form
    alphabet = [0, 1, 2, 3, 5, 7, 1 << 32, (1 << 40) + 3]
    stems = [[rng.choice(alphabet) for _ in range(rng.randrange(1, 4) * ps)] for _ in range(4)]
    slot = stored = removed = 0
    named = set()
    first = [c.take_events() for c in caches.values()]
    assert first[0] == first[1] and len(first[0]) == 1  # the construction's AllBlocksCleared
    for step in range(150):
        tag = rng.choice(tags)
        seq = rng.choice(stems) + [rng.choice(alphabet) for _ in range(rng.randrange(0, 3 * ps))]
        op = rng.random()
        if op < 0.45:
            for c in caches.values():
                insert(c, seq, list(range(slot, slot + len(seq))), **tag)
            slot += len(seq)
        elif op < 0.75:
            lock = rng.random() < 0.4
            for k, c in caches.items():
                node = match(c, seq, **tag)[2]
                if lock:
                    locks[k].append(c.lock(node))
        elif op < 0.85:
            for k, c in caches.items():
                for held in locks[k]:
                    c.unlock(held)
                locks[k] = []
        else:
            for c in caches.values():
                c.evict(EvictParams(num_tokens=c.total_size()))
        theirs, ours = (_leaves_unordered(c.take_events()) for c in caches.values())
        assert ours == theirs, (step, seq, tag)
        for e in theirs:
            if isinstance(e, BlockStored):
                assert None not in e.block_hashes
                stored += len(e.block_hashes)
                named.add((e.lora_name, e.cache_salt))
            elif isinstance(e, BlockRemoved):
                removed += len(e.block_hashes)
        assert sizes(caches["sglang"]) == sizes(caches["radix_soa"])
    for c in caches.values():
        c.reset()
    assert [c.take_events() for c in caches.values()] == [[AllBlocksCleared()]] * 2
    assert stored > 20 and removed > 10  # the run stored and removed pages
    assert {(None, None), ("adapter-a", None), (None, "s"), ("adapter-a", "s")} <= named


# ------------------------------------------------------------------ a random differential run
@pytest.mark.parametrize("page_size, seed", [(1, 0), (1, 1), (4, 2), (4, 3)])
def test_random_operations_agree(page_size, seed):
    """Inserts, matches, locks, unlocks and evictions of everything evictable
    on both classes: after every step the same answers, sizes and freed slots."""
    rng = random.Random(seed)
    frees = {k: Frees() for k in KINDS}
    caches = {k: simulated(k, mock_allocator=frees[k], page_size=page_size) for k in KINDS}
    locks = {k: [] for k in KINDS}
    stems = [[rng.randrange(6) for _ in range(rng.randrange(1, 12))] for _ in range(5)]
    slot = held = 0
    for _ in range(200):
        seq = rng.choice(stems) + [rng.randrange(6) for _ in range(rng.randrange(0, 10))]
        op = rng.random()
        if op < 0.4:
            values = list(range(slot, slot + len(seq)))
            slot += len(seq)
            got = {k: insert(c, seq, values).prefix_len for k, c in caches.items()}
        elif op < 0.75:
            got = {k: match(c, seq)[:2] for k, c in caches.items()}
            if rng.random() < 0.5:
                for k, c in caches.items():
                    locks[k].append(c.lock(match(c, seq)[2]))
        elif op < 0.9 and locks["sglang"]:
            i = rng.randrange(len(locks["sglang"]))
            for k, c in caches.items():
                c.unlock(locks[k].pop(i))
            got = {}
        else:
            got = {k: c.evict(EvictParams(num_tokens=c.total_size())).num_tokens_evicted
                   for k, c in caches.items()}
            assert sorted(frees["sglang"].freed) == sorted(frees["radix_soa"].freed)
        assert got.get("sglang") == got.get("radix_soa"), (seq, got)
        assert sizes(caches["sglang"]) == sizes(caches["radix_soa"])
        held = max(held, caches["sglang"].protected_size())
    assert held > 0  # the run protected something


# ------------------------------------------------------------------ SGLang's request lifecycle
@pytest.fixture(scope="module")
def sglang_context():
    """SGLang's process config (its runtime context), as a scheduler
    process publishes it: the lifecycle functions read it."""
    from sglang.srt.runtime_context import create_context, use_context
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(model_path="dummy", device="cpu", radix_cache_backend=adapter.BACKEND)
    ctx = create_context(sa, role="scheduler")
    with use_context(ctx):
        yield sa


class Engine:
    """The steps SGLang 0.5.23's scheduler takes for a request, on its own
    ``Req``, ``ReqToTokenPool`` and allocators: match and lock on admission
    (``init_next_round_input``, ``tree_cache.lock``), the prefix slots into
    the request's row, new slots for each token computed (a new page at each
    page start, as SGLang's paged allocator hands them), a checkpoint after
    each prefill chunk and ``release_kv_cache`` at the end."""

    def __init__(self, kind, page_size, pool_tokens=1024, api="functions"):
        self.page_size = page_size
        self.pool = ReqToTokenPool(size=16, max_context_len=256, device="cpu",
                                   enable_memory_saver=False)
        if page_size == 1:
            self.alloc = TokenToKVPoolAllocator(size=pool_tokens, dtype=torch.float16,
                                                device="cpu", kvcache=None, need_sort=False)
        else:
            self.alloc = PagedTokenToKVPoolAllocator(size=pool_tokens, page_size=page_size,
                                                     dtype=torch.float16, device="cpu",
                                                     kvcache=None, need_sort=False)
        params = CacheInitParams(disable=False, req_to_token_pool=self.pool,
                                 token_to_kv_pool_allocator=self.alloc, page_size=page_size)
        self.tree = RadixCache(params) if kind == "sglang" else SGLangPrefixCache(params)
        self.api = api  # "functions": sglang's common.py; "aliases": cache_*_req
        self.pool_tokens = pool_tokens

    def admit(self, rid, prompt, extra_key=None):
        req = Req(rid, "", array("q", prompt), SamplingParams(max_new_tokens=64),
                  extra_key=extra_key)
        req.init_next_round_input(self.tree)
        req.lock = self.tree.lock(req.last_node)
        self.pool.alloc([req])
        self.pool.write((req.kv.req_pool_idx, slice(0, req.prefix_len)),
                        self.tree.prefix_device_indices(req))
        req.kv.kv_allocated_len = req.kv.kv_committed_len = req.prefix_len
        return req

    def _compute(self, req, end):
        row = self.pool.req_to_token[req.kv.req_pool_idx]
        for pos in range(req.kv.kv_allocated_len, end):
            if pos % self.page_size == 0:
                page = self.alloc.alloc(self.page_size)
                if page is None:
                    self.alloc.evict_to_free_tokens(self.tree, self.page_size)
                    page = self.alloc.alloc(self.page_size)
                slot = int(page[0])
            else:
                slot = int(row[pos - 1]) + 1
            row[pos] = slot
        req.kv.kv_allocated_len = req.kv.kv_committed_len = end

    def prefill(self, req, end):
        """Compute the prompt up to ``end`` (a chunk); checkpoint if unfinished."""
        self._compute(req, end)
        req.extend_end = end
        if end < len(req.origin_input_ids):
            if self.api == "aliases":
                self.tree.cache_unfinished_req(req)
            else:
                common.checkpoint_kv_cache(req, self.tree)

    def finish(self, req, outputs):
        """Decode ``outputs`` (each one's KV but the last one's computed),
        then release the request, caching it."""
        req.output_ids.extend(outputs)
        self._compute(req, len(req.origin_input_ids) + len(outputs) - 1)
        req.finished_reason = FINISH_LENGTH(len(outputs))
        if self.api == "aliases":
            self.tree.cache_finished_req(req)
        else:
            common.release_kv_cache(req, self.tree, checkpoint=True)

    def state(self, *reqs):
        rows = [self.pool.req_to_token[r.kv.req_pool_idx, :r.kv.kv_allocated_len].tolist()
                for r in reqs if r.kv.req_pool_idx is not None]
        return (rows, self.alloc.available_size(), sizes(self.tree))

    def idle_accounting_holds(self):
        """SGLang's leak check with no request running: every slot is free,
        evictable or protected."""
        return (self.alloc.available_size() + self.tree.evictable_size()
                + self.tree.protected_size() == self.pool_tokens)


def _run_conversation(engine):
    """Three requests through chunked prefill, a shared prefix and a second
    turn; the state after every step."""
    e = engine
    out = []
    a = e.admit("a", list(range(100, 120)))
    out.append(("a admitted", a.prefix_len, e.state(a)))
    e.prefill(a, 8)
    out.append(("a chunk 1", a.kv.cache_protected_len, e.state(a)))
    b = e.admit("b", list(range(100, 112)) + list(range(200, 210)))  # shares a's 12
    out.append(("b admitted", b.prefix_len, e.state(a, b)))
    e.prefill(a, 16)
    e.prefill(b, 22)
    e.prefill(a, 20)
    out.append(("prefilled", a.kv.cache_protected_len, e.state(a, b)))
    e.finish(a, [1, 2, 3, 4, 5])
    out.append(("a finished", None, e.state(b)))
    c = e.admit("c", list(range(100, 120)) + [1, 2, 3, 4, 5, 6, 7])  # a's next turn
    out.append(("c admitted", c.prefix_len, e.state(b, c)))
    e.prefill(c, 27)
    e.finish(b, [9, 9])
    e.finish(c, [8])
    d = e.admit("d", list(range(100, 120)), extra_key="another-lora")
    out.append(("d admitted", d.prefix_len, e.state(d)))
    e.prefill(d, 20)
    e.finish(d, [3])
    out.append(("done", None, e.state()))
    return out


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("api", ["functions", "aliases"])
def test_the_request_lifecycle_agrees_with_sglang(sglang_context, page_size, api):
    theirs = _run_conversation(Engine("sglang", page_size))
    mine = Engine("radix_soa", page_size, api=api)
    ours = _run_conversation(mine)
    assert ours == theirs
    steps = {name: value for name, value, _ in ours}
    align = page_size * (12 // page_size)
    assert steps["b admitted"] == min(8, align)  # a's first chunk, whole pages
    assert steps["c admitted"] == 24 - 24 % page_size  # a's prompt + 4 computed outputs
    assert steps["d admitted"] == 0  # another namespace
    assert mine.idle_accounting_holds() and mine.tree.protected_size() == 0


@pytest.mark.parametrize("page_size", [1, 4])
def test_serving_under_a_small_pool_keeps_the_accounting(sglang_context, page_size):
    """Requests that do not all fit: the allocator evicts through the cache
    (SGLang's ``evict_to_free_tokens``). No slot is freed twice or while
    cached, and SGLang's leak check holds at the end, for both classes."""
    rng = random.Random(page_size)
    stems = [[rng.randrange(50) for _ in range(30)] for _ in range(4)]
    prompts = [rng.choice(stems)[:rng.randrange(8, 30)] + [rng.randrange(50) for _ in range(20)]
               for _ in range(40)]
    for kind in KINDS:
        e = Engine(kind, page_size, pool_tokens=256)
        evicted = []

        def counted(params, evict=e.tree.evict):
            r = evict(params)
            evicted.append(r.num_tokens_evicted)
            return r

        e.tree.evict = counted
        hits = 0
        for i, p in enumerate(prompts):
            r = e.admit(str(i), p)
            hits += r.prefix_len
            e.prefill(r, 16 if len(p) > 16 else len(p))
            e.prefill(r, len(p))
            e.finish(r, [7, 7, 7])
            free = e.alloc.free_pages if page_size == 1 else e.alloc.get_all_free_pages()
            assert torch.unique(free).numel() == free.numel()  # nothing freed twice
            cached = e.tree.all_values_flatten()
            cached_pages = set((cached // page_size).tolist())
            freed_pages = set(free.tolist()) if page_size > 1 else set()
            assert not cached_pages & freed_pages if page_size > 1 else \
                not set(cached.tolist()) & set(free.tolist())
        assert e.idle_accounting_holds(), kind
        assert hits > 0 and sum(evicted) > 256  # it hit, and evicted more than the pool


def _waiting(n, rng):
    stems = [[rng.randrange(1, 100) for _ in range(40)] for _ in range(6)]
    return [Req(str(i), "", array("q", rng.choice(stems)[:rng.randrange(0, 40)]
                              + [rng.randrange(100, 200) for _ in range(rng.randrange(1, 8))]),
                SamplingParams(max_new_tokens=8)) for i in range(n)], stems


@pytest.mark.parametrize("n", [40, 200])
def test_the_schedulers_lpm_policy_matches_every_waiting_request(sglang_context, n):
    """SGLang's own ``SchedulePolicy.calc_priority`` (LPM) over ``n`` waiting
    requests. Up to its limit of 128 both caches give the same order and
    prefix lengths. Past it SGLang's RadixCache (no fast matching) leaves the
    queue unmatched; the adapter answers ``supports_fast_match_prefix()``,
    so every request is matched (its prefix length and node set), in
    first-come order."""
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    got = {}
    for kind in KINDS:
        rng = random.Random(n)
        waiting, stems = _waiting(n, rng)
        c = simulated(kind, mock_allocator=Frees())
        for i, stem in enumerate(stems[:4]):
            insert(c, stem[:10 * (i + 1)], list(range(100 * i, 100 * i + 10 * (i + 1))))
        policy = SchedulePolicy("lpm", c, False, False, False)
        policy.calc_priority(waiting)
        got[kind] = [(r.rid, r.prefix_len, r.last_node is not None) for r in waiting]
        if kind == "radix_soa":
            assert c.supports_fast_match_prefix()
            want = [match(c, r.origin_input_ids.tolist())[0] for r in waiting]
            assert [r.prefix_len for r in waiting] == want and max(want) >= 30
            for r in waiting:  # the node each request holds is its match's
                assert c.path_device_indices(r.last_node).numel() == r.prefix_len
    if n <= 128:
        assert got["sglang"] == got["radix_soa"]
    else:
        assert [x[0] for x in got["radix_soa"]] == [str(i) for i in range(n)]  # FCFS order
        assert all(x[1] == 0 for x in got["sglang"])  # RadixCache: not matched


# ------------------------------------------------------------------ switching it on
def _build_context(sa, params, **flags):
    ctx = dict(server_args=sa, params=params, is_hybrid_swa=False, is_hybrid_ssm=False,
               enable_hierarchical_cache=False, disable_radix_cache=False, tp_worker=None,
               model_config=None, tp_size=1, tp_rank=0, tp_group=None)
    ctx.update(flags)
    return registry.TreeCacheBuildContext(**ctx)


def test_the_radix_cache_backend_flag_selects_it(sglang_context, monkeypatch):
    monkeypatch.setattr(registry, "_RADIX_CACHE_REGISTRY", {})
    params = CacheInitParams(disable=False, req_to_token_pool=None,
                             token_to_kv_pool_allocator=None, page_size=4)
    with pytest.raises(ValueError, match="radix_soa.*not registered"):
        registry.create_tree_cache(_build_context(sglang_context, params))
    adapter.install()
    adapter.install()  # again: nothing changes
    cache = registry.create_tree_cache(_build_context(sglang_context, params))
    assert type(cache) is SGLangPrefixCache and cache.page_size == 4
    with pytest.raises(NotImplementedError, match="sliding-window"):
        registry.create_tree_cache(_build_context(sglang_context, params, is_hybrid_swa=True))


def test_dfs_weight_scheduling_is_refused_at_startup(sglang_context, monkeypatch):
    from sglang.srt.runtime_context import create_context, use_context
    from sglang.srt.server_args import ServerArgs

    monkeypatch.setattr(registry, "_RADIX_CACHE_REGISTRY", {})
    adapter.install()
    sa = ServerArgs(model_path="dummy", device="cpu", radix_cache_backend=adapter.BACKEND,
                    schedule_policy="dfs-weight")
    params = CacheInitParams(disable=False, req_to_token_pool=None,
                             token_to_kv_pool_allocator=None, page_size=1)
    with use_context(create_context(sa, role="scheduler")):
        with pytest.raises(NotImplementedError, match="--schedule-policy dfs-weight"):
            registry.create_tree_cache(_build_context(sa, params))


def test_install_refuses_a_taken_name_and_a_registry_without_backends(monkeypatch):
    monkeypatch.setattr(registry, "_RADIX_CACHE_REGISTRY", {})
    registry.register_radix_cache_backend("taken", lambda ctx: None)
    with pytest.raises(ValueError, match="'taken' is registered already"):
        adapter.install("taken")
    monkeypatch.delattr(registry, "register_radix_cache_backend")
    with pytest.raises(RuntimeError, match="no register_radix_cache_backend"):
        adapter.install()


def test_sglangs_plugin_loader_registers_it(tmp_path, monkeypatch):
    """The entry point pyproject.toml declares, as SGLang's loader finds it
    in an installed radix-soa."""
    import tomllib

    from sglang.srt import plugins

    root = importlib.import_module("radix_soa").__file__.rsplit("/radix_soa/", 1)[0]
    with open(f"{root}/pyproject.toml", "rb") as f:
        declared = tomllib.load(f)["project"]["entry-points"][plugins.GENERAL_PLUGINS_GROUP]
    dist = tmp_path / "radix_soa_probe-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: radix-soa-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        f"[{plugins.GENERAL_PLUGINS_GROUP}]\n"
        + "".join(f"{k} = {v}\n" for k, v in declared.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setattr(registry, "_RADIX_CACHE_REGISTRY", {})
    found = plugins.load_plugins_by_group(plugins.GENERAL_PLUGINS_GROUP)
    func, _ = found[adapter.BACKEND]
    func()
    assert registry.get_radix_cache_factory(adapter.BACKEND) is adapter.make_cache


def test_nodes_are_checked():
    c = SGLangPrefixCache.create_simulated(mock_allocator=Frees())
    insert(c, [1, 2, 3], [1, 2, 3])
    node = match(c, [1, 2, 3])[2]
    assert isinstance(node, Node) and node == match(c, [1, 2, 3])[2]
    with pytest.raises(TypeError, match="node must be a Node"):
        c.inc_lock_ref(object())
    c.evict(EvictParams(num_tokens=3))
    with pytest.raises(ValueError, match="does not refer to a live node"):
        c.inc_lock_ref(node)
    assert sizes(c) == (0, 0, 0)


def test_dfs_weight_scheduling_is_refused_clearly():
    c = SGLangPrefixCache.create_simulated()
    with pytest.raises(NotImplementedError, match="--schedule-policy lpm"):
        c.dfs_weight_order([c.root_node])


def test_indices_are_int64_tensors_on_the_allocators_device():
    c = SGLangPrefixCache.create_simulated()
    insert(c, [1, 2, 3], [7, 8, 9])
    idx = c.path_device_indices(match(c, [1, 2, 3])[2])
    assert idx.dtype == torch.int64 and idx.device == c.device == torch.device("cpu")
    assert c.all_values_flatten().dtype == torch.int64


def test_keys_stay_resizable_after_every_call():
    """SGLang extends a request's token array in place (refresh_fill_ids):
    no call may keep a view of it (an exported buffer cannot be resized)."""
    c = SGLangPrefixCache.create_simulated(page_size=2)
    tokens = array("q", [1, 2, 3, 4, 5])
    k = RadixKey(tokens)
    c.insert(InsertParams(key=k, value=None))
    m = c.match_prefix(MatchPrefixParams(key=k))
    c.touch_prefix(k)
    c.path_device_indices(c.insert(InsertParams(key=k, value=None)).last_device_node)
    tokens.extend([6, 7])
    assert m.device_prefix_len == 4 and len(tokens) == 7


def test_uint64_index_tensors_above_int64_are_refused():
    """A torch uint64 tensor of KV indices holding 2^64 - 1 (slot -1 once
    wrapped): an OverflowError naming it, the cache unchanged."""
    c = SGLangPrefixCache.create_simulated(mock_allocator=Frees())
    insert(c, [1, 2], [10, 20])
    value = torch.tensor([5, (1 << 64) - 1, 6], dtype=torch.uint64)
    with pytest.raises(OverflowError, match=f"params.value holds {(1 << 64) - 1}"):
        c.insert(InsertParams(key=key([1, 2, 3]), value=value))
    assert sizes(c) == (2, 0, 2) and match(c, [1, 2, 3])[:2] == (2, [10, 20])
