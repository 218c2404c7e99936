"""PrefixCache: each RadixAttention rule, and a stateful comparison with the
pure-Python ReferencePrefixCache (same semantics, object tree)."""

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radix_soa import CacheFullError, PrefixCache
from radix_soa._kernels.layout import POLICIES
from radix_soa.baselines.reference_prefix import ReferencePrefixCache


def state(pc):
    """Every array of the cache (the used parts) and its counters: equal
    states mean nothing observable changed."""
    s = pc._s
    end = s.node_end
    used = s.count("tok_used")
    arrays = [s.tokens[:used], s.values[:used], s.table, s.meta, s.heap[: s.count("heap_size")]]
    arrays += [getattr(s, n)[:end] for n in s.per_node_arrays if n != "heap"]
    return [a.copy() for a in arrays] + [dict(pc.stats), dict(pc._roots)]


def same_state(a, b):
    return all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y for x, y in zip(a, b))


# ---------------------------------------------------------------- values

def test_values_follow_tokens_and_first_writer_wins():
    pc = PrefixCache()
    r = pc.insert([1, 2, 3, 4], values=[10, 11, 12, 13])
    assert (r.cached, r.evicted.num_tokens) == (0, 0)
    r = pc.insert([1, 2, 3, 9, 9], values=[90, 91, 92, 93, 94])
    assert r.cached == 3  # the caller frees its slots 90, 91, 92
    m = pc.match([1, 2, 3, 9, 9, 7])
    assert m.length == 5 and m.values.tolist() == [10, 11, 12, 93, 94]
    assert pc.total_tokens == 6
    pc.check_invariants()


def test_cache_without_values_spends_nothing_on_them():
    pc = PrefixCache(values=False)
    pc.insert([1, 2, 3])
    assert pc.match([1, 2]).values is None
    assert pc.evict(3).values is None
    assert pc._s.values.nbytes == 0
    with pytest.raises(ValueError):
        pc.insert([4], values=[1])


@pytest.mark.parametrize("values, exc", [
    (None, ValueError), ([1, 2], ValueError), ([1, 2, 3, 4], ValueError),
    ([1.5, 2, 3], TypeError), ([2**63, 1, 1], OverflowError),
])
def test_bad_values_change_nothing(values, exc):
    pc = PrefixCache()
    pc.insert([5, 6], values=[1, 2])
    before = state(pc)
    with pytest.raises(exc):
        pc.insert([7, 8, 9], values=values)
    assert same_state(before, state(pc))


# ---------------------------------------------------------------- match

def test_match_splits_so_the_node_ends_at_the_match():
    pc = PrefixCache()
    pc.insert([1, 2, 3, 4, 5, 6], values=list(range(6)))
    assert pc.num_nodes == 1
    m = pc.match([1, 2, 3, 7])
    assert m.length == 3 and pc.num_nodes == 2 and pc.total_tokens == 6
    pc.lock(m.node)
    assert pc.locked_tokens == 3  # exactly the matched prefix
    pc.unlock(m.node)
    pc.check_invariants()


def test_empty_match_gives_the_root_handle():
    pc = PrefixCache()
    pc.insert([1, 2], values=[1, 2])
    m = pc.match([3, 4])
    assert m.length == 0 and m.values.tolist() == []
    pc.lock(m.node)  # locking the root protects nothing and is allowed
    assert pc.locked_tokens == 0
    pc.unlock(m.node)


def test_match_refreshes_recency():
    pc = PrefixCache()
    pc.insert([1, 1], values=[1, 1])
    pc.insert([2, 2], values=[2, 2])
    pc.match([1, 1])  # [1, 1] is now the most recent
    assert pc.evict(2).values.tolist() == [2, 2]


# ---------------------------------------------------------------- locks

def test_locks_protect_the_whole_path_and_count_references():
    pc = PrefixCache()
    pc.insert([1, 2, 3], values=[1, 2, 3])
    leaf = pc.insert([1, 2, 3, 4, 5], values=[1, 2, 3, 4, 5]).node
    pc.lock(leaf)
    pc.lock(leaf)
    assert pc.locked_tokens == 5 and pc.evictable_tokens == 0
    assert pc.evict(10).num_tokens == 0
    pc.unlock(leaf)
    assert pc.locked_tokens == 5
    pc.unlock(leaf)
    assert pc.locked_tokens == 0 and pc.evictable_tokens == 5
    with pytest.raises(ValueError):
        pc.unlock(leaf)
    pc.check_invariants()


