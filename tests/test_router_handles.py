"""``RouterIndex`` with engine hashes (an engine's block hash is not the
index's key): each node keeps its first holder's engine hash, a worker an
entry only where its hash differs. Checked against the pure-Python
reference fed the same streams under the index's own keys: engines sharing
one hash seed, each engine its own, mixed with own-hash workers; through
``apply`` and ``apply_wire``; under a byte budget; under injected faults."""

import hashlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import radix_soa as rs
from radix_soa.baselines.router_reference import ReferenceRouterIndex
from radix_soa.integrations.vllm_wire import encode_batch

M64 = (1 << 64) - 1


def engine_hash(h, seed):
    """An engine's block hash of the page the index keys ``h``: a keyed
    hash, as vLLM's of a block's tokens under its ``NONE_HASH`` seed
    (``seed`` None: the engine hash is the key, a PrefixCache's own)."""
    if seed is None:
        return h
    d = hashlib.blake2b(int(h).to_bytes(8, "little"), digest_size=8,
                        key=seed.to_bytes(8, "little")).digest()
    return int.from_bytes(d, "little")


def engine_events(events, seed):
    out = []
    for e in events:
        if isinstance(e, rs.BlockStored):
            out.append(rs.BlockStored(
                [engine_hash(h, seed) for h in e.block_hashes],
                None if e.parent_block_hash is None else engine_hash(e.parent_block_hash, seed),
                e.token_ids, e.block_size, e.lora_id, e.medium, e.lora_name, e.extra_keys))
        elif isinstance(e, rs.BlockRemoved):
            out.append(rs.BlockRemoved([engine_hash(h, seed) for h in e.block_hashes]))
        else:
            out.append(e)
    return out


def entries(ix):
    """Every worker's handle entries, counted from the maps themselves."""
    return {ix._col_ids[c]: int(np.count_nonzero(m[0])) for c, m in ix._hmaps.items()
            if ix._col_ids[c] is not None}


def check_handles(ix, seeds, ref):
    """Invariants: each worker's blocks are its engine's hashes of the
    reference's; a worker has an entry exactly for each page it names
    otherwise than the node's default; the counts kept are the maps'."""
    for w in ix.workers:
        assert ix.blocks_of(w) == sorted(engine_hash(h, seeds[w]) for h in ref.held(w))
    counted = entries(ix)
    for c, m in ix._hmaps.items():
        if ix._col_ids[c] is not None:
            assert m[2] == counted[ix._col_ids[c]]
    end = int(ix._meta[0])
    live = ix._flags[:end] >= 0
    default = {int(k): int(d) for k, d in zip(
        ix._keys[:end][live], (ix._ehash[:end] if ix._ehash.shape[0] else ix._keys[:end])[live])}
    for w in ix.workers:
        differ = sum(1 for h in ref.held(w) if engine_hash(h, seeds[w]) != default[h])
        assert counted[w] == differ
    if ix._ehash.shape[0]:  # the etable holds exactly the live nodes
        t = ix._etable[ix._etable >= 0]
        assert sorted(t.tolist()) == np.flatnonzero(live).tolist()


SEEDINGS = {"shared": lambda w: 7, "each": lambda w: 1000 + w,
            "mixed": lambda w: None if w % 2 else 1000 + w}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page=st.sampled_from([1, 2]), seeding=st.sampled_from(sorted(SEEDINGS)),
       wire=st.booleans(),
       ops=st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(0, 2), max_size=10),
                              st.sampled_from(["insert", "insert", "evict", "reset"])),
                    max_size=30))
