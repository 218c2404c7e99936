"""``RouterIndex``: built from events only, checked against the pure-Python
reference; bad events raise ``EventError`` and change nothing."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import radix_soa as rs
from radix_soa.baselines.router_reference import ReferenceRouterIndex, chain


def stored(tokens, page=2, cached=0, namespace=None):
    """The BlockStored a cache emits inserting ``tokens`` after ``cached`` of them."""
    h = chain(tokens, page, namespace)
    k = cached // page
    return rs.BlockStored(h[k:], h[k - 1] if k else None, list(tokens[cached:len(h) * page]),
                          page)


def snapshot(ix, queries):
    return (ix.workers, len(ix), {w: ix.blocks_of(w) for w in ix.workers},
            [ix.overlap(q).tolist() for q in queries])


QUERIES = [[1, 2, 3, 4, 5, 6], [1, 2, 9, 9], [7, 8], []]


def test_overlap_per_worker_and_the_worker_list():
    ix = rs.RouterIndex(page_size=2)
    assert ix.workers == [] and len(ix) == 0 and ix.overlap([1, 2]).tolist() == []
    ix.apply("a", [stored([1, 2, 3, 4])])
    ix.apply("b", [stored([1, 2, 3, 4, 5, 6]).to_dict()])
    assert ix.workers == ["a", "b"] and "a" in ix and len(ix) == 3
    assert ix.overlap([1, 2, 3, 4, 5, 6, 7]).tolist() == [4, 6]
    assert ix.overlap([1, 2, 3]).tolist() == [2, 2]          # whole pages only
    assert ix.overlap([1, 2], namespace="other").tolist() == [0, 0]
    assert ix.overlap_batch([[1, 2, 3, 4, 5, 6], [1, 2], [3, 4]]).tolist() == \
        [[4, 6], [2, 2], [0, 0]]


def test_removing_pages_and_workers_keeps_the_registration_order():
    ix = rs.RouterIndex(page_size=2)
    for w in "abc":
        ix.apply(w, stored([1, 2, 3, 4]))
    h = chain([1, 2, 3, 4], 2)
    ix.apply("b", [rs.BlockRemoved([h[1]])])
    assert ix.overlap([1, 2, 3, 4]).tolist() == [4, 2, 4]
    ix.remove_worker("a")
    assert ix.workers == ["b", "c"] and ix.overlap([1, 2, 3, 4]).tolist() == [2, 4]
    ix.apply("d", [stored([1, 2])])
    assert ix.workers == ["b", "c", "d"]                      # d reuses a's column, last
    ix.apply("c", [rs.AllBlocksCleared()])
    assert ix.overlap([1, 2, 3, 4]).tolist() == [2, 0, 2] and len(ix) == 1
    with pytest.raises(KeyError, match="'zz'"):
        ix.remove_worker("zz")


def test_more_than_64_workers_get_more_mask_words():
    ix = rs.RouterIndex(page_size=1)
    for w in range(150):
        ix.apply(w, stored(list(range(w % 7 + 1)), page=1))
    got = ix.overlap(list(range(10)))
    assert got.tolist() == [w % 7 + 1 for w in range(150)]
    ix.remove_worker(70)
    assert len(ix.workers) == 149 and ix.overlap([0, 1, 2, 3]).tolist() == \
        [min(w % 7 + 1, 4) for w in range(150) if w != 70]
    assert ix.overlap_batch([[0, 1], [5]]).shape == (2, 149)


@pytest.mark.parametrize("events, match", [
    ([stored([1, 2, 3, 4, 5, 6], cached=4)], "parent block .* is not held by worker 'a'"),
    ([stored([1, 2])], "held by worker 'a' already"),
    ([rs.BlockRemoved([12345])], "BlockRemoved of block 12345, which worker 'a' does not hold"),
    ([stored([1, 2, 3], page=3)], "block_size 3 but this index has page_size 2"),
    ([{"type": "BlockStored"}], "event 0: a BlockStored event needs"),
    # applied events are undone when a later one is bad
    ([stored([5, 6, 7, 8]), rs.BlockRemoved([chain([1, 2], 2)[0]]), rs.BlockRemoved([99])],
     "event 2: BlockRemoved of block 99"),
    ([rs.AllBlocksCleared(), stored([7, 8]), stored([7, 8, 1, 2], cached=4)], "event 2"),
])
def test_a_bad_event_raises_and_leaves_the_index_unchanged(events, match):
    ix = rs.RouterIndex(page_size=2)
    ix.apply("a", [stored([1, 2])])
    ix.apply("b", [stored([1, 2, 3, 4, 5, 6])])
    before = snapshot(ix, QUERIES)
    with pytest.raises(rs.EventError, match=match):
        ix.apply("a", events)
    assert snapshot(ix, QUERIES) == before
    with pytest.raises(rs.EventError):
        ix.apply("new", events if events[0] != stored([1, 2]) else [rs.BlockRemoved([1])])
    assert snapshot(ix, QUERIES) == before and "new" not in ix


def test_a_page_is_keyed_by_its_tokens_and_the_engines_hash_is_a_handle():
    # another worker names a's second page's hash for a first page [3, 4]:
    # keyed by its tokens, it is that page, not a's (whose hash it reuses)
    ix = rs.RouterIndex(page_size=2)
    ix.apply("a", [stored([1, 2, 3, 4])])
    h = chain([1, 2, 3, 4], 2)
    ix.apply("b", [rs.BlockStored([h[1]], None, [3, 4], 2)])
    assert ix.overlap([1, 2, 3, 4]).tolist() == [4, 0]
    assert ix.overlap([3, 4]).tolist() == [0, 2]
    ix.apply("b", [rs.BlockRemoved([h[1]])])  # b's handle resolves to b's page
    assert ix.overlap([3, 4]).tolist() == [0, 0] and ix.overlap([1, 2, 3, 4]).tolist() == [4, 0]
    # keyed by the engine's hash (the fallback form), the same event is refused
    keyed = rs.RouterIndex(page_size=2, event_hash="sha256_cbor", event_hash_seed="0")
    keyed.apply("a", [rs.BlockStored([5, 6], None, [1, 2, 3, 4], 2)])
    with pytest.raises(rs.EventError, match="another parent"):
        keyed.apply("b", [rs.BlockStored([6], None, [3, 4], 2)])


def test_bad_arguments():
    with pytest.raises(ValueError, match="page_size"):
        rs.RouterIndex(page_size=0)
    ix = rs.RouterIndex()
    for bad in ([1], None, float("nan"), 1.0, True, np.float64("nan"), (1, [2]), (float("nan"),),
                b"w"):
        for call in (lambda: ix.apply(bad, [rs.AllBlocksCleared()]), lambda: ix.apply(bad, []),
                     lambda: ix.add_worker(bad)):
            with pytest.raises(TypeError, match="worker id must be an int, a str or a tuple"):
                call()
        with pytest.raises(TypeError, match="worker id"):
            ix.remove_worker(bad)
        assert bad not in ix
    with pytest.raises(TypeError, match="workers must be an iterable"):
        rs.RouterIndex(workers=3)
    with pytest.raises(ValueError, match="twice"):
        rs.RouterIndex(workers=[1, np.int64(1)])
    with pytest.raises(TypeError, match="namespace"):
        ix.overlap([1], namespace=1.5)
    assert ix.workers == []


def test_a_nan_worker_id_never_adds_a_column():
    ix = rs.RouterIndex(page_size=2)
    for _ in range(3):
        with pytest.raises(TypeError):
            ix.apply(float("nan"), [stored([1, 2])])
    assert ix.workers == [] and len(ix) == 0 and ix.overlap([1, 2]).shape == (0,)


def test_registered_workers_in_order_whatever_order_their_events_come_in():
    caches = [rs.PrefixCache(page_size=2, events=True, values=False) for _ in range(4)]
    for w, pc in enumerate(caches):
        pc.insert(list(range(2 * w + 2)))
    ix = rs.RouterIndex(page_size=2, workers=range(4))
    for w in (3, 1, 2):  # worker 0 sends nothing: registered, and holding nothing
        ix.apply(w, caches[w].take_events())
    q = list(range(10))
    assert ix.workers == [0, 1, 2, 3]
    assert ix.overlap(q).tolist() == [0] + [caches[w].match_length(q) for w in (1, 2, 3)]
    assert ix.overlap_scores(q) == {0: 0, 1: 4, 2: 6, 3: 8}
    assert ix.overlap_batch([q, []]).tolist() == [[0, 4, 6, 8], [0, 0, 0, 0]]
    # an empty apply registers; add_worker of a known one keeps its place
    ix.apply("late", [])
    ix.add_worker(np.int64(1))
    ix.add_worker(("gpu", 0))
    assert ix.workers == [0, 1, 2, 3, "late", ("gpu", 0)] and ix.blocks_of("late") == []
    assert ix.overlap_scores(q) == {0: 0, 1: 4, 2: 6, 3: 8, "late": 0, ("gpu", 0): 0}
    ix.remove_worker(1)
    ix.add_worker(9)
    assert ix.workers == [0, 2, 3, "late", ("gpu", 0), 9]
    assert ix.overlap(q).tolist() == [0, 6, 8, 0, 0, 0]
    assert list(ix.overlap_scores(q)) == ix.workers


def test_a_worker_whose_first_events_fail_is_not_registered():
    ix = rs.RouterIndex(page_size=2)
    with pytest.raises(rs.EventError):
        ix.apply("w", [rs.BlockRemoved([5])])
    assert "w" not in ix and ix.workers == [] and ix.overlap_scores([1, 2]) == {}


@settings(max_examples=40, deadline=None)
@given(page=st.sampled_from([1, 2, 4]),
       ops=st.lists(st.tuples(st.integers(0, 4), st.lists(st.integers(0, 2), max_size=10),
                              st.sampled_from(["insert", "evict", "reset", "remove"])),
                    max_size=30))
def test_the_index_equals_the_reference_on_event_streams(page, ops):
    caches = {}
    ix, ref = rs.RouterIndex(page_size=page), ReferenceRouterIndex(page)
    for w, seq, kind in ops:
        pc = caches.setdefault(w, rs.PrefixCache(capacity=10, page_size=page, events=True,
                                                 values=False))
        if kind == "insert":
            try:
                pc.insert(seq)
            except rs.CacheFullError:  # its own cached path leaves no room: nothing changed
                pass
        elif kind == "evict":
            pc.evict(len(seq))
        elif kind == "reset":
            pc.reset()
        elif w in ix.workers:
            pc.take_events()
            ix.remove_worker(w)
            ref.remove_worker(w)
            caches[w] = rs.PrefixCache(capacity=10, page_size=page, events=True, values=False)
            continue
        events = pc.take_events()
        ix.apply(w, events)
        ref.apply(w, events)
        assert ix.workers == ref.workers and len(ix) == len(ref)
        assert ix.overlap(seq).tolist() == ref.overlap(seq)
        for other in ix.workers:
            assert ix.overlap(seq)[ix.workers.index(other)] == caches[other].match_length(seq)
    qs = [seq for _, seq, _ in ops] or [[]]
    assert ix.overlap_batch(qs).tolist() == [ref.overlap(q) for q in qs]
    assert np.asarray(ix.overlap_batch(qs)).dtype == np.int64


def test_an_index_pickles_and_copies_with_a_lock_of_its_own():
    import copy
    import pickle

    pc = rs.PrefixCache(page_size=2, events=True)
    pc.insert([1, 2, 3, 4], values=[0, 0, 0, 0])
    ix = rs.RouterIndex(page_size=2)
    ix.apply(7, pc.take_events())
    copies = [pickle.loads(pickle.dumps(ix)), copy.deepcopy(ix)]
    pc.insert([1, 2, 5, 6], values=[0, 0, 0, 0])
    later = pc.take_events()
    for other in copies:
        assert other.overlap([1, 2, 3, 9]).tolist() == ix.overlap([1, 2, 3, 9]).tolist() == [2]
        assert other._lock is not ix._lock
        other.apply(7, later)  # a copy takes events on its own
        assert other.overlap([1, 2, 5, 6]).tolist() == [4]
    assert ix.overlap([1, 2, 5, 6]).tolist() == [2]



def test_namespace_seeds_remembered_are_bounded_and_answers_unchanged():
    import radix_soa.router_index as ri

    pc = rs.PrefixCache(page_size=2, events=True, values=False)
    pc.insert([1, 2, 3, 4], namespace="kept")
    ix = rs.RouterIndex(page_size=2, workers=["a"])
    ix.apply("a", pc.take_events())
    for i in range(ri.SEEDS_KEPT + 50):  # a caller sending ever new namespaces
        assert ix.overlap([1, 2, 3, 4], namespace=f"n{i}").tolist() == [0]
    assert len(ix._seeds) <= ri.SEEDS_KEPT
    assert ix.overlap([1, 2, 3, 4], namespace="kept").tolist() == [4]