def test_splitting_a_locked_node_keeps_both_parts_locked():
    pc = PrefixCache()
    node = pc.insert([1, 2, 3, 4], values=[1, 2, 3, 4]).node
    pc.lock(node)
    m = pc.match([1, 2, 9])
    assert m.length == 2
    assert pc.locked_tokens == 4
    pc.unlock(node)
    assert pc.locked_tokens == 0
    pc.check_invariants()


def test_stale_and_foreign_handles_are_rejected_without_change():
    pc = PrefixCache()
    node = pc.insert([1, 2], values=[1, 2]).node
    pc.evict(2)
    before = state(pc)
    for bad in (node, 12345, -1, 2**40):
        with pytest.raises(ValueError):
            pc.lock(bad)
        with pytest.raises(ValueError):
            pc.unlock(bad)
    with pytest.raises(TypeError):
        pc.lock("node")
    assert same_state(before, state(pc))
    # the freed id is reused, the old handle stays stale
    new = pc.insert([3, 4], values=[3, 4]).node
    assert new & 0xFFFFFFFF == node & 0xFFFFFFFF and new != node
    with pytest.raises(ValueError):
        pc.lock(node)


# ---------------------------------------------------------------- eviction

def test_evict_trims_the_lru_tail_page_by_page_and_no_more():
    pc = PrefixCache()
    pc.insert([1, 2, 3, 4, 5], values=[10, 20, 30, 40, 50])
    pc.insert([1, 2, 3, 7, 8], values=[10, 20, 30, 70, 80])
    e = pc.evict(1)  # LRU leaf is [4, 5]: its tail token goes
    assert (e.num_tokens, e.values.tolist()) == (1, [50])
    assert pc.match([1, 2, 3, 4, 5]).length == 4
    e = pc.evict(3)  # now [7, 8] is LRU: both; then [4]; its parent is no leaf
    assert e.values.tolist() == [70, 80, 40]
    assert pc.total_tokens == 3 and pc.num_nodes == 1
    e = pc.evict(100)  # fewer only if fewer are evictable
    assert e.values.tolist() == [10, 20, 30] and pc.total_tokens == 0
    pc.check_invariants()


def test_parent_becomes_a_candidate_when_its_last_child_goes():
    pc = PrefixCache()
    pc.insert([1, 2], values=[1, 2])
    pc.insert([1, 2, 3], values=[1, 2, 3])
    pc.insert([9], values=[9])  # newest
    # [3] is the LRU leaf; then its parent [1, 2] (stamp older than [9])
    assert pc.evict(3).values.tolist() == [3, 1, 2]  # each trim in token order


def test_evict_into_out_writes_the_values_in_place():
    pc = PrefixCache(page_size=2)
    pc.insert([1, 2, 3, 4], values=[10, 20, 30, 40])
    pool = np.full(6, -1, np.int64)
    e = pc.evict(1, out=pool[3:])  # one token rounds up to a page: room for 2
    assert e.num_tokens == 2 and e.values.tolist() == [30, 40]
    assert pool.tolist() == [-1, -1, -1, 30, 40, -1]
    assert np.shares_memory(e.values, pool)
    e = pc.evict(100, out=np.empty(2, np.int64))  # only 2 more are evictable
    assert e.values.tolist() == [10, 20] and pc.total_tokens == 0
    pc.check_invariants()


@pytest.mark.parametrize("out, exc, says", [
    ([0, 0, 0, 0], TypeError, "out must be a NumPy int64 array"),
    (np.zeros(4), ValueError, "1-D int64"),
    (np.zeros((2, 2), np.int64), ValueError, "1-D int64"),
    (np.zeros(8, np.int64)[::2], ValueError, "C-contiguous"),
    (np.zeros(4, np.int64), ValueError, "C-contiguous and writable"),  # made read-only below
    (np.zeros(1, np.int64), ValueError, "room for 1 values"),
])
def test_a_bad_evict_out_is_refused_and_changes_nothing(out, exc, says):
    pc = PrefixCache()
    pc.insert([1, 2, 3], values=[7, 8, 9])
    if says == "C-contiguous and writable":
        out.flags.writeable = False
    before = state(pc)
    with pytest.raises(exc, match=says):
        pc.evict(2, out=out)
    assert same_state(before, state(pc))


