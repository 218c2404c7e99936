"""The serving-loop API of PrefixCache: the request lifecycle, peek, touch,
lock counts and the context manager, reset, namespaces, the text view and
the audit of cached values."""

import numpy as np
import pytest

from radix_soa import CacheFullError, PrefixCache


def test_peek_changes_nothing_and_returns_node_and_values():
    pc = PrefixCache()
    pc.insert([1, 2, 3, 4], values=[10, 11, 12, 13])
    before = (pc.num_nodes, pc.stats, pc._s.stamp.copy())
    m = pc.peek([1, 2, 3, 9])
    assert (m.length, m.values.tolist()) == (3, [10, 11, 12])
    assert (pc.num_nodes, pc.stats) == before[:2] and np.array_equal(pc._s.stamp, before[2])
    assert pc.lock(m.node) == 4  # the node the match ends in: it covers the match
    assert pc.evict(10).num_tokens == 0
    pc.unlock(m.node)
    miss = pc.peek([1, 2], namespace="nobody")
    assert miss.length == 0 and pc.namespaces == [0]
    assert pc.match([1, 2, 3, 9]) [:2] == (3, pc.match([1, 2, 3]).node)


def test_touch_refreshes_recency():
    pc = PrefixCache()
    a = pc.insert([1, 2], values=[1, 2]).node
    pc.insert([5, 6], values=[5, 6])
    pc.touch(a)  # now [5, 6] is the least recently used
    assert pc.evict(2).values.tolist() == [5, 6]
    pc.evict(2)
    with pytest.raises(ValueError, match="live node"):
        pc.touch(a)


def test_lock_counts_and_the_context_manager():
    pc = PrefixCache()
    h = pc.insert([1, 2, 3], values=[1, 2, 3]).node
    h2 = pc.insert([1, 2, 3, 4, 5], values=[1, 2, 3, 4, 5]).node
    assert pc.lock(h) == 3 and pc.lock(h2) == 2 and pc.lock(h) == 0
    assert pc.unlock(h) == 0 and pc.unlock(h2) == 2 and pc.unlock(h) == 3
    with pytest.raises(RuntimeError, match="boom"):
        with pc.locked(h2):
            assert pc.locked_tokens == 5
            raise RuntimeError("boom")
    assert pc.locked_tokens == 0
    pc.check_invariants()


def test_unknown_namespaces_are_never_created_by_lookups():
    pc = PrefixCache()
    pc.insert([1, 2], values=[1, 2])
    for tenant in range(1000):
        assert pc.match([1, 2], namespace=f"t{tenant}").length == 0
        assert pc.match_length([1, 2], namespace=tenant + 1) == 0
    pc.match_batch([[1, 2], [3]], namespace="batch")
    assert pc.namespaces == [0]
    assert pc.stats["lookups"] == 1002 and pc.stats["hit_tokens"] == 0
    assert pc.match([1, 2], namespace=None).length == 2  # None is the default namespace
    pc.insert([1, 2], values=[3, 4], namespace="t5")
    assert pc.namespaces == [0, "t5"]
    pc.check_invariants()


def test_drop_namespace_returns_its_values_and_keeps_the_others():
    pc = PrefixCache(page_size=2)
    rng = np.random.default_rng(4)
    kept = []
    for i in range(60):
        q = rng.integers(0, 4, size=int(rng.integers(2, 20)))
        ns = "a" if i % 2 else "b"
        pc.insert(q, values=np.arange(len(q)) + 1000 * i, namespace=ns)
        if ns == "b":
            kept.append(q)
    a_values = set(pc.cached_values().tolist())
    h = pc.match(kept[0], namespace="b").node
    pc.lock(h)
    with pytest.raises(ValueError, match="locked"):
        pc.drop_namespace("b")
    dropped = pc.drop_namespace("a")
    assert pc.namespaces == [0, "b"]
    assert set(dropped.values.tolist()) == a_values - set(pc.cached_values().tolist())
    assert dropped.num_tokens == len(dropped.values)
    for q in kept:
        assert pc.match_length(q, namespace="b") == len(q) - len(q) % 2
    pc.unlock(h)
    pc.check_invariants()
    assert pc.drop_namespace("never").num_tokens == 0
    pc.drop_namespace("b")
    pc.check_invariants()
    assert pc.total_tokens == 0 and pc.namespaces == [0]


