"""radix_soa's SGLang cache on plain objects: its own logic (keys to tokens
and namespaces, page alignment, a request's checkpoint rewriting its row and
moving its lock, slots handed to the allocator, refusals), run by the
project's suite without SGLang or torch. The same tests pass with SGLang
installed (the adapter then takes and returns SGLang's own classes and torch
tensors); ``tests/test_sglang_adapter.py`` compares it with SGLang's cache.
"""

import hashlib
import struct
import subprocess
import sys
import tomllib
from array import array
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import sglang_env

sglang_env.prepare()  # with SGLang installed these tests run on its classes

from radix_soa.integrations import _sglang_types as types_  # noqa: E402
from radix_soa.integrations import sglang as adapter  # noqa: E402
from radix_soa.integrations.sglang import (EvictParams, InsertParams,  # noqa: E402
                                           MatchPrefixParams, Node, RadixKey,
                                           SGLangPrefixCache)

ROOT = Path(__file__).resolve().parents[1]


def key(tokens, extra_key=None, **kw):
    return RadixKey(array("q", tokens), extra_key, **kw)


def insert(cache, tokens, values=None, extra_key=None):
    value = None if values is None else np.array(values, np.int64)
    return cache.insert(InsertParams(key=key(tokens, extra_key), value=value))


def match(cache, tokens, extra_key=None):
    m = cache.match_prefix(MatchPrefixParams(key=key(tokens, extra_key)))
    return (m.device_prefix_len,
            np.asarray(cache.path_device_indices(m.last_device_node)).tolist(),
            m.last_device_node)


class Allocator:
    """Records ``free_segment`` calls: ``(slots, start_pos)``."""

    device = "cpu"

    def __init__(self):
        self.calls = []

    def free_segment(self, idx, start_pos):
        self.calls.append((np.asarray(idx).tolist(), start_pos))


class Pool:
    """SGLang's ``ReqToTokenPool`` as a cache uses it."""

    def __init__(self, rows, width):
        self.req_to_token = np.zeros((rows, width), np.int64)

    def write(self, where, values):
        self.req_to_token[where] = np.asarray(values)


def cache_with_pools(page_size=1, **kw):
    alloc, pool = Allocator(), Pool(2, 16)
    params = SimpleNamespace(disable=False, req_to_token_pool=pool,
                             token_to_kv_pool_allocator=alloc, page_size=page_size, **kw)
    return SGLangPrefixCache(params), alloc, pool


def request(tokens, row_slots, pool, prompt_len=None):
    """A request as ``checkpoint`` reads it, its row holding ``row_slots``."""
    pool.req_to_token[0, :len(row_slots)] = row_slots
    kv = SimpleNamespace(req_pool_idx=0, cache_protected_len=0, cache_inserted_len=0,
                         swa_evict_floor=0)
    return SimpleNamespace(kv=kv, full_untruncated_fill_ids=array("q", tokens),
                           origin_input_ids=array("q", tokens[:prompt_len or len(tokens)]),
                           extra_key=None, cache_salt=None, priority=0, lock=None,
                           last_node=None)


def test_match_insert_and_sizes():
    c = SGLangPrefixCache.create_simulated()
    assert insert(c, [1, 2, 3], [10, 11, 12]).prefix_len == 0
    assert insert(c, [1, 2, 3, 4], [20, 21, 22, 23]).prefix_len == 3
    assert match(c, [1, 2, 3, 4, 9])[:2] == (4, [10, 11, 12, 23])
    assert match(c, [1, 2, 7])[:2] == (2, [10, 11])
    assert (c.evictable_size(), c.protected_size(), c.total_size()) == (4, 0, 4)
    assert match(c, [])[:2] == (0, []) and match(c, [8])[:2] == (0, [])