def test_a_cache_without_values_takes_no_evict_out():
    pc = PrefixCache(values=False)
    pc.insert([1, 2, 3])
    with pytest.raises(ValueError, match="keeps no values"):
        pc.evict(2, out=np.zeros(2, np.int64))
    assert pc.total_tokens == 3
    assert pc.evict(2).num_tokens == 2


def test_negative_evict_is_an_error():
    pc = PrefixCache()
    with pytest.raises(ValueError):
        pc.evict(-1)
    with pytest.raises(TypeError):
        pc.evict(1.5)


# ---------------------------------------------------------------- capacity

def test_capacity_evicts_lru_before_inserting():
    pc = PrefixCache(capacity=6)
    pc.insert([1, 2, 3], values=[1, 2, 3])
    pc.insert([4, 5, 6], values=[4, 5, 6])
    r = pc.insert([7, 8], values=[7, 8])
    assert r.evicted.values.tolist() == [2, 3]
    assert pc.total_tokens == 6
    pc.check_invariants()


def test_capacity_never_evicts_the_path_being_extended():
    pc = PrefixCache(capacity=5)
    pc.insert([1, 2, 3], values=[1, 2, 3])   # oldest
    pc.insert([9, 9], values=[9, 9])
    r = pc.insert([1, 2, 3, 4, 5], values=[0, 0, 0, 4, 5])
    assert r.cached == 3 and r.evicted.values.tolist() == [9, 9]
    assert pc.match([1, 2, 3, 4, 5]).values.tolist() == [1, 2, 3, 4, 5]


def test_cache_full_error_changes_nothing():
    pc = PrefixCache(capacity=4)
    node = pc.insert([1, 2, 3], values=[1, 2, 3]).node
    pc.lock(node)
    before = state(pc)
    with pytest.raises(CacheFullError):
        pc.insert([5, 6], values=[5, 6])
    with pytest.raises(CacheFullError):
        pc.insert([5, 6, 7, 8, 9], values=[5, 6, 7, 8, 9], namespace="new")
    assert same_state(before, state(pc))
    pc.insert([5], values=[5])  # exactly fits
    pc.check_invariants()


# ---------------------------------------------------------------- pages

def test_pages_cache_match_and_evict_whole_pages():
    pc = PrefixCache(page_size=2)
    r = pc.insert([1, 2, 3, 4, 5], values=[1, 2, 3, 4, 5])
    assert pc.total_tokens == 4  # the trailing partial page is not stored
    assert pc.match([1, 2, 3, 9]).length == 2  # page [3, 9] differs
    assert pc.match([1, 2, 3]).length == 2  # a partial page is not matched
    pc.insert([1, 2, 7, 8], values=[1, 2, 7, 8])
    assert pc.num_nodes == 3  # split at the page boundary
    assert pc.evict(1).num_tokens == 2  # rounded up to a page
    assert r.cached == 0
    pc.check_invariants()


def test_siblings_may_share_a_first_token_within_pages():
    pc = PrefixCache(page_size=2)
    pc.insert([1, 2, 3, 4], values=[1, 2, 3, 4])
    pc.insert([1, 5, 6, 7], values=[1, 5, 6, 7])  # same first token, other page
    assert pc.num_nodes == 2
    assert pc.match([1, 5, 6, 7]).values.tolist() == [1, 5, 6, 7]
    pc.check_invariants()


# ---------------------------------------------------------------- namespaces

def test_namespaces_never_share_nodes_or_values():
    pc = PrefixCache()
    pc.insert([1, 2, 3], values=[1, 2, 3], namespace="lora-a")
    assert pc.match([1, 2, 3], namespace="lora-b").length == 0
    pc.insert([1, 2, 3], values=[7, 8, 9], namespace=5)
    assert pc.match([1, 2, 3], namespace=5).values.tolist() == [7, 8, 9]
    assert pc.match([1, 2, 3], namespace="lora-a").values.tolist() == [1, 2, 3]
    assert pc.total_tokens == 6 and pc.num_nodes == 2
    with pytest.raises(TypeError):
        pc.match([1], namespace=1.5)
    pc.check_invariants()


def test_eviction_is_one_lru_over_all_namespaces():
    pc = PrefixCache()
    pc.insert([1], values=[1], namespace="a")
    pc.insert([1], values=[2], namespace="b")
    pc.insert([1], values=[3], namespace="a")
    assert pc.evict(1).values.tolist() == [2]


# ---------------------------------------------------------------- batches, stats, input