def test_reset_and_reset_stats():
    pc = PrefixCache(capacity=100, page_size=2)
    h = pc.insert([1, 2, 3, 4], values=[1, 2, 3, 4], namespace="x").node
    pc.match([1, 2])
    pc.reset_stats()
    assert pc.stats["lookups"] == 0 and pc.total_tokens == 4
    pc.reset()
    assert pc.total_tokens == 0 and pc.namespaces == [0] and pc.stats["lookups"] == 0
    assert (pc.capacity, pc.page_size) == (100, 2)
    with pytest.raises(ValueError, match="live node"):
        pc.lock(h)  # handles of before the reset never match again
    pc.insert([1, 2], values=[5, 6])
    pc.check_invariants()


def test_values_for_the_whole_pages_only_are_accepted():
    pc = PrefixCache(page_size=4)
    assert pc.insert(list(range(10)), values=list(range(8))).cached == 0
    assert pc.match(list(range(10))).values.tolist() == list(range(8))
    with pytest.raises(ValueError, match="10 tokens; pass 10 or 8"):
        pc.insert(list(range(10)), values=list(range(9)))


def test_to_text_shows_spans_locks_and_namespaces():
    pc = PrefixCache()
    h = pc.insert(list(range(20)), values=[0] * 20, namespace="tenant").node
    pc.lock(h)
    text = pc.to_text(tokens_shown=3)
    assert "namespace 'tenant' (1 nodes, 20 tokens)" in text
    assert "[0, 1, 2, ... +17] len=20 lock=1" in text


def slot_pool_loop(pc, requests, output_len, pool_size):
    """A toy serving loop with a slot pool; returns the free slots left."""
    free = list(range(pool_size))
    for q in requests:
        r = pc.begin(q)
        need = len(q) - r.cached + output_len
        if need > len(free):
            free.extend(pc.evict(need - len(free)).values.tolist())
        assert need <= len(free)
        slots = np.concatenate([r.values, np.array([free.pop() for _ in range(need)], np.int64)])
        tokens = np.concatenate([q, 10_000 + np.arange(output_len)])
        done = pc.finish(r, tokens, slots)
        free.extend(done.free.tolist())
        free.extend(done.evicted.values.tolist())
        assert pc.locked_tokens == 0
    return free


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_serving_loop_neither_leaks_nor_double_frees_slots(page_size):
    rng = np.random.default_rng(page_size)
    prompts = [rng.integers(0, 3, size=int(rng.integers(3, 40))) for _ in range(20)]
    requests = [prompts[int(i)] for i in rng.integers(0, 20, size=300)]
    pool = 2000
    pc = PrefixCache(page_size=page_size)
    free = slot_pool_loop(pc, requests, output_len=5, pool_size=pool)
    held = pc.cached_values().tolist()
    assert len(held) + len(free) == pool
    assert sorted(held + free) == list(range(pool))
    pc.check_invariants()


def test_inflight_tokens_count_against_the_capacity():
    pc = PrefixCache(capacity=50, count_inflight=True)
    pc.insert(list(range(30)), values=list(range(30)))
    r1 = pc.begin(list(range(100, 120)))  # 20 in flight: 30 + 20 = 50
    assert r1.reserved == 20 and pc.inflight_tokens == 20 and r1.evicted.num_tokens == 0
    r2 = pc.begin(list(range(200, 210)))  # 10 more: 10 cached tokens must go
    assert r2.evicted.num_tokens == 10 and pc.total_tokens + pc.inflight_tokens == 50
    with pytest.raises(CacheFullError):
        pc.begin(list(range(300, 400)))  # 100 can never fit
    assert pc.inflight_tokens == 30 and pc.locked_tokens == 0
    done = pc.finish(r1, list(range(100, 120)), list(range(100, 120)))
    assert done.cached == 0 and pc.inflight_tokens == 10
    assert pc.total_tokens + pc.inflight_tokens <= 50
    pc.abort(r2)
    assert pc.inflight_tokens == 0
    with pytest.raises(ValueError, match="finished or aborted"):
        pc.finish(r2, [1], [1])
    pc.check_invariants()


