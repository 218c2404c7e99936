"""The layout's limits and the input edges: refused in O(1) or one pass,
with a message naming the parameter, and nothing changed."""

import numpy as np
import pytest

import radix_soa as rs
from radix_soa import PrefixCache, RadixCache
from radix_soa._input.validate import MAX_SEQUENCE_TOKENS
from radix_soa.cli import main


def test_a_sequence_longer_than_a_node_can_hold_is_refused_before_anything_changes():
    rc, pc = RadixCache(), PrefixCache()
    huge = np.broadcast_to(np.int64(1), (MAX_SEQUENCE_TOKENS + 1,))  # no memory behind it
    for call in (lambda: rc.insert(huge), lambda: rc.insert(range(MAX_SEQUENCE_TOKENS + 1)),
                 lambda: pc.insert(huge, values=huge), lambda: rc.exists(huge)):
        with pytest.raises(OverflowError, match="2147483647"):
            call()
    assert rc.num_nodes == pc.num_nodes == 0 and rc.memory_report()["tokens_inserted"] == 0


@pytest.mark.parametrize("call", ["insert", "exists", "match_prefix"])
def test_huge_ranges_are_refused_at_once(call):
    rc = RadixCache()
    for r in (range(2**63 + 5), range(2**63 - 2, 2**63 + 2), range(-2**63 - 1, -2**63 + 1)):
        with pytest.raises(OverflowError):
            getattr(rc, call)(r)
    assert rc.num_nodes == 0


def test_ranges_are_tokens():
    rc = RadixCache()
    rc.insert(range(10, 0, -3))
    assert rc.exists([10, 7, 4, 1]) and rc.exists(np.arange(10, 0, -3))


def test_a_batch_keeps_what_it_validated():
    flat = np.arange(10, dtype=np.int64)
    offsets = np.array([0, 4, 10])
    b = rs.Batch(flat, offsets)
    offsets[1] = 10**9  # the caller changes its array afterwards
    rc = RadixCache()
    rc.insert_batch(b)
    assert rc.exists_batch(b).tolist() == [True, True]
    assert np.shares_memory(b.flat, flat)  # still zero-copy for the tokens
    with pytest.raises(ValueError):
        b.offsets[0] = 1  # read-only


def test_a_pair_of_arrays_is_always_csr():
    flat, off = np.array([5, 6, 7]), np.array([0, 3])
    assert rs.pack((flat, off)) == rs.csr(flat, off)
    assert len(rs.csr(flat, off)) == 1
    assert len(rs.pack([flat, off])) == 2  # a list: two sequences
    rc = RadixCache()
    rc.insert_batch((flat, off))
    assert rc.exists([5, 6, 7]) and not rc.exists([0, 3])
    with pytest.raises(ValueError, match="pass several sequences as a list"):
        rs.pack((np.array([1, 2]), np.array([5, 6])))


@pytest.mark.parametrize("bad, exc", [
    (np.ma.array([1, 2], mask=[False, True]), TypeError),
    (memoryview(b"ab"), TypeError),
    (b"ab", TypeError),
])
def test_containers_that_are_not_token_sequences(bad, exc):
    rc = RadixCache()
    with pytest.raises(exc):
        rc.insert(bad)
    assert rc.num_nodes == 0


@pytest.mark.parametrize("bad", [[True, False], [5, 6, True], [0, 1, np.bool_(False)],
                                 (1, 0, False)])
def test_bools_in_a_list_are_not_tokens_as_bool_arrays_are_not(bad):
    rc = RadixCache()
    pc = PrefixCache()
    with pytest.raises(TypeError, match="bool"):
        rc.insert(bad)
    with pytest.raises(TypeError, match="sequence 1: .*bool"):
        rc.insert_batch([[0, 1], bad])
    with pytest.raises(TypeError, match="bool"):
        rc.exists(bad)
    with pytest.raises(TypeError, match="values must .*bool"):
        pc.insert([4, 5, 6][:len(bad)], values=bad)
    with pytest.raises(TypeError, match="bool"):
        rc.insert(np.array([True, False]))  # the array rule the list rule matches
    assert rc.num_nodes == 0 and pc.total_tokens == 0
    # the tokens 0 and 1 themselves (a BOS id) stay ordinary tokens
    assert rc.insert([1, 0, 1]) and rc.insert_batch([[0], [1, 1]]).all()
    assert rc.exists([1, 0, 1]) and rc.exists(np.array([0]))