def test_an_insert_results_node_reads_its_keys_tokens_later():
    """No copy of the key at insert: the node's indices are looked up from
    its array when first asked, after SGLang extended it; an array cut
    since is refused."""
    c = SGLangPrefixCache.create_simulated()
    insert(c, [1, 2, 3], [10, 20, 30])
    tokens = array("q", [1, 2, 3, 4, 5])
    r = c.insert(InsertParams(key=RadixKey(tokens), value=np.array([11, 21, 31, 41, 51])))
    tokens.extend([6, 7])
    assert r.prefix_len == 3
    assert np.asarray(c.path_device_indices(r.last_device_node)).tolist() == [10, 20, 30, 41, 51]
    cut = array("q", [8, 9])
    r = c.insert(InsertParams(key=RadixKey(cut), value=np.array([80, 90])))
    del cut[1:]
    with pytest.raises(ValueError, match="cut from 2 to 1 tokens"):
        c.path_device_indices(r.last_device_node)


def test_fast_matching_is_announced_unless_disabled():
    assert SGLangPrefixCache.create_simulated().supports_fast_match_prefix() is True
    assert SGLangPrefixCache.create_simulated(disable=True).supports_fast_match_prefix() is False


def test_keys_limits_and_namespaces():
    c = SGLangPrefixCache.create_simulated()
    insert(c, [1, 2, 3], [10, 11, 12], extra_key="lora-a")
    assert match(c, [1, 2, 3])[0] == 0
    assert match(c, [1, 2, 3], extra_key="lora-a")[:2] == (3, [10, 11, 12])
    m = c.match_prefix(MatchPrefixParams(key=key([1, 2, 3], "lora-a", limit=2)))
    assert m.device_prefix_len == 2  # a key's limit caps what it matches
    salted = key([1, 2, 3], "lora-a", cache_salt="tenant")
    assert c.match_prefix(MatchPrefixParams(key=salted)).device_prefix_len == 0
    assert types_.namespace_of("", None) != types_.namespace_of(None, None)
    assert types_.tags_of(types_.namespace_of("x", "y")) == ("x", "y")


def test_pages():
    c = SGLangPrefixCache.create_simulated(page_size=4)
    r = insert(c, list(range(10)), list(range(100, 110)))
    assert r.prefix_len == 0 and c.total_size() == 8  # the partial page is not cached
    assert np.asarray(c.path_device_indices(r.last_device_node)).tolist() == list(range(100, 108))
    assert match(c, list(range(7)) + [99])[0] == 4
    assert match(c, [0, 1, 2])[:2] == (0, [])


def test_checkpoint_frees_duplicates_rewrites_the_row_and_moves_the_lock():
    c, alloc, pool = cache_with_pools()
    insert(c, [1, 2, 3], [50, 51, 52])
    req = request([1, 2, 3, 4, 5], [10, 11, 12, 13, 14], pool)
    c.checkpoint(req, up_to=5)
    assert alloc.calls == [([10, 11, 12], 0)]  # the request's copies of tokens cached before
    assert pool.req_to_token[0, :5].tolist() == [50, 51, 52, 13, 14]
    assert req.kv.cache_protected_len == 5 and req.kv.cache_inserted_len == 5
    assert isinstance(req.last_node, Node) and c.protected_size() == 5
    first = req.lock
    req.full_untruncated_fill_ids.extend([6, 7])  # decoded two more: no view holds the array
    pool.req_to_token[0, 5:7] = [15, 16]
    c.checkpoint(req, up_to=7)
    assert alloc.calls[1:] == []  # nothing of this request was cached by another
    assert req.kv.cache_protected_len == 7 and req.lock is not first
    assert c.protected_size() == 7 and c.evictable_size() == 0
    c.unlock(req.lock)
    assert c.evictable_size() == 7
    assert match(c, [1, 2, 3, 4, 5, 6, 7])[:2] == (7, [50, 51, 52, 13, 14, 15, 16])


def test_checkpoint_refuses_a_bad_up_to_and_changes_nothing():
    c, alloc, pool = cache_with_pools()
    req = request([1, 2, 3], [10, 11, 12], pool)
    for bad, exc in ((-1, ValueError), (2.0, TypeError), (None, TypeError)):
        with pytest.raises(exc, match="up_to"):
            c.checkpoint(req, up_to=bad)
    assert c.total_size() == 0 and alloc.calls == [] and req.lock is None


def test_checkpoint_with_pages_keeps_the_partial_page_for_the_request():
    c, alloc, pool = cache_with_pools(page_size=2)
    insert(c, [1, 2], [40, 41])
    req = request([1, 2, 3, 4, 5], [20, 21, 22, 23, 24], pool)
    c.checkpoint(req, up_to=5)
    assert alloc.calls == [([20, 21], 0)]
    assert pool.req_to_token[0, :5].tolist() == [40, 41, 22, 23, 24]
    assert req.kv.cache_protected_len == 4 and c.total_size() == 4


