"""``RouterIndex(max_bytes=...)``: the arrays stay inside the budget, the
pages queries walked least recently are forgotten first, forgetting only
ever lowers overlap (checked against the unbounded pure-Python reference),
the events about forgotten pages are not errors, and memory stays flat
under churn (``memory_report``'s own byte counts, no timing)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import radix_soa as rs
from radix_soa.baselines.router_reference import ReferenceRouterIndex, chain


def run(tokens, page=1, cached=0):
    h = chain(tokens, page)
    k = cached // page
    return rs.BlockStored(h[k:], h[k - 1] if k else None, list(tokens[cached:len(h) * page]),
                          page)


def chains(n, length, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1 << 40, size=length).tolist() for _ in range(n)]


def test_the_budget_is_kept_and_the_least_recently_queried_pages_go_first():
    ix = rs.RouterIndex(page_size=1, max_bytes=1 << 16)
    seqs = chains(60, 40)
    ix.apply("w", [run(seqs[0])])
    hot = seqs[0]
    for s in seqs[1:]:
        assert ix.overlap(hot).tolist() == [40]      # walked by a query each time
        ix.apply("w", [run(s)])
        rep = ix.memory_report()
        assert rep["bytes"] <= rep["max_bytes"] == 1 << 16
    rep = ix.memory_report()
    assert rep["forgotten_pages"] > 0 and rep["pages"] < 60 * 40
    assert ix.overlap(hot).tolist() == [40]           # the hot chain was never forgotten
    assert ix.overlap(seqs[-1]).tolist() == [40]      # the newest store is kept too
    assert ix.overlap(seqs[1]).tolist() == [0]        # the oldest cold one went
    assert rep["bytes_per_page"] == rep["bytes"] / rep["pages"]
    assert set(rep["arrays"]) >= {"keys", "pkeys", "flags", "masks", "stamps", "table"}
    assert sum(rep["arrays"].values()) == rep["bytes"]


def test_events_about_forgotten_pages_are_expected_not_errors():
    ix = rs.RouterIndex(page_size=1, max_bytes=1 << 14)  # strict: it would raise on a problem
    seqs = chains(40, 30, seed=1)
    for s in seqs:
        ix.apply("w", [run(s)])
    assert ix.memory_report()["forgotten_pages"] > 0
    first = chain(seqs[0], 1)
    assert ix.overlap(seqs[0]).tolist() == [0]
    ix.apply("w", [run(seqs[0] + [7, 7], cached=30)])  # under a forgotten page
    ix.apply("w", [rs.BlockRemoved(first)])            # removals of forgotten pages
    ix.apply("other", [run(seqs[1])])                  # stored again by another worker ...
    ix.apply("w", [rs.BlockRemoved(chain(seqs[1], 1))])  # ... then removed by the forgetter
    for s in seqs[2:]:
        ix.apply("w", [rs.BlockRemoved(chain(s, 1))])
    assert ix.blocks_of("w") == sorted(chain(seqs[0] + [7, 7], 1)[30:])
    # once every forgotten page is accounted for, a removal of an unheld page is an error again
    ix.apply("w", [rs.BlockRemoved(chain(seqs[0] + [7, 7], 1)[30:])])
    assert ix.blocks_of("w") == [] and int(ix._forgot[ix._cols["w"]]) == 0
    with pytest.raises(rs.EventError, match="does not hold"):
        ix.apply("w", [rs.BlockRemoved([12345])])


def test_a_run_larger_than_the_budget_keeps_its_head():
    ix = rs.RouterIndex(page_size=1, max_bytes=4096)
    cap = ix._node_budget()
    long = chains(1, 4 * cap, seed=2)[0]
    ix.apply("w", [run(long)])
    assert ix.overlap(long).tolist() == [cap] and len(ix) == cap
    assert ix.memory_report()["bytes"] <= 4096
    ix.apply("w", [rs.BlockRemoved(chain(long, 1))])  # the tail it never held is excused
    assert len(ix) == 0


def test_more_workers_narrow_the_rows_inside_the_same_budget():
    ix = rs.RouterIndex(page_size=1, max_bytes=1 << 15)
    for w in range(70):
        ix.apply(w, [run(chains(1, 30, seed=w)[0])])
    rep = ix.memory_report()
    assert rep["mask_words"] == 2 and rep["bytes"] <= 1 << 15 and rep["workers"] == 70
    assert ix.overlap(chains(1, 30, seed=69)[0])[69] == 30
    with pytest.raises(ValueError, match="max_bytes"):
        rs.RouterIndex(max_bytes=100)
    with pytest.raises(TypeError, match="max_bytes"):
        rs.RouterIndex(max_bytes=1.5e6)
    assert rs.RouterIndex().memory_report()["max_bytes"] is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 5), max_size=30),
                              st.sampled_from(["insert", "insert", "query", "evict", "reset"])),
                    max_size=40),
       strict=st.booleans())
def test_a_budgeted_index_never_invents_overlap(ops, strict):
    """Whatever it forgot, a budgeted index fed every event holds a subset
    of each worker's pages (the unbounded reference's), answers at most the
    worker's ``match_length``, stays in its budget, never raises in the
    strict mode and never degrades in the status mode."""
    caches = [rs.PrefixCache(capacity=200, page_size=1, events=True, values=False)
              for _ in range(3)]
    ix = rs.RouterIndex(page_size=1, max_bytes=4096, strict=strict, workers=range(3))
    ref = ReferenceRouterIndex(1, workers=range(3))
    for w, seq, kind in ops:
        pc = caches[w]
        if kind == "insert":
            pc.insert(seq)
        elif kind == "evict":
            pc.evict(len(seq))
        elif kind == "reset":
            pc.reset()
        else:
            got = ix.overlap(seq).tolist()
            want = ref.overlap(seq)
            assert all(g <= x for g, x in zip(got, want))
            assert want[w] == pc.match_length(seq)
        events = pc.take_events()
        ix.apply(w, events)
        ref.apply(w, events)
        assert ix.degraded == {}
        assert ix.memory_report()["bytes"] <= 4096
        for v in range(3):
            assert set(ix.blocks_of(v)) <= set(ref.held(v))
    for w, seq, _ in ops:
        assert all(g <= x for g, x in zip(ix.overlap(seq).tolist(), ref.overlap(seq)))


def steady_stream(steps, held, chain_len=16, live_chains=40, seed=0):
    """Stored/removed event batches per worker at a steady cached set: each
    step a worker stores a fresh chain (half of them under a prefix another
    worker holds too) and removes its oldest. ``held``: worker -> its
    chains as (tokens, page hashes), kept up to date."""
    rng = np.random.default_rng(seed)
    workers = len(held)
    for step in range(steps):
        w = step % workers
        tail = rng.integers(0, 1 << 40, size=chain_len).tolist()
        if step % 2 and held[(w + 1) % workers]:
            prefix = held[(w + 1) % workers][-1][0]  # another worker's chain's tokens
            tokens = prefix[:chain_len // 2] + tail[:chain_len // 2]
        else:
            tokens = tail
        hashes = chain(tokens, 1)
        mine = {h for _, hs in held[w] for h in hs}
        k = 0
        while k < len(hashes) and hashes[k] in mine:
            k += 1
        batch = [run(tokens, cached=k)] if k < len(hashes) else []
        held[w].append((tokens, hashes))
        if len(held[w]) > live_chains:
            _, old = held[w].pop(0)
            still = {h for _, hs in held[w] for h in hs}
            batch.append(rs.BlockRemoved([h for h in old if h not in still]))
        yield w, batch


@pytest.mark.parametrize("max_bytes", [None, 1 << 15])
def test_memory_stays_flat_under_churn_at_a_steady_cached_set(max_bytes):
    ix = rs.RouterIndex(page_size=1, max_bytes=max_bytes)
    held = {w: [] for w in range(4)}
    steps = 4000
    sizes, nodes = [], []
    events = 0
    for i, (w, batch) in enumerate(steady_stream(steps, held)):
        ix.apply(w, batch)
        events += len(batch)
        if i % 400 == 399:
            rep = ix.memory_report()
            sizes.append(rep["bytes"])
            nodes.append((rep["node_capacity"], rep["table_slots"]))
    assert events > 7000
    warm = sizes[2:]   # after the cached set reached its steady size
    assert max(warm) <= 1.1 * min(warm), sizes
    if max_bytes is None:
        assert len(set(nodes[2:])) == 1, nodes     # no array grew past the steady set
        for w in range(4):
            assert ix.blocks_of(w) == sorted({h for _, hs in held[w] for h in hs})
        assert len(ix) == len({h for w in range(4) for _, hs in held[w] for h in hs})
    else:
        assert max(sizes) <= max_bytes