def test_engine_hashes_give_the_reference_answers(page, seeding, wire, ops):
    seeds = {w: SEEDINGS[seeding](w) for w in range(4)}
    caches = {}
    ix, ref = rs.RouterIndex(page_size=page), ReferenceRouterIndex(page)
    for w, seq, kind in ops:
        pc = caches.setdefault(w, rs.PrefixCache(capacity=10, page_size=page, events=True,
                                                 values=False))
        if kind == "insert":
            try:
                pc.insert(seq)
            except rs.CacheFullError:
                pass
        elif kind == "evict":
            pc.evict(len(seq))
        else:
            pc.reset()
        events = pc.take_events()
        theirs = engine_events(events, seeds[w])
        if wire:
            ix.apply_wire(w, encode_batch(theirs))
        else:
            ix.apply(w, theirs)
        ref.apply(w, events)
        assert ix.overlap(seq).tolist() == ref.overlap(seq)
        check_handles(ix, seeds, ref)
        assert all(ix.status(x) == "exact" for x in ix.workers)
    qs = [seq for _, seq, _ in ops] or [[]]
    assert ix.overlap_batch(qs).tolist() == [ref.overlap(q) for q in qs]
    back = rs.RouterIndex.from_state(ix.export_state())
    assert back.overlap_batch(qs).tolist() == [ref.overlap(q) for q in qs]
    check_handles(back, seeds, ref)


def chains(n, length, page=1, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1 << 30, length * page).tolist() for _ in range(n)]


def test_shared_seeds_need_no_entries_and_seeds_of_their_own_one_per_later_holder():
    toks = [1, 2, 3, 4]
    own = rs.RouterIndex(page_size=2)
    pc = rs.PrefixCache(page_size=2, events=True, values=False)
    pc.insert(toks)
    evs = pc.take_events()
    for seeding, want in (("shared", {0: 0, 1: 0, 2: 0}), ("each", {0: 0, 1: 2, 2: 2})):
        ix = rs.RouterIndex(page_size=2)
        for w in range(3):
            ix.apply(w, engine_events(evs, SEEDINGS[seeding](w)))
        assert entries(ix) == want and ix.overlap(toks).tolist() == [4, 4, 4]
        # the first holder leaves: the others still resolve their own hashes
        ix.apply(0, engine_events([rs.BlockRemoved(evs[0].block_hashes[::-1])],
                                  SEEDINGS[seeding](0)))
        ix.apply(1, engine_events([rs.BlockRemoved(evs[0].block_hashes[::-1])],
                                  SEEDINGS[seeding](1)))
        assert ix.overlap(toks).tolist() == [0, 0, 4] and entries(ix)[1] == 0
    own.apply(0, evs)
    assert own._ehash.shape[0] == 0 and own.memory_report()["arrays"]["etable"] == 0


def test_an_engine_hash_equal_to_another_pages_key_names_the_workers_own_page():
    from radix_soa.baselines.router_reference import chain
    ix = rs.RouterIndex(page_size=2)
    h = chain([1, 2, 3, 4], 2)
    ix.apply("a", [rs.BlockStored(h, None, [1, 2, 3, 4], 2)])
    ix.apply("b", [rs.BlockStored([h[1]], None, [3, 4], 2)])     # b's hash is a's key
    ix.apply("c", [rs.BlockStored([h[1]], None, [5, 6], 2)])     # and c's too
    ix.apply("c", [rs.BlockRemoved([h[1]])])
    ix.apply("b", [rs.BlockRemoved([h[1]])])
    assert ix.overlap_scores([1, 2, 3, 4]) == {"a": 4, "b": 0, "c": 0}
    assert len(ix) == 2 and ix.blocks_of("a") == sorted(h)


@pytest.mark.parametrize("seeding", ["shared", "each"])
def test_the_budget_counts_the_handles_and_forgets_them_with_their_pages(seeding):
    budget = 1 << 15
    ix = rs.RouterIndex(page_size=1, max_bytes=budget, strict=False)
    ref_pages = 0
    peak = 0
    for step, toks in enumerate(chains(300, 8)):
        pc_events = [rs.BlockStored(rs.baselines.router_reference.chain(toks, 1), None, toks, 1)]
        for w in (step % 4, (step + 1) % 4):
            if step % 3 == 0 and w == (step + 1) % 4:
                continue
            ix.apply(w, engine_events(pc_events, SEEDINGS[seeding](w)))
            rep = ix.memory_report()
            assert rep["bytes"] <= budget
            peak = max(peak, rep["arrays"]["handles"])
        ref_pages += 8
    rep = ix.memory_report()
    assert rep["forgotten_pages"] > 0 and rep["pages"] < ref_pages
    held = sum(len(ix.blocks_of(w)) for w in ix.workers)
    counted = sum(entries(ix).values())
    assert counted <= held - rep["pages"] + 1  # no entry outlives its page
    if seeding == "each":
        assert peak > 0
    else:
        assert peak == 0 and counted == 0
    # forgetting everything leaves no entry behind
    ix._forget(rep["pages"])
    assert sum(entries(ix).values()) == 0 and len(ix) == 0