def test_checkpoint_of_a_disabled_cache_changes_nothing():
    alloc, pool = Allocator(), Pool(1, 8)
    c = SGLangPrefixCache(SimpleNamespace(disable=True, req_to_token_pool=pool,
                                          token_to_kv_pool_allocator=alloc, page_size=1))
    req = request([1, 2, 3], [5, 6, 7], pool)
    c.checkpoint(req, up_to=3)
    assert insert(c, [1, 2], [1, 2]).prefix_len == 0 and c.total_size() == 0
    assert alloc.calls == [] and req.kv.cache_protected_len == 0 and req.lock is None
    assert c.evict(EvictParams(num_tokens=5)).num_tokens_evicted == 0
    assert c.inc_lock_ref(c.root_node).delta == 0 and not c.supports_prefix_sharing()


def test_evict_hands_whole_pages_to_the_allocator():
    c, alloc, _ = cache_with_pools(page_size=2)
    insert(c, [1, 2, 3, 4], [10, 11, 12, 13])
    insert(c, [1, 2, 5, 6], [10, 11, 30, 31])
    lock = c.lock(match(c, [1, 2, 5, 6])[2])
    assert c.evict(EvictParams(num_tokens=1)).num_tokens_evicted == 2  # one page
    assert alloc.calls == [([12, 13], 0)]
    assert c.evict(EvictParams(num_tokens=10)).num_tokens_evicted == 0  # the rest is locked
    c.unlock(lock)
    assert c.evict(EvictParams(num_tokens=10)).num_tokens_evicted == 4
    assert sorted(alloc.calls[1][0]) == [10, 11, 30, 31]


def test_lock_deltas_and_refusals():
    c = SGLangPrefixCache.create_simulated()
    insert(c, [1, 2, 3], [1, 2, 3])
    node = match(c, [1, 2])[2]
    assert c.inc_lock_ref(node).delta == -2 and c.dec_lock_ref(node).delta == 2
    with pytest.raises(ValueError, match="not locked"):
        c.dec_lock_ref(node)
    with pytest.raises(TypeError, match="node must be a Node"):
        c.inc_lock_ref(node.handle)
    assert c.inc_lock_ref(c.root_node).delta == 0  # the root: nothing to protect
    c.evict(EvictParams(num_tokens=3))
    with pytest.raises(ValueError, match="live node"):
        c.inc_lock_ref(node)
    assert c.total_size() == 0


def test_bad_input_is_refused_and_changes_nothing():
    with pytest.raises(ValueError, match="is_eagle"):
        SGLangPrefixCache(SimpleNamespace(disable=False, req_to_token_pool=None,
                                          token_to_kv_pool_allocator=None, page_size=1,
                                          is_eagle=True))
    with pytest.raises(ValueError, match="eviction_policy_config"):
        SGLangPrefixCache(SimpleNamespace(disable=False, req_to_token_pool=None,
                                          token_to_kv_pool_allocator=None, page_size=1,
                                          eviction_policy_config={"x": 1}))
    with pytest.raises(ValueError, match="eviction_policy"):
        SGLangPrefixCache.create_simulated(eviction_policy="tlru")
    with pytest.raises(ValueError, match="page_size"):
        SGLangPrefixCache.create_simulated(page_size=0)
    c = SGLangPrefixCache.create_simulated()
    with pytest.raises(ValueError, match="is_bigram"):
        c.match_prefix(MatchPrefixParams(key=key([1, 2, 3], is_bigram=True)))
    with pytest.raises(ValueError, match="params.value has 2 indices for the key's 3"):
        insert(c, [1, 2, 3], [1, 2])
    with pytest.raises(TypeError, match="params.value must hold integers"):
        c.insert(InsertParams(key=key([1, 2]), value=np.array([1.5, 2.5])))
    assert c.total_size() == 0