def test_checkpoint_caches_a_chunk_and_moves_the_lock():
    pc = PrefixCache(page_size=2)
    pc.insert([1, 2, 3, 4], values=[1, 2, 3, 4])
    r = pc.begin([1, 2, 3, 4, 5, 6, 7])
    assert r.cached == 4
    free = pc.checkpoint(r, [1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 50, 60, 70])
    assert free.tolist() == [] and r.cached == 6  # 7 is a partial page: still the request's
    assert pc.locked_tokens == 6
    assert pc.evict(100).num_tokens == 0  # the new path is protected
    done = pc.finish(r, [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 50, 60, 70, 80])
    assert done.cached == 6 and done.free.tolist() == []
    assert pc.match([1, 2, 3, 4, 5, 6, 7, 8]).values.tolist() == [1, 2, 3, 4, 50, 60, 70, 80]
    assert pc.locked_tokens == 0
    pc.check_invariants()


def test_finish_frees_duplicates_cached_by_another_request():
    pc = PrefixCache()
    a = pc.begin([1, 2, 3])
    b = pc.begin([1, 2, 3])
    pc.finish(a, [1, 2, 3], [10, 11, 12])
    done = pc.finish(b, [1, 2, 3, 4], [20, 21, 22, 23])
    assert done.cached == 3 and done.free.tolist() == [20, 21, 22]
    assert pc.match([1, 2, 3, 4]).values.tolist() == [10, 11, 12, 23]


@pytest.mark.parametrize("capacity, page_size", [(None, 1), (150, 1), (120, 4), (40, 1)])
def test_insert_batch_is_a_loop_of_insert(capacity, page_size):
    rng = np.random.default_rng(7)
    seqs = [rng.integers(0, 4, size=int(rng.integers(1, 30))) for _ in range(200)]
    vals = [rng.integers(0, 10**6, size=len(q)) for q in seqs]
    one, many = PrefixCache(capacity, page_size), PrefixCache(capacity, page_size)
    one.lock(one.insert(seqs[0], values=vals[0]).node)
    many.lock(many.insert(seqs[0], values=vals[0]).node)  # a locked path: some cannot fit
    expected, evicted = [], []
    for q, v in zip(seqs, vals):
        try:
            r = one.insert(q, values=v)
        except CacheFullError:
            expected.append(-1)
            continue
        expected.append(r.cached)
        evicted.extend(r.evicted.values.tolist())
    cached, ev = many.insert_batch(seqs, values=vals)
    if capacity == 40:
        assert -1 in expected  # the locked path left some sequences no room
    assert cached.tolist() == expected and ev.values.tolist() == evicted
    assert ev.num_tokens == len(evicted)
    for q in seqs:
        assert many.match_length(q) == one.match_length(q)
    assert sorted(many.cached_values().tolist()) == sorted(one.cached_values().tolist())
    assert many.stats == one.stats
    many.check_invariants()


def test_insert_batch_validates_everything_first():
    pc = PrefixCache()
    with pytest.raises(ValueError, match="one value per token"):
        pc.insert_batch([[1, 2], [3]], values=[[1, 2], [3, 4]])
    with pytest.raises(TypeError):
        pc.insert_batch([[1, 2], [3.5]], values=[[1, 2], [3]])
    with pytest.raises(ValueError, match="pass values="):
        pc.insert_batch([[1, 2]])
    assert pc.total_tokens == 0