def test_apply_wire_under_a_budget_takes_the_kernel_and_keeps_it():
    from radix_soa.router_index import wire as RW
    calls = []
    real = RW.hx.rx_apply_events

    def counting(*a):
        calls.append(1)
        return real(*a)

    budget = 1 << 15
    ix = rs.RouterIndex(page_size=1, max_bytes=budget, strict=False)
    RW.hx.rx_apply_events = counting
    try:
        for step, toks in enumerate(chains(200, 4)):
            evs = [rs.BlockStored(rs.baselines.router_reference.chain(toks, 1), None, toks, 1)]
            ix.apply_wire(step % 3, encode_batch(engine_events(evs, 50 + step % 3)))
            assert ix.memory_report()["bytes"] <= budget
    finally:
        RW.hx.rx_apply_events = real
    assert len(calls) >= 200 and ix.memory_report()["forgotten_pages"] > 0


@pytest.mark.parametrize("fault", [MemoryError, KeyboardInterrupt])
@pytest.mark.parametrize("wire", [False, True])
def test_a_strict_apply_interrupted_leaves_the_index_and_its_handles_as_they_were(
        monkeypatch, fault, wire):
    from radix_soa import router_index as RI
    rng = np.random.default_rng(3)
    pc = {w: rs.PrefixCache(capacity=40, page_size=2, events=True, values=False)
          for w in range(3)}
    ix = rs.RouterIndex(page_size=2)
    qs = []
    for step in range(30):
        w = step % 3
        q = rng.integers(0, 3, 12).tolist()
        qs.append(q)
        pc[w].insert(q)
        ix.apply(w, engine_events(pc[w].take_events(), 1000 + w))
    before = ({w: ix.blocks_of(w) for w in ix.workers}, [ix.overlap(q).tolist() for q in qs],
              entries(ix), len(ix))
    for q in qs[:5]:
        pc[0].insert(q + [9, 9])
    pc[0].evict(6)
    evs = engine_events(pc[0].take_events() + [rs.AllBlocksCleared()], 1000)
    real = RI.RouterIndex._apply_one
    calls = []

    def faulty(self, *args):
        calls.append(1)
        if len(calls) == 2:
            raise fault
        return real(self, *args)

    monkeypatch.setattr(RI.RouterIndex, "_apply_one", faulty)
    with pytest.raises(fault):
        if wire:
            ix.apply_wire(0, encode_batch(evs + evs[:1]), strict=True)
        else:
            ix.apply(0, evs + evs[:1], strict=True)
    after = ({w: ix.blocks_of(w) for w in ix.workers}, [ix.overlap(q).tolist() for q in qs],
             entries(ix), len(ix))
    assert after == before and len(calls) == 2