def test_match_batch_equals_a_loop_of_match():
    seqs = [[1, 2, 3, 4], [1, 2, 5], [9], [1, 2, 3, 4, 5, 6], []]
    a, b = PrefixCache(page_size=2), PrefixCache(page_size=2)
    for pc in (a, b):
        pc.insert([1, 2, 3, 4, 5, 6], values=list(range(6)))
        pc.insert([1, 2, 5, 5], values=list(range(4)))
    loop = [a.match(s).length for s in seqs]
    assert b.match_batch(seqs).tolist() == loop
    assert a.stats == b.stats
    assert same_state(state(a)[:-2], state(b)[:-2])


def test_stats_count_lookups_hits_and_evictions():
    pc = PrefixCache()
    pc.insert([1, 2, 3, 4], values=[0] * 4)
    pc.match([1, 2, 9, 9])
    pc.match([5])
    pc.evict(1)
    st = pc.stats
    assert (st["lookups"], st["query_tokens"], st["hit_tokens"]) == (2, 5, 2)
    assert (st["inserted_tokens"], st["evicted_tokens"]) == (4, 1)
    assert st["hit_rate"] == pytest.approx(2 / 5)


@pytest.mark.parametrize("bad, exc", [([1.5], TypeError), ([2**63], OverflowError),
                                      (np.zeros((2, 2), np.int64), ValueError)])
def test_bad_tokens_change_nothing(bad, exc):
    pc = PrefixCache()
    pc.insert([1, 2], values=[1, 2])
    before = state(pc)
    with pytest.raises(exc):
        pc.insert(bad, values=[0] * len(bad))
    with pytest.raises(exc):
        pc.match(bad)
    assert same_state(before, state(pc))


@pytest.mark.slow
def test_narrow_dtype_overflow_changes_nothing():
    pc = PrefixCache(dtype=np.int32)
    pc.insert([1], values=[1])
    before = state(pc)
    with pytest.raises(OverflowError):
        pc.insert([2**31], values=[1])
    assert same_state(before, state(pc))


@pytest.mark.parametrize("kwargs", [dict(page_size=0), dict(capacity=-1), dict(page_size=1.5)])
def test_bad_construction(kwargs):
    with pytest.raises((ValueError, TypeError)):
        PrefixCache(**kwargs)


def test_memory_per_node_and_token():
    pc = PrefixCache()
    rng = np.random.default_rng(0)
    for _ in range(2000):
        toks = np.concatenate([[int(rng.integers(0, 50))], rng.integers(0, 1000, size=20)])
        pc.insert(toks, values=toks)
    usage = pc._s.array_usage()
    per_token = usage["tokens"]["used_bytes"] + usage["values"]["used_bytes"]
    rest = sum(a["used_bytes"] for a in usage.values()) - per_token
    assert per_token / pc.total_tokens <= 16 + 1e-9
    # 14 per-node fields (60 B) and the child table: 8 B entries, at most
    # 2 / 0.7 slots per node (the room ``table_size_for`` leaves)
    assert rest / pc.num_nodes < 60 + 8 * 2 / 0.7 + 1


# ---------------------------------------------------------------- against the reference

tokens = st.lists(st.integers(0, 3), min_size=0, max_size=10)


def ref_tokens(request, pc):
    """The tokens of the path ``request`` holds (its cached prefix; none
    when its node is gone)."""
    s = pc._s
    v = int(request._st[1])
    if not request.cached or s.length[v] <= 0 or s.gen[v] != request._st[2]:
        return []
    out = []
    while s.parent[v] >= 0:
        a = int(s.start[v])
        out[:0] = s.tokens[a:a + int(s.length[v])].tolist()
        v = int(s.parent[v])
    return out[:request.cached]


