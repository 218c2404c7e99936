"""A router index that stays exact across restarts and lost events: the
``strict=False`` status mode (``degraded`` from the first event that
cannot apply), ``seq`` (duplicates skipped, gaps found), and
``PrefixCache.snapshot_events`` + ``RouterIndex.apply_snapshot`` making a
worker exact again; checked against the pure-Python reference and against
the workers' caches themselves."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import radix_soa as rs
from radix_soa.baselines.router_reference import ReferenceRouterIndex, chain, pages_of


def stored(tokens, page=2, cached=0, namespace=None):
    h = chain(tokens, page, namespace)
    k = cached // page
    return rs.BlockStored(h[k:], h[k - 1] if k else None, list(tokens[cached:len(h) * page]),
                          page)


def state(ix, queries):
    return ({w: ix.blocks_of(w) for w in ix.workers}, dict(ix.degraded),
            [ix.overlap(q).tolist() for q in queries])


# ---------------------------------------------------------------- the status mode

def test_a_missing_parent_degrades_the_worker_and_adds_no_overlap():
    ix = rs.RouterIndex(page_size=2, strict=False, workers=["a", "b"])
    ix.apply("b", [stored([1, 2, 3, 4])])
    ix.apply("a", [stored([1, 2, 3, 4, 5, 6], cached=4)])   # its parent's event was lost
    assert ix.status("a") == "degraded" and ix.status("b") == "exact"
    assert "parent block" in ix.degraded["a"] and list(ix.degraded) == ["a"]
    assert ix.overlap([1, 2, 3, 4, 5, 6]).tolist() == [0, 4]     # nothing invented
    assert ix.blocks_of("a") == [chain([1, 2, 3, 4, 5, 6], 2)[2]]  # but it holds the page
    rep = ix.overlap_report([1, 2, 3, 4])
    assert rep.scores == {"a": 0, "b": 4} and rep.degraded == frozenset({"a"})
    ix.apply("a", [stored([1, 2, 3, 4])])                   # the late parent arrives
    assert ix.overlap([1, 2, 3, 4, 5, 6]).tolist() == [6, 4]
    assert ix.status("a") == "degraded"                     # still not known to be exact
    ix.apply("a", [rs.AllBlocksCleared(), stored([7, 8])])  # a clear: exact from there on
    assert ix.status("a") == "exact" and ix.degraded == {}
    assert ix.overlap([7, 8]).tolist() == [2, 0]


@pytest.mark.parametrize("events, problem", [
    ([stored([1, 2])], "held by worker 'a' already"),
    ([rs.BlockRemoved([12345])], "BlockRemoved of block 12345"),
    ([rs.BlockRemoved([chain([1, 2], 2)[0]] * 2)], "BlockRemoved of block"),
    ([rs.BlockStored([77], 12345, [5, 6], 2)], "parent block 12345 is not held"),
])
def test_each_problem_degrades_in_the_status_mode_and_raises_in_the_strict_one(events, problem):
    def fresh(strict):
        ix = rs.RouterIndex(page_size=2, strict=strict)
        ix.apply("a", [stored([1, 2])])
        ix.apply("b", [stored([1, 2, 3, 4])])
        return ix

    strict = fresh(True)
    before = state(strict, [[1, 2, 3, 4]])
    with pytest.raises(rs.EventError, match=problem):
        strict.apply("a", events)
    assert state(strict, [[1, 2, 3, 4]]) == before and strict.status("a") == "exact"
    lenient = fresh(False)
    lenient.apply("a", events)
    assert lenient.status("a") == "degraded" and problem.split(" ")[0] in lenient.degraded["a"]
    ref = ReferenceRouterIndex(2, strict=False)
    ref.apply("a", [stored([1, 2])])
    ref.apply("b", [stored([1, 2, 3, 4])])
    ref.apply("a", events)
    assert lenient.blocks_of("a") == ref.held("a") and ref.status("a") == "degraded"
    # the per-call override both ways
    with pytest.raises(rs.EventError):
        fresh(False).apply("a", events, strict=True)
    other = fresh(True)
    other.apply("a", events, strict=False)
    assert other.status("a") == "degraded"


def test_seq_skips_duplicates_and_finds_gaps():
    ix = rs.RouterIndex(page_size=2, strict=False)
    ix.apply("w", [stored([1, 2])], seq=5)
    ix.apply("w", [stored([1, 2])], seq=5)          # a duplicate: skipped, not a problem
    ix.apply("w", [stored([1, 2, 3, 4], cached=2)], seq=6)
    assert ix.status("w") == "exact" and ix.overlap([1, 2, 3, 4]).tolist() == [4]
    ix.apply("w", [stored([1, 2, 3, 4, 5, 6], cached=4)], seq=8)   # 7 never came
    assert ix.status("w") == "degraded" and "7..7" in ix.degraded["w"]
    assert ix.overlap([1, 2, 3, 4, 5, 6]).tolist() == [6]          # applied all the same
    strict = rs.RouterIndex(page_size=2)
    strict.apply("w", [stored([1, 2])], seq=0)
    with pytest.raises(rs.EventError, match="never arrived"):
        strict.apply("w", [stored([1, 2, 3, 4], cached=2)], seq=2)
    assert strict.overlap([1, 2, 3, 4]).tolist() == [2]
    with pytest.raises(ValueError, match="seq"):
        ix.apply("w", [], seq=-1)
    with pytest.raises(TypeError, match="seq"):
        ix.apply("w", [], seq=1.0)
    with pytest.raises(TypeError, match="strict"):
        ix.apply("w", [], strict="no")
    with pytest.raises(TypeError, match="strict"):
        rs.RouterIndex(strict=None)
    with pytest.raises(KeyError, match="'nobody'"):
        ix.status("nobody")


def test_a_malformed_event_raises_in_the_status_mode_too():
    ix = rs.RouterIndex(page_size=2, strict=False)
    ix.apply("w", [stored([1, 2])])
    with pytest.raises(rs.EventError, match="block_size 3"):
        ix.apply("w", [stored([1, 2, 3, 4], cached=2), stored([1, 2, 3], page=3)])
    with pytest.raises(rs.EventError, match="needs block_hashes"):
        ix.apply("w", [{"type": "BlockRemoved"}])
    assert ix.blocks_of("w") == sorted(chain([1, 2], 2)) and ix.status("w") == "exact"


# ---------------------------------------------------------------- snapshots

def test_a_snapshot_holds_every_cached_page_with_the_hashes_take_events_gave():
    pc = rs.PrefixCache(capacity=30, page_size=2, events=True, values=False)
    rng = np.random.default_rng(1)
    ref = ReferenceRouterIndex(2)
    for i in range(60):
        q = rng.integers(0, 3, size=int(rng.integers(0, 14))).tolist()
        pc.insert(q, namespace=[None, "t", 4][i % 3])
        ref.apply("w", pc.take_events())
    before = pc.take_events()
    assert before == []
    pc.insert([9, 9, 9, 9])                          # queued (an eviction, a store), not taken
    snap = pc.snapshot_events()
    pages = pages_of(snap)
    pending = pc.take_events()                       # the queue is as it was
    assert [type(e).__name__ for e in pending] == ["BlockRemoved", "BlockStored"]
    assert pending[-1].token_ids == [9, 9, 9, 9]
    ref.apply("w", pending)
    assert {h: p for h, (p, _, _) in pages.items()} == {h: p for h, (p, _) in ref.blocks.items()}
    assert sum(len(t) for _, t, _ in pages.values()) == pc.total_tokens
    assert {ns for _, _, ns in pages.values()} == {0, "t", 4}
    ix = rs.RouterIndex(page_size=2)
    ix.apply("w", snap)                              # parents before children: it applies
    for q in ([0, 1, 2, 0], [9, 9, 9, 9, 1], [1, 1, 1, 1, 1, 1]):
        for ns in (None, "t", 4):
            assert ix.overlap(q, namespace=ns).tolist() == [pc.match_length(q, namespace=ns)]


def test_a_snapshot_of_a_cache_without_events_and_with_vllms_hash():
    cbor = dict(event_hash="sha256_cbor", event_hash_seed="5")
    with_events = rs.PrefixCache(page_size=2, events=True, values=False)
    plain = rs.PrefixCache(page_size=2, values=False)
    vllm = rs.PrefixCache(page_size=2, events=True, values=False, **cbor)
    for pc in (with_events, plain, vllm):
        for q in ([1, 2, 3, 4, 5, 6], [1, 2, 7, 8], [3, 3]):
            pc.insert(q, namespace="s" if q == [3, 3] else None)
    assert plain.snapshot_events() == with_events.snapshot_events()
    taken = pages_of(vllm.take_events())
    assert pages_of(vllm.snapshot_events()) == taken
    assert pages_of(plain.snapshot_events(**cbor)) == taken
    assert all(isinstance(h, bytes) for h in taken)
    with pytest.raises(ValueError, match="event_hash must be one of"):
        plain.snapshot_events(event_hash="md5")
    with pytest.raises(ValueError, match="this cache's events use 'fast64'"):
        with_events.snapshot_events(event_hash="sha256_cbor")
    with pytest.raises(ValueError, match="event_hash_seed"):
        plain.snapshot_events(event_hash_seed="1")
    assert rs.PrefixCache().snapshot_events() == []


def test_apply_snapshot_replaces_the_worker_and_is_all_or_nothing():
    pc = rs.PrefixCache(page_size=2, events=True, values=False)
    pc.insert([1, 2, 3, 4])
    ix = rs.RouterIndex(page_size=2, strict=False, workers=["w", "x"])
    ix.apply("w", [stored([5, 6])])                  # pages it no longer holds
    ix.apply("w", [rs.BlockRemoved([1])])
    ix.apply("x", [stored([5, 6])])
    assert ix.status("w") == "degraded"
    bad = [stored([1, 2, 3, 4], cached=2)]           # a run whose parent is not in it
    before = state(ix, [[5, 6], [1, 2, 3, 4]])
    with pytest.raises(rs.EventError, match="parent block"):
        ix.apply_snapshot("w", bad)
    assert state(ix, [[5, 6], [1, 2, 3, 4]]) == before
    pc.take_events()
    ix.apply_snapshot("w", pc.snapshot_events(), seq=3)
    assert ix.status("w") == "exact" and ix.blocks_of("w") == sorted(chain([1, 2, 3, 4], 2))
    assert ix.overlap([5, 6]).tolist() == [0, 2] and ix.overlap([1, 2, 3, 4]).tolist() == [4, 0]
    pc.insert([1, 2, 3, 4, 5, 6])
    ix.apply("w", pc.take_events(), seq=3)           # covered by the snapshot: skipped
    assert ix.overlap([1, 2, 3, 4, 5, 6]).tolist() == [4, 0]
    pc.insert([1, 2, 9, 9])
    ix.apply("w", pc.take_events(), seq=4)
    assert ix.overlap([1, 2, 9, 9]).tolist() == [4, 0] and ix.status("w") == "exact"
    ix.apply_snapshot("new", [])                     # a new worker, registered exact
    assert ix.workers == ["w", "x", "new"] and ix.status("new") == "exact"


# ---------------------------------------------------------------- lossy streams

FATES = st.sampled_from(["deliver"] * 5 + ["drop", "duplicate", "swap"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page=st.sampled_from([1, 2]),
       ops=st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 3), max_size=10),
                              st.sampled_from(["insert", "insert", "evict", "reset"]), FATES,
                              st.booleans()),
                    min_size=1, max_size=30),
       queries=st.lists(st.lists(st.integers(0, 3), max_size=10), min_size=1, max_size=5))
def test_after_drops_duplicates_and_reorders_a_snapshot_makes_every_worker_exact(page, ops,
                                                                                 queries):
    """Events dropped, applied twice or swapped with the worker's next batch
    (with and without ``seq``): the index follows the reference's status-mode
    semantics step by step; then each worker's snapshot makes the index
    equal its cache exactly, and later events keep it so."""
    caches = [rs.PrefixCache(capacity=12, page_size=page, events=True, values=False)
              for _ in range(3)]
    ix = rs.RouterIndex(page_size=page, strict=False, workers=range(3))
    ref = ReferenceRouterIndex(page, workers=range(3), strict=False)
    held = {w: None for w in range(3)}     # a batch held back to be swapped with the next
    seqs = [0, 0, 0]

    def deliver(w, batch, seq):
        ix.apply(w, batch, seq=seq)
        ref.apply(w, batch, seq=seq)

    for w, seq, kind, fate, numbered in ops:
        pc = caches[w]
        if kind == "insert":
            try:
                pc.insert(seq)
            except rs.CacheFullError:
                pass
        elif kind == "evict":
            pc.evict(len(seq))
        else:
            pc.reset()
        batch = pc.take_events()
        seqs[w] += 1
        n = seqs[w] if numbered else None
        if fate == "drop":
            pass
        elif fate == "duplicate":
            deliver(w, batch, n)
            deliver(w, batch, n)
        elif fate == "swap" and held[w] is None:
            held[w] = (batch, n)
        else:
            deliver(w, batch, n)
            if held[w] is not None:
                deliver(w, *held[w])
                held[w] = None
        assert [ix.status(v) for v in range(3)] == [ref.status(v) for v in range(3)]
        for v in range(3):
            assert ix.blocks_of(v) == ref.held(v)
        for q in queries:
            assert ix.overlap(q).tolist() == ref.overlap(q)
    for w, pc in enumerate(caches):
        pc.take_events()
        seqs[w] += 1
        ix.apply_snapshot(w, pc.snapshot_events(), seq=seqs[w])
    for w, pc in enumerate(caches):
        assert ix.status(w) == "exact"
        assert ix.blocks_of(w) == sorted(pages_of(pc.snapshot_events()))
        for q in queries + [s for _, s, _, _, _ in ops]:
            assert ix.overlap(q)[w] == pc.match_length(q)
    for w, q, _, _, _ in ops[:5]:                    # and reliable events keep it exact
        try:
            caches[w].insert(q)
        except rs.CacheFullError:
            pass
        seqs[w] += 1
        ix.apply(w, caches[w].take_events(), seq=seqs[w])
        assert ix.status(w) == "exact"
        for qq in queries:
            assert ix.overlap(qq)[w] == caches[w].match_length(qq)


def test_an_interrupted_status_mode_apply_leaves_the_worker_degraded(monkeypatch):
    from radix_soa import router_index as RI

    ix = rs.RouterIndex(page_size=2, strict=False)
    ix.apply("w", [stored([1, 2])])
    real = RI.RouterIndex._apply_one
    calls = []

    def interrupted(self, *args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *args)

    monkeypatch.setattr(RI.RouterIndex, "_apply_one", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ix.apply("w", [stored([1, 2, 3, 4], cached=2), stored([1, 2, 3, 4, 5, 6], cached=4)])
    assert ix.status("w") == "degraded" and "interrupted" in ix.degraded["w"]
    assert ix.overlap([1, 2, 3, 4, 5, 6]).tolist() == [4]     # the first event applied