def test_uint64_indices_above_int64_are_refused_and_change_nothing():
    """2^64 - 1 would wrap to slot -1, which an eviction then hands to the
    allocator: refused, naming the value, the cache as it was."""
    c, alloc, _ = cache_with_pools()
    insert(c, [1, 2], [10, 20])
    before = (c.total_size(), match(c, [1, 2, 3])[:2])
    for top in ((1 << 64) - 1, 1 << 63):
        value = np.array([5, top, 6], np.uint64)
        with pytest.raises(OverflowError, match=f"params.value holds {top}, above int64"):
            c.insert(InsertParams(key=key([1, 2, 3]), value=value))
        with pytest.raises(OverflowError, match=f"holds {top}"):
            c.insert(InsertParams(key=key([7, 8, 9]), value=value))
        assert (c.total_size(), match(c, [1, 2, 3])[:2]) == before
    ok = np.array([5, (1 << 63) - 1, 6], np.uint64)  # the largest int64 is a slot like any
    c.insert(InsertParams(key=key([7, 8, 9]), value=ok))
    assert match(c, [7, 8, 9])[:2] == (3, [5, (1 << 63) - 1, 6])
    c.evict(EvictParams(num_tokens=100))
    assert sorted(x for call in alloc.calls for x in call[0]) == [5, 6, 10, 20, (1 << 63) - 1]


def _sglang_page_hashes(pages, prior=b""):
    """SGLang's published page hashes, by their definition: SHA-256 chained
    over each page's tokens as little-endian uint32, the digest's first 8
    bytes as a big-endian signed int."""
    out = []
    for page in pages:
        prior = hashlib.sha256(prior + struct.pack(f"<{len(page)}I", *page)).digest()
        out.append(int.from_bytes(prior[:8], "big", signed=True))
    return out


def test_every_page_hash_and_parent_is_sglangs():
    """radix_soa's events of a cache through ``EventHashes``: every page's
    hash and every run's parent present (positive and negative alike) and
    equal to SGLang's chain; removals name the stored pages."""
    from radix_soa.prefix_cache import PrefixCache

    pc = PrefixCache(page_size=2, events=True)
    h = types_.EventHashes()
    seq = list(range(1, 41))
    for end in range(2, 42, 2):  # extended page by page: each run's parent is the page before
        pc.insert(seq[:end], values=seq[:end])
    pc.insert([1, 2, 3, 4, 9, 9], values=[0] * 6)
    pc.evict(pc.total_tokens)
    want = _sglang_page_hashes([seq[i:i + 2] for i in range(0, 40, 2)])
    branch = _sglang_page_hashes([[9, 9]], hashlib.sha256(
        hashlib.sha256(struct.pack("<2I", 1, 2)).digest() + struct.pack("<2I", 3, 4)).digest())
    got, parents, gone = [], [], []
    for e in pc.take_events():
        if type(e).__name__ == "BlockStored":
            hashes, parent = h.stored(list(e.token_ids), e.block_size, e.parent_block_hash,
                                      e.lora_name, e.block_hashes)
            got += hashes
            parents.append(parent)
        elif type(e).__name__ == "BlockRemoved":
            gone += h.removed(e.block_hashes)
    assert got == want + branch
    assert parents == [None] + want[:19] + [want[1]]
    assert any(x >= 0 for x in got) and any(x < 0 for x in got)
    assert sorted(gone) == sorted(got)
    with pytest.raises(RuntimeError, match="never saw"):  # a page it was not shown
        h.removed([12345])
    with pytest.raises(RuntimeError, match="never saw"):
        h.stored([1, 2], 2, 12345, None, [678])


def test_priorities_outside_prefix_caches_range_are_clipped():
    c = SGLangPrefixCache.create_simulated(eviction_policy="priority")
    c.insert(InsertParams(key=key([1, 2]), value=np.array([1, 2]), priority=10**12))
    c.insert(InsertParams(key=key([3, 4]), value=np.array([3, 4]), priority=-10**12))
    assert c.evict(EvictParams(num_tokens=2)).num_tokens_evicted == 2
    assert match(c, [1, 2])[0] == 2 and match(c, [3, 4])[0] == 0  # lowest priority first


