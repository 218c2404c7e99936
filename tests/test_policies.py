"""Eviction policies: each one's order on a small example worked out by hand
(SGLang's scoring), argument checks, persistence and the replay. The
stateful machine in test_prefix_cache compares every policy with the
reference at random."""

import numpy as np
import pytest

import radix_soa as rs
from radix_soa import PrefixCache, TreeFormatError
from radix_soa._kernels.layout import M_POLICY, POLICIES
from radix_soa.baselines.reference_prefix import ReferencePrefixCache


def scenario(cache):
    """[1,2,3] (priority 1, reached by two inserts), [5,6], then [1,2,3,4]
    and a match of [5,6]: leaves [4] and [5,6]; evict 2 tokens."""
    cache.insert([1, 2, 3], values=[1, 2, 3], priority=1)
    cache.insert([5, 6], values=[5, 6])
    cache.insert([1, 2, 3, 4], values=[1, 2, 3, 4])
    cache.match([5, 6])
    return cache.evict(2).values.tolist()


# by hand: ticks 1..4 for the four calls
EXPECTED = {
    "lru": [4, 3],       # [4] last used at 3, then [1,2,3] (3) before [5,6] (4)
    "lfu": [4, 6],       # [4] 1 hit, [5,6] 1 hit (newer), [1,2,3] 2 hits
    "fifo": [5, 6],      # created at 2, before [4] (3)
    "mru": [5, 6],       # used last (4)
    "filo": [4, 6],      # [4] created last (3), then [5,6] (2) before [1,2,3] (1)
    "priority": [4, 6],  # [4] and [5,6] priority 0, [1,2,3] 1
    "slru": [4, 6],      # [4], [5,6] probationary (1 insert), [1,2,3] protected (2)
}


def segments(cache):
    """[1] reached by 3 inserts, then [2] by 2, then [3] by 1: evict all."""
    for q in ([1], [1], [1], [2], [2], [3]):
        cache.insert(q, values=q)
    return cache.evict(3).values.tolist()


@pytest.mark.parametrize("policy, order", [
    ("lru", [1, 2, 3]),    # by last use
    ("lfu", [3, 2, 1]),    # by hit count
    ("slru", [3, 1, 2]),   # [3] probationary first; [1] and [2] protected, by last use
])
def test_slru_is_lru_within_two_segments(policy, order):
    assert segments(PrefixCache(eviction_policy=policy)) == order
    assert segments(ReferencePrefixCache(eviction_policy=policy)) == order


@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_evicts_in_its_order(policy):
    pc = PrefixCache(eviction_policy=policy)
    assert pc.eviction_policy == policy
    assert scenario(pc) == EXPECTED[policy]
    assert scenario(ReferencePrefixCache(eviction_policy=policy)) == EXPECTED[policy]
    pc.check_invariants()


def test_policy_and_priority_arguments_are_checked():
    with pytest.raises(ValueError, match="eviction_policy must be one of lru, lfu"):
        PrefixCache(eviction_policy="random")
    pc = PrefixCache(eviction_policy="priority")
    with pytest.raises(OverflowError, match="priority"):
        pc.insert([1], values=[1], priority=2**40)
    with pytest.raises(TypeError, match="priority"):
        pc.insert([1], values=[1], priority=1.5)
    with pytest.raises(ValueError, match="eviction_policy"):
        rs.replay([[1, 2]], eviction_policy="lifo")
    assert pc.total_tokens == 0


def test_the_policy_is_saved_and_checked_on_load(tmp_path):
    pc = PrefixCache(capacity=10, eviction_policy="mru")
    pc.insert([1, 2], values=[1, 2])
    pc.save(tmp_path / "t")
    assert PrefixCache.load(tmp_path / "t").eviction_policy == "mru"
    assert PrefixCache.load(tmp_path / "t", mmap=True).eviction_policy == "mru"
    pc.reset()
    assert pc.eviction_policy == "mru"

    from test_save_load import edit_array  # checksums recomputed: only the value is wrong

    edit_array(tmp_path / "t", "meta", lambda m: np.where(np.arange(len(m)) == M_POLICY, 9, m))
    with pytest.raises(TreeFormatError, match="eviction policy"):
        PrefixCache.load(tmp_path / "t")