def test_the_guide_serving_example_prints_what_its_comments_say(capsys):
    # every python block of the guide runs in tests/test_readme.py; this one's
    # printed values are checked here
    from pathlib import Path

    page = Path(__file__).resolve().parent.parent / "docs" / "guide" / "prefix-cache.md"
    section = page.read_text()
    section = section[section.index("### A serving loop"):]
    block = section[section.index("```python\n") + 10:]
    exec(compile(block[:block.index("```")], str(page), "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "0 [112]" and out[-1] == "True"


def test_a_split_leaves_the_unmatched_lower_part_with_its_old_stamp():
    # The documented difference from SGLang, which stamps the child before
    # splitting it (so its unmatched lower part looks just used too): here
    # only the matched upper part is refreshed, so the lower part goes first.
    pc = PrefixCache()
    pc.insert([1, 2, 3, 4], values=[1, 2, 3, 4])
    pc.insert([7, 8], values=[7, 8])
    pc.match([1, 2, 9])  # splits [1, 2, 3, 4] into [1, 2] (stamped) and [3, 4] (not)
    assert pc.evict(2).values.tolist() == [3, 4]  # older than [7, 8]
    assert pc.evict(2).values.tolist() == [7, 8]


def test_requests_are_void_after_a_reset_and_survive_a_dropped_namespace():
    pc = PrefixCache(capacity=10, count_inflight=True)
    pc.insert([1, 2, 3], values=[1, 2, 3])
    r = pc.begin([1, 2, 3, 4])
    pc.reset()
    with pytest.raises(ValueError, match="before a reset"):
        pc.checkpoint(r, [1, 2, 3], [7, 8, 9])
    with pytest.raises(ValueError):
        pc.finish(r, [1, 2, 3], [7, 8, 9])
    assert pc.locked_tokens == 0 and pc.inflight_tokens == 0 and pc.total_tokens == 0
    with pytest.raises(ValueError, match="another cache"):
        PrefixCache().abort(pc.begin([5]))
    # a request that matched nothing holds the namespace root, which may be dropped
    pc.insert([9, 9], values=[0, 1], namespace="x")
    r = pc.begin([4, 4, 4], namespace="x", reserve=3)
    pc.drop_namespace("x")
    pc.abort(r)
    assert pc.inflight_tokens == 1  # only the request begun in the other cache's test above
    pc.check_invariants()


def test_dropping_the_default_namespace_empties_it_and_keeps_it():
    pc = PrefixCache()
    pc.insert([1, 2], values=[1, 2])
    pc.insert([1, 3], values=[5, 6], namespace="x")
    assert sorted(pc.drop_namespace(None).values.tolist()) == [1, 2]
    assert pc.namespaces == [0, "x"] and pc.match_length([1, 3], namespace="x") == 2
    pc.insert([1, 2], values=[1, 2])
    assert pc.lock(pc.match([1], namespace="unknown").node) == 0  # a root: nothing of "x"
    pc.check_invariants()


def test_a_bad_begin_or_priority_changes_nothing():
    pc = PrefixCache(count_inflight=True, eviction_policy="priority")
    pc.insert([1, 2, 3], values=[1, 2, 3])
    before = pc.stats
    with pytest.raises(ValueError, match="reserve"):
        pc.begin([1, 2, 3], reserve=-1)
    with pytest.raises(TypeError, match="priority"):
        pc.insert([4], values=[4], priority=None)
    assert pc.stats == before and pc.locked_tokens == 0 and pc.total_tokens == 3
    assert pc.insert_batch([], values=[], namespace="z")[0].tolist() == []
    assert pc.namespaces == [0]
    r = pc.begin([])
    assert pc.finish(r, [], []).cached == 0  # an empty request on a cache with values


def test_match_batch_with_values_is_a_loop_of_match_over_chunks():
    pa = pytest.importorskip("pyarrow", reason="chunked Arrow input needs the arrow extra")
    rng = np.random.default_rng(3)
    stored = [rng.integers(0, 3, size=int(rng.integers(1, 12))).tolist() for _ in range(40)]
    queries = [rng.integers(0, 3, size=int(rng.integers(0, 14))).tolist() for _ in range(60)]
    a, b = PrefixCache(page_size=2), PrefixCache(page_size=2)
    for i, q in enumerate(stored):
        for pc in (a, b):
            pc.insert(q, values=np.arange(len(q)) + 100 * i)
    chunked = pa.chunked_array([pa.array(queries[:25], pa.list_(pa.int64())),
                                pa.array(queries[25:], pa.list_(pa.int64()))])
    got = a.match_batch(chunked, with_values=True)
    loop = [b.match(q) for q in queries]
    assert got.lengths.tolist() == [m.length for m in loop]
    assert [v.tolist() for v in got.values] == [m.values.tolist() for m in loop]
    assert a.stats == b.stats and a.to_text() == b.to_text()
    # live handles of the same nodes a loop returns: locking them locks the same
    assert [a.lock(h) for h in got.nodes.tolist()] == [b.lock(m.node) for m in loop]
    assert a.to_text() == b.to_text()
    a.check_invariants()


def test_match_batch_with_values_under_an_unknown_namespace_and_without_values():
    pc = PrefixCache(values=False)
    pc.insert([1, 2, 3])
    got = pc.match_batch([[1, 2], [4]], with_values=True)
    assert got.lengths.tolist() == [2, 0] and got.values is None
    miss = pc.match_batch([[1, 2]], namespace="nobody", with_values=True)
    assert miss.lengths.tolist() == [0] and pc.namespaces == [0]
    assert pc.lock(int(miss.nodes[0])) == 0  # the root: a no-op
    pc.check_invariants()


def test_open_requests_lists_begun_requests_until_they_end():
    pc = PrefixCache()
    pc.insert([1, 2, 3], values=[1, 2, 3])
    r1, r2 = pc.begin([1, 2]), pc.begin([1, 2, 3, 4])
    assert pc.open_requests() == [r1, r2] and r1.steps == 1
    pc.finish(r1, [1, 2, 9], [1, 2, 9])
    assert pc.open_requests() == [r2] and r1.steps == 2 and r1.result.cached == 2
    pc.reset()
    assert pc.open_requests() == [] and not r2.open
    with pytest.raises(ValueError, match="reset"):
        pc.abort(r2)


def test_an_outside_unlock_of_a_requests_node_is_caught_not_double_released():
    pc = PrefixCache()
    pc.insert([1, 2, 3], values=[1, 2, 3])
    r = pc.begin([1, 2, 3])
    pc.unlock(r.node)  # takes the request's own lock away
    assert pc.locked_tokens == 0
    with pytest.raises(ValueError, match="no longer holds its lock"):
        pc.finish(r, [1, 2, 3], [1, 2, 3])
    assert r.open and pc.locked_tokens == 0
    pc.abort(r)  # still closes it, releasing nothing twice
    assert not r.open and pc.locked_tokens == 0
    pc.check_invariants()


def test_checkpoint_returns_the_slots_its_insert_evicted():
    pc = PrefixCache(capacity=6)
    pc.insert([7, 7, 7, 7], values=[70, 71, 72, 73])
    r = pc.begin([1, 2])
    free = pc.checkpoint(r, [1, 2, 3, 4], [10, 20, 30, 40])  # needs 2 of the 4 cached slots
    assert sorted(free.tolist()) == [72, 73]
    assert sorted(pc.cached_values().tolist()) == [10, 20, 30, 40, 70, 71]
    pc.check_invariants()


def test_a_begin_refused_for_room_changes_nothing():
    pc = PrefixCache(capacity=10, count_inflight=True)
    pc.insert([1, 2, 3, 4, 5], values=[1, 2, 3, 4, 5])
    held = pc.begin([1, 2, 3, 4, 5, 6, 7, 8])  # 5 locked, 3 reserved
    before = (pc.to_text(), pc.stats, pc.inflight_tokens)
    with pytest.raises(CacheFullError):
        pc.begin([1, 2, 9, 9, 9, 9, 9])  # would split [1..5] and reserve 5: only 2 are free
    assert (pc.to_text(), pc.stats, pc.inflight_tokens) == before
    assert pc.open_requests() == [held]
    pc.check_invariants()


def test_finish_and_checkpoint_take_values_for_the_whole_pages_only():
    pc = PrefixCache(page_size=4)
    r = pc.begin(list(range(10)))
    assert pc.checkpoint(r, list(range(6)), [50, 51, 52, 53]).tolist() == []  # 4 of 6: one page
    assert r.cached == 4
    other = pc.begin(list(range(4)) + [7, 7, 7, 7])
    pc.finish(other, list(range(4)) + [7, 7, 7, 7], [50, 51, 52, 53, 60, 61, 62, 63])
    # 8 of 10 tokens: two pages; the first is the request's own checkpoint
    done = pc.finish(r, list(range(10)), [50, 51, 52, 53, 104, 105, 106, 107])
    assert done.cached == 4 and done.free.tolist() == []
    assert pc.match(list(range(10))).values.tolist() == [50, 51, 52, 53, 104, 105, 106, 107]
    late = pc.begin([0, 1])  # found nothing beyond 0 pages: its slots for page 2 are duplicates
    done = pc.finish(late, list(range(8)), [80, 81, 82, 83, 84, 85, 86, 87])
    assert done.cached == 8 and done.free.tolist() == [80, 81, 82, 83, 84, 85, 86, 87]
    with pytest.raises(ValueError, match="pass 10 or 8"):
        pc.finish(pc.begin([1]), list(range(10)), list(range(9)))
    pc.check_invariants()


def test_requests_copied_with_their_cache_are_void():
    import pickle

    pc = PrefixCache(capacity=10, count_inflight=True)
    pc.insert([1, 2, 3], values=[1, 2, 3])
    r = pc.begin([1, 2, 3, 4, 5])
    pc2, r2 = pickle.loads(pickle.dumps((pc, r)))
    assert not r2.open and pc2.inflight_tokens == 0 and pc2.open_requests() == []
    with pytest.raises(ValueError, match="pickled or loaded"):
        pc2.finish(r2, [1, 2, 3, 4, 5], [1, 2, 3, 4, 5])
    assert pc2.locked_tokens == 3  # the saved lock stays, releasable by its handle
    assert pc2.unlock(r2.node) == 3
    pc2.check_invariants()
    assert r.open and pc.finish(r, [1, 2, 3, 4, 5], [1, 2, 3, 4, 5]).cached == 3
    pc.check_invariants()


def test_an_abort_has_no_result_even_after_a_refused_finish():
    pc = PrefixCache(capacity=4)
    pc.insert([1, 2], values=[1, 2])
    r = pc.begin([1, 2])
    with pytest.raises(CacheFullError):
        pc.finish(r, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6])  # the locked 2 + 4 new > 4
    assert r.open and r.steps == 1 and r.result is None
    pc.abort(r)
    assert r.steps == 2 and r.result is None and pc.locked_tokens == 0


def test_tokens_that_leave_the_requests_cached_prefix_are_refused():
    pc = PrefixCache(page_size=2)
    r = pc.begin([1, 2, 3, 4, 5])
    pc.checkpoint(r, [1, 2, 3, 4], [10, 11, 12, 13])
    before = pc.to_text()
    for tokens in ([1, 2, 3], [1, 2, 9, 9, 9]):  # shorter than, or diverging from, [1, 2, 3, 4]
        with pytest.raises(ValueError, match="cached"):
            pc.finish(r, tokens, list(range(len(tokens))))
        assert pc.to_text() == before and r.open
    done = pc.finish(r, [1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15])
    assert done.free.tolist() == [] and sorted(pc.cached_values().tolist()) == [10, 11, 12, 13,
                                                                                 14, 15]


@pytest.mark.parametrize("page_size", [1, 2])
def test_another_cached_path_as_long_is_not_the_requests_prefix(page_size):
    # the request holds [1]; [2] is cached as long: finishing or checkpointing
    # with [2, ...] must not pass as its prefix (a leaked slot, a moved lock)
    from radix_soa.baselines.reference_prefix import ReferencePrefixCache
    p = page_size
    for pc in (PrefixCache(page_size=p), ReferencePrefixCache(page_size=p)):
        pc.insert([1] * p, values=[458] * p)
        pc.insert([2] * p, values=[100] * p)
        r = pc.begin([1] * p + [7] * p)
        assert r.cached == p
        before = (pc.to_text() if isinstance(pc, PrefixCache) else None, pc.locked_tokens,
                  pc.total_tokens)
        other = [2] * p + [5] * p
        for call in (pc.checkpoint, pc.finish):
            with pytest.raises(ValueError, match="must start with the request's"):
                call(r, other, list(range(2 * p)))
            after = (pc.to_text() if isinstance(pc, PrefixCache) else None, pc.locked_tokens,
                     pc.total_tokens)
            assert after == before
        done = pc.finish(r, [1] * p + [7] * p, [458] * p + [9] * p)
        free = done.free if isinstance(pc, PrefixCache) else done[2]
        assert free.tolist() == []  # its locked prefix is its own, no duplicate
        assert pc.locked_tokens == 0 and pc.total_tokens == 3 * p


def test_results_do_not_alias_the_callers_values():
    pc = PrefixCache()
    pc.insert([1, 2], values=[1, 2])
    r = pc.begin([1])
    slots = np.array([7, 8, 9], np.int64)  # [1, 2] were cached by someone else: 8 is a duplicate
    done = pc.finish(r, [1, 2, 3], slots)
    slots[:] = -1  # the engine reuses its row
    assert done.free.tolist() == [8] and r.result.free.tolist() == [8]


def test_inflight_tokens_are_counted_without_a_capacity_too():
    pc = PrefixCache(count_inflight=True)
    r = pc.begin([1, 2, 3])
    assert r.reserved == 3 and pc.inflight_tokens == 3
    pc.finish(r, [1, 2, 3], [1, 2, 3])
    assert pc.inflight_tokens == 0


def test_a_requests_priority_reaches_its_inserts():
    pc = PrefixCache(eviction_policy="priority")
    high = pc.begin([1, 2], priority=2)
    pc.finish(high, [1, 2], [1, 2])
    low = pc.begin([3, 4])
    pc.finish(low, [3, 4], [3, 4])
    assert pc.evict(2).values.tolist() == [3, 4]  # the low one goes first, though newer
    with pytest.raises(TypeError, match="priority"):
        pc.begin([1], priority=0.5)