def test_a_checkpoint_keeps_the_engine_hashes_and_refuses_arrays_that_do_not_fit(tmp_path):
    from radix_soa.service import checkpoint as ck
    pc = rs.PrefixCache(page_size=2, events=True, values=False)
    pc.insert([1, 2, 3, 4, 5, 6])
    evs = pc.take_events()
    ix = rs.RouterIndex(page_size=2)
    for w in range(3):
        ix.apply(w, engine_events(evs, 1000 + w))
    ck.save(tmp_path / "s", ck.snapshot(ix))
    back, _, _ = ck.load(tmp_path / "s")
    assert back.overlap([1, 2, 3, 4, 5, 6]).tolist() == [6, 6, 6]
    assert {w: back.blocks_of(w) for w in range(3)} == {w: ix.blocks_of(w) for w in range(3)}
    back.apply(1, engine_events([rs.BlockRemoved(evs[0].block_hashes[::-1])], 1001))
    assert back.overlap([1, 2, 3, 4, 5, 6]).tolist() == [6, 0, 6]
    state = ix.export_state()
    state["_etable"] = state["_etable"][:-1]
    with pytest.raises(ValueError, match="do not fit"):
        rs.RouterIndex.from_state(state)
    state = ix.export_state()
    state["_eh_on"] = False
    with pytest.raises(ValueError, match="do not fit"):
        rs.RouterIndex.from_state(state)


def test_from_state_trusts_no_node_id_or_map_it_did_not_check():
    pc = rs.PrefixCache(page_size=2, events=True, values=False)
    for q in ([1, 2, 3, 4, 5, 6], [1, 2, 9, 9], [7, 7, 8, 8]):
        pc.insert(q)
    evs = pc.take_events()
    ix = rs.RouterIndex(page_size=2, max_bytes=1 << 16)
    for w in range(3):
        ix.apply(w, engine_events(evs, 1000 + w))
    ix.apply(0, engine_events([rs.BlockRemoved([evs[-1].block_hashes[-1]])], 1000))
    qs = [[1, 2, 3, 4, 5, 6], [1, 2, 9, 9], [7, 7, 8, 8]]
    want = [ix.overlap(q).tolist() for q in qs]
    # the free list and the tables are rebuilt, not read: junk in them is harmless
    state = ix.export_state()
    state["_table"][:] = 1 << 30
    state["_etable"][:] = -7
    state["_meta"][1:] = [1 << 40, 99, 5]  # the free list's head, the live count
    state["_keys"][state["_flags"] < 0] = 1 << 62
    back = rs.RouterIndex.from_state(state)
    assert [back.overlap(q).tolist() for q in qs] == want
    back.apply(1, engine_events([rs.BlockStored([5, 6], None, [11, 11, 12, 12], 2)], 3))
    assert back.overlap([11, 11, 12, 12]).tolist() == [0, 4, 0]
    assert back.memory_report()["pages"] == ix.memory_report()["pages"] + 2

    def refused(change, match):
        state = ix.export_state()
        change(state)
        with pytest.raises(ValueError, match=match):
            rs.RouterIndex.from_state(state)

    n = ix.export_state()["_keys"].shape[0]
    refused(lambda s: s["_meta"].__setitem__(0, n + 1), "high-water mark")
    refused(lambda s: s["_flags"].__setitem__(0, 5), "node flags")
    refused(lambda s: s["_flags"].__setitem__(slice(None), 0), "node flags|too small")
    refused(lambda s: s.__setitem__("_stamps", s["_stamps"][:-1]), "stamps")
    refused(lambda s: s.__setitem__("_forgot", s["_forgot"][:3]), "per-worker counts")
    refused(lambda s: s["_hmaps"].pop(1), "handle maps")

    def full_map(s):  # a map with no empty slot: a probe for a hash it lacks never ends
        hk, hv, _ = s["_hmaps"][1]
        hk[:] = np.arange(1, hk.shape[0] + 1, dtype=np.uint64)
        s["_hmaps"][1] = [hk, hv, hk.shape[0]]
    refused(full_map, "handle map of column 1")
    refused(lambda s: s["_hmaps"][1].__setitem__(2, 10 ** 6), "handle map of column 1")