def test_events_and_their_kinds():
    c = SGLangPrefixCache.create_simulated(page_size=2, enable_kv_cache_events=True,
                                           mock_allocator=Allocator())
    insert(c, [1, 2, 3, 4], [1, 2, 3, 4])
    c.evict(EvictParams(num_tokens=4))
    kinds = [type(e).__name__ for e in c.take_events()]
    assert kinds == ["AllBlocksCleared", "BlockStored", "BlockRemoved"]
    assert c.take_events() == []
    assert SGLangPrefixCache.create_simulated().take_events() == []


def test_touch_prefix_refreshes_without_splitting():
    c, alloc, _ = cache_with_pools()
    insert(c, [1, 2, 3], [1, 2, 3])
    insert(c, [7, 8], [7, 8])
    c.touch_prefix(key([1, 2]))
    assert c.prefix_cache.num_nodes == 2
    c.evict(EvictParams(num_tokens=2))
    assert alloc.calls == [([7, 8], 0)]  # [1, 2, 3] was used more recently


@pytest.mark.skipif(types_.HAVE_SGLANG, reason="checks the answers without SGLang")
def test_without_sglang_the_sglang_only_parts_say_so():
    with pytest.raises(ImportError, match="SGLang is not installed"):
        adapter.install()
    c = SGLangPrefixCache.create_simulated()
    with pytest.raises(ImportError, match="install SGLang 0.5.23"):
        c.cache_finished_req(SimpleNamespace())


def test_an_sglang_of_another_layout_is_named(tmp_path):
    """An installed SGLang without 0.5.23's interface: an ImportError naming
    what is missing, never the stand-ins."""
    fake = tmp_path / "sglang"
    (fake / "srt" / "mem_cache").mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '0.4.0'\n")
    (fake / "srt" / "__init__.py").write_text("")
    (fake / "srt" / "mem_cache" / "__init__.py").write_text("")
    (fake / "srt" / "mem_cache" / "base_prefix_cache.py").write_text("class BasePrefixCache:\n"
                                                                     "    pass\n")
    code = "import radix_soa.integrations.sglang"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 1
    assert ("ImportError: radix_soa.integrations.sglang is written for SGLang 0.5.23's "
            "prefix-cache interface; the installed SGLang (version 0.4.0) has no "
            "sglang.srt.mem_cache.base_prefix_cache.MatchPrefixParams") in r.stderr


def test_the_package_declares_the_plugin_and_the_extra():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["entry-points"]["sglang.srt.plugins"] == {
        "radix_soa": "radix_soa.integrations.sglang:install"}
    assert any(d.startswith("torch") for d in meta["optional-dependencies"]["sglang"])