def test_policies_change_what_a_replay_keeps():
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, 50, size=20)) for _ in range(30)]
    seqs = [prompts[int(i)] + [int(x)] for i, x in zip(rng.zipf(1.5, 600) % 30,
                                                          rng.integers(100, 200, 600))]
    rates = {p: rs.replay(seqs, capacity=200, eviction_policy=p).hit_rate for p in POLICIES}
    assert len(set(rates.values())) > 1  # the policy is really used
    assert rates["lru"] == rs.replay(seqs, capacity=200).hit_rate


def used_at_random(cache, seed):
    """64 leaves under the root, then 400 matches and re-inserts of them at
    random (each one a rise of a heap entry's key under most policies)."""
    rng = np.random.default_rng(seed)
    leaves = [[i, 1000 + i] for i in range(64)]
    for q in leaves:
        cache.insert(q, values=q)
    for i in rng.integers(0, 64, size=400):
        if rng.random() < 0.5:
            cache.match(leaves[int(i)])
        else:
            cache.insert(leaves[int(i)], values=leaves[int(i)])


def eviction_order(cache, leaves=64):
    return [cache.evict(2).values.tolist() for _ in range(leaves)]


@pytest.mark.parametrize("policy", POLICIES)
def test_leaves_used_again_are_evicted_in_the_policys_order(policy):
    # the heap leaves a risen key in place until its entry reaches the top:
    # the order must still be exactly the reference's
    pc, ref = PrefixCache(eviction_policy=policy), ReferencePrefixCache(eviction_policy=policy)
    used_at_random(pc, 1)
    used_at_random(ref, 1)
    pc.check_invariants()
    assert eviction_order(pc) == eviction_order(ref)
    pc.check_invariants()


@pytest.mark.parametrize("policy", ["lru", "lfu", "priority"])
def test_saving_a_heap_with_risen_keys_keeps_the_order(tmp_path, policy):
    import pickle

    pc = PrefixCache(eviction_policy=policy)
    used_at_random(pc, 2)
    heap_before = pc._s.heap.copy()
    pc.save(tmp_path / "t")
    assert np.array_equal(pc._s.heap, heap_before)  # saving moves nothing in the cache
    mapped = PrefixCache.load(tmp_path / "t", mmap=True)
    mapped.check_invariants()
    copies = [PrefixCache.load(tmp_path / "t"), pickle.loads(pickle.dumps(pc))]
    want = eviction_order(pc)
    for c in copies:
        c.check_invariants()
        assert eviction_order(c) == want


def test_an_access_under_lru_moves_no_heap_entry_until_it_reaches_the_top():
    pc = PrefixCache()
    for i in range(8):
        pc.insert([i], values=[i])
    heap = pc._s.heap[:8].copy()
    pc.match([0])  # the oldest leaf, at the top: its key rises in place
    assert np.array_equal(pc._s.heap[:8], heap)
    assert pc.evict(1).values.tolist() == [1]  # the top then moves down by its new key
    pc.check_invariants()


def test_a_heap_key_above_its_nodes_key_is_found():
    pc = PrefixCache()
    for i in range(4):
        pc.insert([i], values=[i])
    s = pc._s
    top = int(s.heap[0])
    s.hkey[top] = s.stamp[top] + 1
    with pytest.raises(rs.InvariantError, match="key is above"):
        pc.check_invariants()


def test_a_memory_mapped_load_counts_its_heap_keys_once(tmp_path):
    pc = PrefixCache()
    used_at_random(pc, 3)
    pc.save(tmp_path / "t")
    mapped = PrefixCache.load(tmp_path / "t", mmap=True)
    assert mapped._s.hkey is mapped._s.stamp  # read-only: the heap never moves
    copied = PrefixCache.load(tmp_path / "t")
    assert copied._s.hkey is not copied._s.stamp
    mapped_usage, copied_usage = mapped._s.array_usage(), copied._s.array_usage()
    assert "hkey" not in mapped_usage and "hkey" in copied_usage
    assert (sum(a["used_bytes"] for a in copied_usage.values())
            - sum(a["used_bytes"] for a in mapped_usage.values())) == 8 * copied._s.node_end


def test_a_writable_tree_whose_heap_keys_are_its_stamps_is_found():
    pc = PrefixCache()
    used_at_random(pc, 4)
    s = pc._s
    s._publish(s.tree._replace(hkey=s.tree.stamp))  # what only a read-only load may do
    with pytest.raises(rs.InvariantError, match="heap keys are an array of their own"):
        pc.check_invariants()