def test_a_strict_apply_wire_interrupted_while_its_handle_map_grows_changes_nothing(monkeypatch):
    from radix_soa import router_index as RI
    pc = rs.PrefixCache(page_size=2, events=True, values=False)
    pc.insert([1, 2, 3, 4])
    evs0 = pc.take_events()
    pc.insert([5, 6, 7, 8])
    evs1 = pc.take_events()
    other = rs.PrefixCache(page_size=2, events=True, values=False)
    other.insert([9, 9])
    ix = rs.RouterIndex(page_size=2)
    ix.apply(0, engine_events(evs0, 1000))
    ix.apply(1, engine_events(other.take_events(), 2000))

    def state():
        return ({w: ix.blocks_of(w) for w in ix.workers}, len(ix), entries(ix),
                [ix.overlap(q).tolist() for q in ([1, 2, 3, 4], [5, 6, 7, 8], [9, 9])])
    before = state()
    for fault in (MemoryError, KeyboardInterrupt):
        def grow(self, *args, fault=fault):  # the kernel has applied events; the map must grow
            raise fault
        monkeypatch.setattr(RI.RouterIndex, "_handle_put", grow)
        with pytest.raises(fault):
            ix.apply_wire(1, encode_batch(engine_events(evs0 + evs1, 2000)), strict=True)
        assert state() == before
    monkeypatch.undo()
    ix.apply_wire(1, encode_batch(engine_events(evs0 + evs1, 2000)), strict=True)
    assert ix.overlap([1, 2, 3, 4]).tolist() == [4, 4]


def test_a_run_past_the_budget_keeps_no_handle_for_the_pages_it_did_not_store():
    from radix_soa.baselines.router_reference import chain
    for budget, n in ((8192, 400), (1 << 16, 1600)):
        ix = rs.RouterIndex(page_size=1, max_bytes=budget, strict=False)
        toks = list(range(1, n + 1))
        ix.apply(0, engine_events([rs.BlockStored(chain(toks, 1), None, toks, 1)], 1000))
        rep = ix.memory_report()
        held = len(ix.blocks_of(0))
        assert 0 < held == rep["pages"] < n and rep["bytes"] <= budget
        assert entries(ix)[0] <= held  # an entry only for a page it holds
        assert ix.overlap(toks).tolist() == [held]
        back = rs.RouterIndex.from_state(ix.export_state())
        assert back.overlap(toks).tolist() == [held]


def test_a_refused_strict_batch_leaves_the_engine_hash_arrays_as_they_were():
    from radix_soa.baselines.router_reference import chain
    toks = list(range(1, 400))
    ix = rs.RouterIndex(page_size=1)
    ix.apply("own", [rs.BlockStored(chain(toks, 1), None, toks, 1)])  # own hashes: none kept
    before = ix.memory_report()["arrays"]
    bad = engine_events([rs.BlockStored(chain([9], 1), None, [9], 1)], 7) + [rs.BlockRemoved([42])]
    with pytest.raises(rs.EventError):
        ix.apply("eng", bad, strict=True)
    after = ix.memory_report()["arrays"]
    assert before["ehash"] == before["etable"] == after["ehash"] == after["etable"] == 0
    assert ix.workers == ["own"] and len(ix) == 399 and ix.overlap(toks).tolist() == [399]
    ix.apply("eng", bad[:1], strict=True)  # once a call succeeds, the pages keep engine hashes
    assert ix.memory_report()["arrays"]["ehash"] > 0 and ix.overlap([9]).tolist() == [0, 1]


def test_apply_wire_keeps_engine_hashes_per_page_once_a_worker_needed_entries():
    pcs = [rs.PrefixCache(page_size=2, events=True, values=False) for _ in range(2)]
    ix = rs.RouterIndex(page_size=2)
    for w, pc in enumerate(pcs):  # two engines sharing a seed, through apply_wire
        pc.insert([1, 2, 3, 4])
        ix.apply_wire(w, encode_batch(engine_events(pc.take_events(), 7)))
    first = entries(ix)
    assert ix.memory_report()["arrays"]["ehash"] > 0
    for w, pc in enumerate(pcs):  # pages new since: one engine hash each, no entry
        pc.insert([5, 6, 7, 8, 9, 9])
        ix.apply_wire(w, encode_batch(engine_events(pc.take_events(), 7)))
    assert entries(ix) == first and ix.overlap([5, 6, 7, 8, 9, 9]).tolist() == [6, 6]