def test_import_radix_soa_imports_neither_torch_nor_sglang():
    code = ("import sys, radix_soa; radix_soa.PrefixCache(); "
            "print(sorted(m for m in ('torch', 'sglang') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# ------------------------------------------------------------------ every key and value form
def _forms():
    """How a caller may hand a key's tokens and an insert's indices: SGLang's
    ``array('q')`` and int64 CPU tensors (read inline by the adapter), and
    the other forms (read by ``tokens_of`` / ``as_int64``)."""
    keys = [lambda t: array("q", t), list, lambda t: np.array(t, np.int32),
            lambda t: np.array(t, np.int64)[::-1][::-1]]
    values = [lambda v: np.array(v, np.int64), lambda v: np.array(v, np.int32), list]
    if types_.torch is not None:
        torch = types_.torch
        values += [lambda v: torch.tensor(v, dtype=torch.int64),
                   lambda v: torch.tensor(v, dtype=torch.int32),
                   lambda v: torch.tensor([x for x in v for _ in (0, 1)],
                                          dtype=torch.int64)[::2]]  # strided
    return keys, values


class _Reference:
    """The adapter's insert and match, slowly: every cached page of a
    namespace, by the tokens up to its end, with its pages' indices."""

    def __init__(self, page):
        self.page, self.pages = page, {}

    def size(self):
        return len(self.pages) * self.page

    def insert(self, ns, tokens, values):
        page, n = self.page, len(tokens) - len(tokens) % self.page
        cached = 0
        while cached < n and (ns, tuple(tokens[:cached + page])) in self.pages:
            cached += page
        for p in range(cached, n, page):  # first writer wins: only new pages take values
            self.pages[ns, tuple(tokens[:p + page])] = list(values[p:p + page])
        return cached

    def match(self, ns, tokens):
        page, n, got = self.page, 0, []
        while n + page <= len(tokens) and (ns, tuple(tokens[:n + page])) in self.pages:
            got += self.pages[ns, tuple(tokens[:n + page])]
            n += page
        return n, got


@given(st.sampled_from([1, 4]), st.lists(st.tuples(
    st.sampled_from(["insert", "match", "bad"]),
    st.lists(st.integers(0, 3), max_size=14), st.integers(0, 5), st.integers(0, 5),
    st.sampled_from([None, "a"]), st.one_of(st.none(), st.integers(0, 14))), max_size=30))
@settings(max_examples=150, deadline=None)
def test_every_key_and_value_form_agrees_with_a_reference(page, ops):
    """Random inserts and matches through every key and value form (the
    inline fast paths and the general ones), and bad inserts (too few
    indices, floats), against a slow reference: the same cached lengths,
    matched indices and sizes; a bad insert changes nothing."""
    keys, values = _forms()
    c, ref, slot = SGLangPrefixCache.create_simulated(page_size=page), _Reference(page), 0
    for op, tokens, kf, vf, extra_key, limit in ops:
        k = RadixKey(keys[kf % len(keys)](tokens), extra_key, limit=limit)
        t = tokens if limit is None else tokens[:limit]
        if op == "insert":
            v = list(range(slot, slot + len(tokens)))
            slot += len(tokens)
            r = c.insert(InsertParams(key=k, value=values[vf % len(values)](v)))
            assert r.prefix_len == ref.insert(extra_key, t, v)
            assert isinstance(r, types_.InsertResult) and r.total_len == 0
        elif op == "match":
            m = c.match_prefix(MatchPrefixParams(key=k))
            got = np.asarray(c.path_device_indices(m.last_device_node)).tolist()
            assert (m.device_prefix_len, got) == ref.match(extra_key, t)
        elif len(t) >= page:  # a bad insert: floats, or an index short of the whole pages
            before = c.total_size()
            bads = [np.array([0.5] * len(tokens)), np.arange(len(t) - len(t) % page - 1)]
            if types_.torch is not None:  # what a tensor's .numpy() takes but the cache not
                bads += [types_.torch.tensor([0.5] * len(tokens)),
                         types_.torch.arange(2 * len(tokens)).reshape(len(tokens), 2)]
            bad = bads[vf % len(bads)]
            with pytest.raises((ValueError, TypeError), match="params.value"):
                c.insert(InsertParams(key=k, value=bad))
            assert c.total_size() == before
        assert c.total_size() == ref.size()


def test_insert_result_is_sglangs_result():
    """``insert_result`` builds what ``InsertResult(prefix_len=, last_device_node=)``
    does (SGLang's dataclass, or the stand-in), and falls back to the
    constructor for a class it cannot build by its ``__dict__``."""
    node = Node(7)
    got = types_.insert_result(3, node)
    assert type(got) is types_.InsertResult
    assert got == types_.InsertResult(prefix_len=3, last_device_node=node)
    assert types_._INSERT_DEFAULTS is not None  # the fast form applies to both
    import dataclasses

    @dataclasses.dataclass
    class Checked:
        prefix_len: int
        last_device_node: object = None

        def __post_init__(self):
            self.checked = True

    @dataclasses.dataclass
    class Required:
        prefix_len: int
        last_device_node: object
        other: int

    assert types_._plain_defaults(Checked, ("prefix_len", "last_device_node")) is None
    assert types_._plain_defaults(Required, ("prefix_len", "last_device_node")) is None
    assert types_._plain_defaults(int, ("prefix_len",)) is None

    @dataclasses.dataclass
    class Listed:
        prefix_len: int
        last_device_node: object = None
        actions: list = dataclasses.field(default_factory=list)

    defaults, factories = types_._plain_defaults(Listed, ("prefix_len", "last_device_node"))
    assert defaults == {} and factories == (("actions", list),)
    a, b = types_.insert_result(1, node), types_.insert_result(1, node)
    for name, _ in types_._INSERT_DEFAULTS[1]:  # a fresh list per result, as the class makes
        assert getattr(a, name) is not getattr(b, name)