def test_handles_and_arguments_follow_one_rule():
    pc = PrefixCache()
    pc.insert([1, 2], values=[1, 2])
    with pytest.raises(TypeError, match="handle"):
        pc.lock(True)
    with pytest.raises(TypeError, match="capacity"):
        PrefixCache(capacity=True)
    with pytest.raises(OverflowError, match="capacity"):
        PrefixCache(capacity=2**100)
    with pytest.raises(OverflowError, match="page_size"):
        PrefixCache(page_size=2**100)
    with pytest.raises(TypeError, match="window"):
        rs.replay([[1, 2]], window=1.5)
    with pytest.raises(ValueError, match="threads"):
        rs.sweep([[1, 2]], [1, 2], threads=-1)
    with pytest.raises(OverflowError, match="num_tokens"):
        pc.evict(2**70)
    assert pc.total_tokens == 2


def test_a_window_wider_than_the_trace_costs_nothing():
    seqs = [[1, 2, 3], [1, 2], [4]]
    wide = rs.replay(seqs, schedule="lpm", window=10**12)
    assert wide.window == 10**12
    assert wide.hits.tolist() == rs.replay(seqs, schedule="lpm", window=3).hits.tolist()


@pytest.mark.parametrize("argv", [
    ["study", "--page-size", "99999999999999999999"],
    ["study", "--host-capacity", "99999999999999999999"],
    ["study", "--capacities", "1,99999999999999999999"],
    ["study", "--window", "1000000000000", "--points", "1", "--requests", "5"],
    ["study", "--points", "10000000000"],
    ["build", "--prompts", "10000000000000"],
    ["build", "--prompt-len", "-5"],
])
def test_the_command_line_refuses_huge_numbers_in_one_line(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    if code == 0:  # a huge window is legal: it is the whole trace
        assert argv[1] == "--window"
        return
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err


def test_a_handle_of_another_cache_is_refused():
    a, b = PrefixCache(), PrefixCache()
    for pc in (a, b):
        pc.insert([1, 2, 3], values=[1, 2, 3])
    h = a.match([1, 2, 3]).node
    assert b._s.tree.gen.tolist() == a._s.tree.gen.tolist()  # same ids and generations
    with pytest.raises(ValueError, match="live node of this cache"):
        b.lock(h)
    a.lock(h)
    a.unlock(h)
    import pickle
    c = pickle.loads(pickle.dumps(a))  # a copy answers the handles of what it copied
    c.lock(h)
    c.unlock(h)


def test_lock_counts_stop_at_their_limit_and_guard_locks_still_fit():
    from radix_soa._kernels.layout import LOCK_LIMIT
    pc = PrefixCache(capacity=8)
    pc.insert([1, 2, 3], values=[1, 2, 3])
    pc.insert([7, 8, 9], values=[7, 8, 9])
    h = pc.match([1, 2, 3]).node
    pc.lock(h)
    v = h & 0xFFFFFFFF
    s = pc._s
    s.lock[v] = s.own[v] = LOCK_LIMIT  # as if LOCK_LIMIT locks were held
    pc.check_invariants()
    with pytest.raises(OverflowError, match="locks"):
        pc.lock(h)
    assert s.lock[v] == LOCK_LIMIT and s.own[v] == LOCK_LIMIT
    # an insert under this path that must evict takes its own guard lock
    r = pc.insert([1, 2, 3, 4, 5, 6], values=[1, 2, 3, 4, 5, 6])
    assert r.cached == 3 and pc.total_tokens <= 8
    pc.check_invariants()
    pc.unlock(h)
    assert s.own[v] == LOCK_LIMIT - 1
