"""KV events of ``PrefixCache(events=True)``: what is emitted, the hash
chain, the wire format, and the invariant that matters: a ``RouterIndex``
fed every worker's events answers each worker's ``match_length`` exactly,
after every operation."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import radix_soa as rs
from radix_soa.baselines.router_reference import ReferenceRouterIndex, chain


def stored(events):
    return [e for e in events if isinstance(e, rs.BlockStored)]


def test_events_are_off_by_default_and_take_events_says_so():
    pc = rs.PrefixCache()
    assert not pc.events_enabled and pc._events is None
    with pytest.raises(ValueError, match="events=True"):
        pc.take_events()


def test_a_stored_run_carries_its_tokens_chained_hashes_and_parent():
    pc = rs.PrefixCache(page_size=2, events=True, values=False)
    pc.insert([1, 2, 3, 4, 5])                 # two whole pages; token 5 is a partial page
    pc.insert([1, 2, 3, 4, 6, 7])              # one new page after the two cached
    a, b = pc.take_events()
    h = chain([1, 2, 3, 4, 6, 7], 2)
    assert a == rs.BlockStored(h[:2], None, [1, 2, 3, 4], 2)
    assert b == rs.BlockStored(h[2:], h[1], [6, 7], 2)
    pc.insert([1, 2, 3, 4])                    # nothing new: no event
    assert pc.match([1, 2, 3, 9]).length == 2  # a split changes no pages: no event
    assert pc.take_events() == []


def test_hashes_depend_on_the_namespace_and_every_token_before():
    pc = rs.PrefixCache(page_size=2, events=True, values=False)
    pc.insert([1, 2, 3, 4])
    pc.insert([1, 2, 3, 4], namespace="t")
    pc.insert([9, 2, 3, 4], namespace=7)
    e0, e1, e2 = pc.take_events()
    assert e0.block_hashes == chain([1, 2, 3, 4], 2)
    assert e1.block_hashes == chain([1, 2, 3, 4], 2, "t") and e1.lora_name == "t"
    assert e2.block_hashes == chain([9, 2, 3, 4], 2, 7) and e2.lora_id == 7
    assert len({e0.block_hashes[1], e1.block_hashes[1], e2.block_hashes[1]}) == 3
    assert e0.lora_id is None and e0.lora_name is None and e1.namespace == "t"


@pytest.mark.slow
def test_eviction_drop_and_reset_emit_removed_and_cleared():
    pc = rs.PrefixCache(capacity=6, page_size=2, events=True, values=False)
    pc.insert([1, 2, 3, 4, 5, 6])
    pc.insert([7, 8, 9, 10])                   # evicts the two last pages of the first
    h = chain([1, 2, 3, 4, 5, 6], 2)
    events = pc.take_events()
    assert [type(e).__name__ for e in events] == ["BlockStored", "BlockRemoved", "BlockStored"]
    assert events[1].block_hashes == h[1:]
    pc.insert([1, 2], namespace="x")
    pc.drop_namespace("x")
    assert pc.take_events()[-1] == rs.BlockRemoved(chain([1, 2], 2, "x"))
    assert pc.evict(2).num_tokens == 2
    assert isinstance(pc.take_events()[0], rs.BlockRemoved)
    pc.reset()
    assert pc.take_events() == [rs.AllBlocksCleared()]


@pytest.mark.slow
def test_lifecycle_inserts_and_begin_evictions_emit_events():
    pc = rs.PrefixCache(capacity=8, page_size=2, count_inflight=True, events=True)
    pc.insert([1, 2, 3, 4, 5, 6], values=np.arange(6))
    r = pc.begin([9, 9, 9, 9])                 # reserves 4: evicts 2 tokens
    assert r.evicted.num_tokens == 2
    pc.checkpoint(r, [9, 9], [0, 0])
    pc.finish(r, [9, 9, 9, 9, 9], [0, 0, 0, 0, 0])
    kinds = [type(e).__name__ for e in pc.take_events()]
    assert kinds == ["BlockStored", "BlockRemoved", "BlockStored", "BlockStored"]


def test_events_round_trip_through_dicts_and_json():
    pc = rs.PrefixCache(capacity=4, page_size=2, events=True, values=False)
    pc.insert([1, 2, 3, 4], namespace="a")
    pc.insert([5, 6])
    pc.reset()
    events = pc.take_events()
    wire = json.loads(json.dumps([e.to_dict() for e in events]))
    assert [rs.event_from_dict(d) for d in wire] == events
    assert {d["type"] for d in wire} == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}


@pytest.mark.parametrize("bad, match", [
    ({"type": "Nope"}, "unknown event type"),
    ({"type": "BlockRemoved"}, "needs block_hashes"),
    ({"type": "BlockRemoved", "block_hashes": [-1]}, "outside"),
    ({"type": "BlockRemoved", "block_hashes": "12"}, "list of ints"),
    ({"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
      "token_ids": [1], "block_size": 2}, "1 tokens for 1 blocks of 2"),
    ({"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
      "token_ids": [1, 2], "block_size": 0}, "block_size"),
    ({"type": "BlockStored", "block_hashes": [1], "token_ids": [1, 2], "block_size": 2},
     "parent_block_hash"),
    ([1, 2], "event object or its dict"),
    ({"type": ["BlockStored"]}, "unknown event type"),
    ({"type": {"BlockStored": 1}}, "unknown event type"),
    ({"type": 3}, "unknown event type"),
    ({"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
      "token_ids": [1, 2], "block_size": 2, "lora_id": [1]}, "lora_id"),
    ({"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
      "token_ids": [1, 2], "block_size": 2, "lora_name": 5}, "lora_name"),
])
def test_a_malformed_event_dict_names_the_problem(bad, match):
    with pytest.raises(rs.EventError, match=match):
        rs.event_from_dict(bad)


def test_a_cache_with_events_loaded_or_copied_has_them_off(tmp_path):
    import pickle
    pc = rs.PrefixCache(events=True, values=False)
    pc.insert([1, 2, 3])
    clone = pickle.loads(pickle.dumps(pc))
    assert not clone.events_enabled and clone.match_length([1, 2, 3]) == 3
    pc.save(tmp_path / "c")
    assert not rs.PrefixCache.load(tmp_path / "c").events_enabled


# ---------------------------------------------------------------- the invariant

ALPHABET = st.integers(0, 3)
SEQ = st.lists(ALPHABET, min_size=0, max_size=12)
NAMESPACE = st.sampled_from([None, "t", 5])
OP = st.one_of(
    st.tuples(st.just("insert"), SEQ, NAMESPACE),
    st.tuples(st.just("insert_batch"), st.lists(SEQ, max_size=4), NAMESPACE),
    st.tuples(st.just("match"), SEQ, NAMESPACE),
    st.tuples(st.just("evict"), st.integers(0, 10)),
    st.tuples(st.just("lifecycle"), SEQ, SEQ, NAMESPACE),
    st.tuples(st.just("drop"), NAMESPACE),
    st.tuples(st.just("reset")),
)


def run(pc, op):
    """Apply ``op`` to ``pc``; what it returned (for the twin comparison)."""
    kind = op[0]
    try:
        if kind == "insert":
            r = pc.insert(op[1], values=np.arange(len(op[1])), namespace=op[2])
            return r.cached, r.evicted.num_tokens, r.evicted.values.tolist()
        if kind == "insert_batch":
            cached, ev = pc.insert_batch(op[1], values=[list(range(len(s))) for s in op[1]],
                                         namespace=op[2])
            return cached.tolist(), ev.num_tokens
        if kind == "match":
            return pc.match(op[1], namespace=op[2]).length
        if kind == "evict":
            return pc.evict(op[1]).values.tolist()
        if kind == "lifecycle":
            r = pc.begin(op[1], namespace=op[3])
            mid = list(op[1]) + list(op[2])
            try:
                pc.checkpoint(r, mid[:len(op[1])], np.arange(len(op[1])))
                return pc.finish(r, mid, np.arange(len(mid))).free.tolist()
            except rs.CacheFullError:
                pc.abort(r)
                return "full"
        if kind == "drop":
            return pc.drop_namespace(op[1]).values.tolist()
        pc.reset()
        return None
    except rs.CacheFullError:
        return "full"


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page=st.sampled_from([1, 2, 3]),
       ops=st.lists(st.tuples(st.integers(0, 2), OP), max_size=25),
       queries=st.lists(st.tuples(SEQ, NAMESPACE), min_size=1, max_size=6),
       event_hash=st.sampled_from(["fast64", "sha256_cbor"]))
def test_router_overlap_equals_every_workers_match_length_after_every_step(page, ops, queries,
                                                                           event_hash):
    setups = [dict(capacity=None), dict(capacity=9, eviction_policy="lfu"),
              dict(capacity=12, count_inflight=True)]
    hashing = dict(event_hash=event_hash, event_hash_seed="3")
    workers = [rs.PrefixCache(page_size=page, events=True, **hashing, **kw) for kw in setups]
    twins = [rs.PrefixCache(page_size=page, **kw) for kw in setups]
    ix = rs.RouterIndex(page_size=page, **hashing)
    ref = ReferenceRouterIndex(page) if event_hash == "fast64" else None  # it hashes fast64
    for w, op in ops:
        assert run(workers[w], op) == run(twins[w], op)   # events change no behaviour
        events = workers[w].take_events()
        ix.apply(w, events)
        if ref is not None:
            ref.apply(w, [e.to_dict() for e in events])
        for q, ns in queries + [(op[1], op[-1])] if op[0] in ("insert", "match") else queries:
            got = ix.overlap(q, namespace=ns)
            if ref is not None:
                assert got.tolist() == ref.overlap(q, namespace=ns)
            for col, wid in enumerate(ix.workers):
                assert got[col] == workers[wid].match_length(q, namespace=ns) \
                    == twins[wid].match_length(q, namespace=ns)
        if ref is None:
            continue
        assert len(ix) == len(ref)
        for wid in ix.workers:
            assert ix.blocks_of(wid) == sorted(h for h, (_, ws) in ref.blocks.items()
                                               if wid in ws)
    batch = [q for q, _ in queries]
    m = ix.overlap_batch(batch)
    assert m.shape == (len(batch), len(ix.workers))
    for i, q in enumerate(batch):
        assert m[i].tolist() == ix.overlap(q).tolist()


# ---------------------------------------------------------------- vLLM's sha256_cbor

def vllm_block_hashes(tokens, page, seed, lora=None, salt=None):
    """vLLM's chained block hashes, restated from its definition with
    ``cbor2`` (``vllm/utils/hashing.py`` ``sha256_cbor``,
    ``vllm/v1/core/kv_cache_utils.py`` ``init_none_hash``,
    ``hash_block_tokens``, ``generate_block_hash_extra_keys``)."""
    cbor2 = pytest.importorskip("cbor2", reason="cbor2 (the dev extra) restates vLLM's hash")
    import hashlib

    def sha256_cbor(x):
        return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()

    parent = sha256_cbor(seed)  # NONE_HASH with PYTHONHASHSEED=seed
    out = []
    for i in range(len(tokens) // page):
        extra = ([lora] if lora is not None else []) + ([salt] if salt and i == 0 else [])
        parent = sha256_cbor((parent, tuple(tokens[i * page:(i + 1) * page]),
                              tuple(extra) if extra else None))
        out.append(parent)
    return out


def test_the_cbor_encoder_writes_what_cbor2_writes():
    cbor2 = pytest.importorskip("cbor2", reason="cbor2 (the dev extra) is the reference")
    from radix_soa._events.block_hash import cbor
    values = [None, True, False, 0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32,
              2**63, 2**64 - 1, 2**64, 2**200, -1, -24, -25, -2**64, -2**64 - 1, -2**90,
              b"", b"x" * 23, b"y" * 300, "", "tenant", "é" * 40, (), [1, [2, (3, None)]],
              (b"z" * 32, tuple(range(-40, 70000, 997)), (7, "salt"))]
    for v in values:
        assert cbor(v) == cbor2.dumps(v, canonical=True), v


@pytest.mark.parametrize("page", [1, 4])
def test_sha256_cbor_events_carry_vllms_block_hashes_byte_for_byte(page):
    """A cache with ``event_hash="sha256_cbor"`` emits, for every page, the
    hash vLLM gives that page of the request (parents chained across runs,
    LoRA ids and salts as extra keys), on stored and removed events alike;
    and the same events as a ``fast64`` cache otherwise."""
    seed = "1234"
    fast = rs.PrefixCache(capacity=40, page_size=page, events=True, values=False)
    vllm = rs.PrefixCache(capacity=40, page_size=page, events=True, values=False,
                          event_hash="sha256_cbor", event_hash_seed=seed)
    rng = np.random.default_rng(page)
    base = rng.integers(-5, 100_000, size=24).tolist()
    calls = []
    for i in range(40):
        cut = int(rng.integers(0, 24))
        q = base[:cut] + rng.integers(0, 3, size=int(rng.integers(1, 12))).tolist()
        ns = [0, 7, "tenant"][i % 3]
        calls.append((q, ns))
    for pc in (fast, vllm):
        for q, ns in calls:
            pc.insert(q, namespace=ns)
        pc.drop_namespace(7)
        pc.reset()
        pc.insert(base, namespace="tenant")
    a, b = fast.take_events(), vllm.take_events()
    assert [type(e) for e in a] == [type(e) for e in b]
    assert {type(e).__name__ for e in a} == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
    paths = {}  # fast64 hash of a page -> (its tokens from the sequence start, namespace)
    checked = 0
    for e, v in zip(a, b):
        if isinstance(e, rs.BlockStored):
            assert (v.token_ids, v.block_size, v.lora_id, v.lora_name) == (
                e.token_ids, e.block_size, e.lora_id, e.lora_name)
            before, ns = paths[e.parent_block_hash] if e.parent_block_hash is not None \
                else ([], e.namespace)
            path = before + e.token_ids
            want = vllm_block_hashes(path, page, seed, lora=ns if type(ns) is int and ns else None,
                                     salt=ns if isinstance(ns, str) else None)
            k = len(e.block_hashes)
            assert v.block_hashes == want[len(want) - k:]
            assert v.parent_block_hash == (want[-k - 1] if len(want) > k else None)
            assert all(isinstance(h, bytes) and len(h) == 32 for h in v.block_hashes)
            for j, h in enumerate(e.block_hashes):
                paths[h] = (path[:len(before) + (j + 1) * page], ns)
            checked += k
        elif isinstance(e, rs.BlockRemoved):
            for h, hv in zip(e.block_hashes, v.block_hashes):
                path, ns = paths[h]
                assert hv == vllm_block_hashes(
                    path, page, seed, lora=ns if type(ns) is int and ns else None,
                    salt=ns if isinstance(ns, str) else None)[-1]
    assert checked > 20


def test_a_router_index_takes_sha256_cbor_events_as_bytes_dicts_or_vllms_ints():
    pytest.importorskip("cbor2", reason="cbor2 (the dev extra) restates vLLM's hash")
    kw = dict(event_hash="sha256_cbor", event_hash_seed="7")
    pc = rs.PrefixCache(page_size=2, events=True, values=False, **kw)
    pc.insert([1, 2, 3, 4, 5, 6])
    pc.insert([1, 2, 9, 9], namespace="s")
    events = pc.take_events()
    assert events[0].block_hashes == vllm_block_hashes([1, 2, 3, 4, 5, 6], 2, "7")
    as_ints = []  # what vLLM publishes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
    for e in events:
        d = e.to_dict()
        d["block_hashes"] = [int.from_bytes(h, "big") & (2**64 - 1) for h in d["block_hashes"]]
        as_ints.append(d)
    ix_b, ix_d, ix_i = (rs.RouterIndex(page_size=2, **kw) for _ in range(3))
    ix_b.apply("w", events)
    ix_d.apply("w", [e.to_dict() for e in events])
    ix_i.apply("w", as_ints)
    for q, ns in [([1, 2, 3, 4, 5, 6, 7], None), ([1, 2, 3], None), ([1, 2, 9, 9], "s"),
                  ([1, 2, 9, 9], None), ([5, 6], None)]:
        want = pc.match_length(q, namespace=ns)
        assert ix_b.overlap(q, namespace=ns).tolist() == ix_d.overlap(q, namespace=ns).tolist() \
            == ix_i.overlap(q, namespace=ns).tolist() == [want]
    assert ix_b.overlap_batch([[1, 2, 3, 4], [1, 2, 9]]).tolist() == [[4], [2]]
    assert ix_b.blocks_of("w") == ix_i.blocks_of("w")
    # keyed by their tokens (the default), the engine's hashes are handles:
    # the same answers with no hash to reproduce
    ix_t = rs.RouterIndex(page_size=2)
    ix_t.apply("w", events)
    for q, ns in [([1, 2, 3, 4, 5, 6], None), ([1, 2, 3, 4], "tenant"), ([1, 2, 9, 9], None)]:
        assert ix_t.overlap(q, namespace=ns).tolist() == ix_b.overlap(q, namespace=ns).tolist()
    other = rs.RouterIndex(page_size=2, event_hash="sha256_cbor", event_hash_seed="8")
    other.apply("w", events)  # another seed: the events apply, no query finds them
    assert other.overlap([1, 2, 3, 4]).tolist() == [0]


def test_sha256_cbor_options_are_checked():
    with pytest.raises(ValueError, match="event_hash must be one of"):
        rs.PrefixCache(events=True, event_hash="md5")
    with pytest.raises(ValueError, match="needs events=True"):
        rs.PrefixCache(event_hash="sha256_cbor", event_hash_seed="0")
    with pytest.raises(ValueError, match="32-byte"):
        rs.RouterIndex(event_hash="sha256_cbor", event_hash_seed=b"short")
    with pytest.raises(TypeError, match="event_hash_seed"):
        rs.RouterIndex(event_hash="sha256_cbor", event_hash_seed=3)
    pc = rs.PrefixCache(page_size=1, events=True, values=False, event_hash="sha256_cbor",
                        event_hash_seed=b"\x01" * 32)  # a NONE_HASH read off an engine
    pc.insert([4])
    h, = pc.take_events()[0].block_hashes
    from radix_soa._events.block_hash import sha256_cbor
    assert h == sha256_cbor((b"\x01" * 32, (4,), None))