class PrefixCacheMachine(RuleBasedStateMachine):
    """Random inserts, matches, batches, locks, unlocks and evictions on the
    Numba cache and the object-tree reference: identical answers, and the
    invariants hold after every step."""

    @initialize(page=st.sampled_from([1, 1, 2, 3]), capacity=st.sampled_from([None, 12, 30]),
                values=st.booleans(), policy=st.sampled_from(POLICIES),
                inflight=st.booleans())
    def setup(self, page, capacity, values, policy, inflight):
        self.pc = PrefixCache(capacity=capacity, page_size=page, values=values,
                              eviction_policy=policy, count_inflight=inflight)
        self.ref = ReferencePrefixCache(capacity=capacity, page_size=page, values=values,
                                        eviction_policy=policy, count_inflight=inflight)
        self.handles = []  # (ours, reference) pairs
        self.requests = []  # open (ours, reference) request pairs
        self.values = values
        self.next_value = 0

    def refused_alike(self, error, call):
        """The reference refused a call with ``error``: ours must raise it
        too and change nothing."""
        before = state(self.pc)
        with pytest.raises(error):
            call()
        assert same_state(before, state(self.pc))

    def _vals(self, toks):
        if not self.values:
            return None
        v = list(range(self.next_value, self.next_value + len(toks)))
        self.next_value += len(toks)
        return v

    @rule(toks=tokens, ns=st.sampled_from([0, "x"]), priority=st.integers(-2, 2))
    def insert(self, toks, ns, priority):
        vals = self._vals(toks)
        try:
            ref = self.ref.insert(toks, values=vals, namespace=ns, priority=priority)
        except CacheFullError:
            self.refused_alike(CacheFullError, lambda: self.pc.insert(
                toks, values=vals, namespace=ns, priority=priority))
            return
        ours = self.pc.insert(toks, values=vals, namespace=ns, priority=priority)
        assert ours.cached == ref.cached
        self.handles.append((ours.node, ref.node))

    @rule(toks=tokens, ns=st.sampled_from([0, "x"]))
    def match(self, toks, ns):
        ours, ref = self.pc.match(toks, namespace=ns), self.ref.match(toks, namespace=ns)
        assert ours.length == ref.length
        if self.values:
            assert ours.values.tolist() == list(ref.values)
        self.handles.append((ours.node, ref.node))

    @rule(batch=st.lists(tokens, max_size=5), with_values=st.booleans())
    def match_batch(self, batch, with_values):
        if not with_values:
            assert self.pc.match_batch(batch).tolist() == list(self.ref.match_batch(batch))
            return
        ours = self.pc.match_batch(batch, with_values=True)
        refs = [self.ref.match(toks) for toks in batch]  # the loop it must equal
        assert ours.lengths.tolist() == [m.length for m in refs]
        if self.values:
            assert [v.tolist() for v in ours.values] == [list(m.values) for m in refs]
        else:
            assert ours.values is None
        self.handles.extend(zip(ours.nodes.tolist(), [m.node for m in refs]))

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def lock(self, data):
        ours, ref = data.draw(st.sampled_from(self.handles))
        try:
            self.ref.lock(ref)
        except ValueError:
            with pytest.raises(ValueError):
                self.pc.lock(ours)
            return
        self.pc.lock(ours)

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def unlock(self, data):
        ours, ref = data.draw(st.sampled_from(self.handles))
        try:
            self.ref.unlock(ref)
        except ValueError:
            self.refused_alike(ValueError, lambda: self.pc.unlock(ours))
            return
        self.pc.unlock(ours)

    @rule(n=st.integers(0, 12), into_out=st.booleans())
    def evict(self, n, into_out):
        out = None
        if into_out and self.values:  # into the free end of a slot pool
            out = np.full(n + self.pc.page_size + 3, -7, np.int64)
        ours, ref = self.pc.evict(n, out=None if out is None else out[2:]), self.ref.evict(n)
        assert ours.num_tokens == ref.num_tokens
        if self.values:
            assert ours.values.tolist() == list(ref.values)
        if out is not None:  # written in place, and nowhere else
            assert np.shares_memory(ours.values, out) or ours.num_tokens == 0
            assert out[2:2 + ours.num_tokens].tolist() == list(ref.values)
            assert (out[:2] == -7).all() and (out[2 + ours.num_tokens:] == -7).all()

    # the request lifecycle
    @rule(toks=tokens, ns=st.sampled_from([0, "x", "y"]),
          reserve=st.one_of(st.none(), st.integers(0, 8)), priority=st.integers(-2, 2))
    def begin(self, toks, ns, reserve, priority):
        try:
            ref = self.ref.begin(toks, namespace=ns, reserve=reserve, priority=priority)
        except CacheFullError:
            self.refused_alike(CacheFullError, lambda: self.pc.begin(
                toks, namespace=ns, reserve=reserve, priority=priority))
            return
        ours = self.pc.begin(toks, namespace=ns, reserve=reserve, priority=priority)
        assert (ours.cached, ours.reserved) == (ref.cached, ref.reserved)
        assert ours.evicted.num_tokens == ref.evicted.num_tokens
        if self.values:
            assert ours.values.tolist() == list(ref.values)
            assert ours.evicted.values.tolist() == list(ref.evicted.values)
        self.requests.append((ours, ref))

    def _transition(self, data, name):
        i = data.draw(st.integers(0, len(self.requests) - 1))
        ours, ref = self.requests[i]
        # mostly the request's own tokens grown (or cut), sometimes anything
        toks = data.draw(st.one_of(
            tokens, st.builds(lambda cut, more: list(ref_tokens(ours, self.pc))[:cut] + more,
                              st.integers(0, 12), tokens)))
        vals = self._vals(toks)
        try:
            want = getattr(self.ref, name)(ref, toks, vals)
        except (CacheFullError, ValueError) as exc:
            self.refused_alike(type(exc), lambda: getattr(self.pc, name)(ours, toks, vals))
            assert ours.open
            return
        got = getattr(self.pc, name)(ours, toks, vals)
        if name == "finish":
            self.requests.pop(i)
            assert got.cached == want[0]
            assert got.evicted.num_tokens == want[3].num_tokens
            if self.values:
                assert got.evicted.values.tolist() == list(want[3].values)
            again = ours.result
            assert again.cached == got.cached and again.node == got.node
            assert (again.free is None) == (got.free is None)
            got, want = got.free, want[2]
            assert not ours.open
        assert (got is None) == (want is None)
        if want is not None:
            assert got.tolist() == list(want)
        assert (ours.cached, ours.reserved) == (ref.cached, ref.reserved)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def checkpoint(self, data):
        self._transition(data, "checkpoint")

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def finish(self, data):
        self._transition(data, "finish")

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def abort(self, data):
        ours, ref = self.requests.pop(data.draw(st.integers(0, len(self.requests) - 1)))
        self.ref.abort(ref)
        self.pc.abort(ours)
        assert not ours.open

    @invariant()
    def agree(self):
        self.pc.check_invariants()
        assert self.pc.inflight_tokens == self.ref.inflight_tokens
        assert len(self.pc.open_requests()) == len(self.requests)
        assert self.pc.total_tokens == self.ref.total_tokens
        assert self.pc.locked_tokens == self.ref.locked_tokens
        assert self.pc.evictable_tokens == self.ref.evictable_tokens
        assert self.pc.num_nodes == self.ref.num_nodes
        ours, ref = self.pc.stats, self.ref.stats
        assert all(ours[k] == ref[k] for k in ("lookups", "query_tokens", "hit_tokens",
                                               "inserted_tokens", "evicted_tokens"))


TestPrefixCacheMachine = PrefixCacheMachine.TestCase
TestPrefixCacheMachine.pytestmark = [pytest.mark.slow]  # a few hundred random runs


def test_every_array_form_matches_and_inserts_as_its_int64_copy():
    """``match`` and ``insert`` check a plain int64 array inline and every
    other array through ``as_tokens``: strided, big-endian, int32 and
    read-only arrays (tokens and values) give what their int64 copies
    give; 2-D and float arrays are refused and change nothing."""
    base = np.array([5, 6, 7, 8, 9, 10], np.int64)
    forms = [lambda a: a, lambda a: np.repeat(a, 2)[::2], lambda a: a.astype(">i8"),
             lambda a: a.astype(np.int32), lambda a: np.frombuffer(a.tobytes(), np.int64)]
    for ft in forms:
        for fv in forms:
            pc, ref = PrefixCache(page_size=2), PrefixCache(page_size=2)
            r = pc.insert(ft(base), values=fv(base + 100))
            assert r.cached == ref.insert(base.copy(), values=base + 100).cached
            pc.insert(ft(base[:3]), values=fv(base[:3]))  # cached: the old values stay
            m, want = pc.match(ft(base[:5])), ref.match(base[:5].copy())
            assert (m.length, m.values.tolist()) == (want.length, want.values.tolist()) \
                == (4, [105, 106, 107, 108])
            pc.check_invariants()
    pc = PrefixCache()
    pc.insert(base, values=base)
    before = state(pc)
    for bad, exc in ((base.reshape(2, 3), ValueError), (base.astype(float), TypeError)):
        with pytest.raises(exc):
            pc.insert(bad, values=base)
        with pytest.raises(exc):
            pc.insert(base, values=bad)
        with pytest.raises(exc):
            pc.match(bad)
    with pytest.raises(ValueError, match="values has 5 entries for 6 tokens"):
        pc.insert(base, values=base[:5])
    assert same_state(before, state(pc))
