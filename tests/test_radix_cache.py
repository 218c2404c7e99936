import numpy as np
import pytest

from radix_soa import RadixCache
from radix_soa.baselines.reference import ReferenceRadixTree

from naive import NaiveSequenceSet, splitmix_key_hash

I64 = np.iinfo(np.int64)


def snapshot(rc):
    """Everything observable about a cache, for 'unchanged' checks."""
    flat, off = rc.to_csr()
    return (len(rc), rc.num_nodes, rc.num_tokens, flat.tolist(), off.tolist())


def test_seed_example_verbatim():
    rc = RadixCache()                 # dtype=np.int64 by default; int32 allowed
    rc.insert([1, 2, 3, 4, 5])
    rc.insert([1, 2, 3, 9])           # shares [1, 2, 3]; the node splits after 3
    assert rc.exists([1, 2, 3, 4, 5])
    assert not rc.exists([1, 2, 3])   # an internal prefix, never inserted
    rc.insert([1, 2, 3]); assert rc.exists([1, 2, 3])
    assert [1, 2, 3] in rc
    assert len(rc) == 3
    assert rc.match_prefix([1, 2, 3, 4, 7]) == 4
    rc.remove([1, 2, 3, 9])
    with pytest.raises(KeyError):
        rc.remove([1, 2, 3, 9])
    # [1,2,3] (terminal) -> [4,5]
    assert rc.num_nodes == 2
    assert rc.num_tokens == 5
    assert [s.tolist() for s in rc] == [[1, 2, 3], [1, 2, 3, 4, 5]]
    rc.check_invariants()


def test_split_shares_prefix_once():
    rc = RadixCache()
    rc.insert([1, 2, 3, 4, 5])
    assert (rc.num_nodes, rc.num_tokens) == (1, 5)
    rc.insert([1, 2, 3, 9])
    assert (rc.num_nodes, rc.num_tokens) == (3, 6)
    rc.insert([7])
    assert (rc.num_nodes, rc.num_tokens) == (4, 7)
    rc.check_invariants()


def test_insert_returns_whether_new():
    rc = RadixCache()
    assert rc.insert([5, 6]) is True
    assert rc.insert([5, 6]) is False
    assert rc.insert(np.array([5, 6])) is False
    assert len(rc) == 1


def test_exists_needs_exact_terminal():
    rc = RadixCache()
    rc.insert([1, 2, 3, 4])
    assert not rc.exists([1, 2])
    assert not rc.exists([1, 2, 3, 4, 5])
    assert not rc.exists([2])
    assert not rc.exists([])
    assert rc.match_prefix([]) == 0
    assert rc.match_prefix([1, 2, 3, 4, 5]) == 4
    assert rc.match_prefix([1, 2, 8]) == 2
    assert rc.match_prefix([9]) == 0


@pytest.mark.parametrize("case", ["leaf_prune_then_merge", "merge_into_child", "unmark_branch"])
def test_remove_keeps_tree_canonical(case):
    rc = RadixCache()
    if case == "leaf_prune_then_merge":
        rc.insert([1, 2, 3, 4])
        rc.insert([1, 2, 5, 6])
        rc.remove([1, 2, 5, 6])
        assert (rc.num_nodes, rc.num_tokens) == (1, 4)
    elif case == "merge_into_child":
        rc.insert([1, 2])
        rc.insert([1, 2, 3, 4])
        rc.remove([1, 2])
        assert (rc.num_nodes, rc.num_tokens) == (1, 4)
    else:
        rc.insert([1, 2])
        rc.insert([1, 2, 3])
        rc.insert([1, 2, 4])
        rc.remove([1, 2])
        assert (rc.num_nodes, rc.num_tokens) == (3, 4)
    rc.check_invariants()


def test_merge_of_noncontiguous_spans_copies_and_stays_findable():
    rc = RadixCache()
    rc.insert([1, 2])               # span A
    rc.insert([1, 2, 3, 4])         # child span B lives elsewhere in the buffer
    rc.insert([1, 2, 9])
    rc.remove([1, 2, 9])            # [1,2] terminal with child [3,4]: no merge
    rc.remove([1, 2])               # merge A+B: not contiguous -> copied
    assert rc.exists([1, 2, 3, 4])
    assert (rc.num_nodes, rc.num_tokens) == (1, 4)
    rc.check_invariants()


def test_remove_everything_leaves_empty_tree_and_ids_are_reused():
    rc = RadixCache()
    seqs = [[i, j, k] for i in range(4) for j in range(3) for k in range(2)]
    for s in seqs:
        rc.insert(s)
    for s in seqs:
        rc.remove(s)
        rc.check_invariants()
    assert (len(rc), rc.num_nodes, rc.num_tokens) == (0, 0, 0)
    end = rc._s.node_end
    for s in seqs:
        rc.insert(s)
    assert rc._s.node_end == end  # freed ids were reused
    rc.check_invariants()


def test_full_int64_range():
    rc = RadixCache()
    seq = [I64.min, -1, 0, 1, I64.max]
    rc.insert(seq)
    rc.insert(np.array([I64.max, I64.min], np.int64))
    assert rc.exists(seq)
    assert rc.exists([I64.max, I64.min])
    assert rc.match_prefix([I64.min, -1, 0, 2]) == 3
    assert sorted(s.tolist() for s in rc) == sorted([seq, [I64.max, I64.min]])
    rc.check_invariants()


def test_uint64_array_within_range_is_accepted():
    rc = RadixCache()
    rc.insert(np.array([1, 2, I64.max], dtype=np.uint64))
    assert rc.exists([1, 2, I64.max])


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32])
def test_input_arrays_of_any_integer_dtype(dtype):
    rc = RadixCache()
    rc.insert(np.array([1, 2, 3], dtype=dtype))
    assert rc.exists([1, 2, 3])
    assert rc.exists(np.array([1, 2, 3], dtype=dtype))


def test_tuples_ranges_and_noncontiguous_arrays():
    rc = RadixCache()
    rc.insert((4, 5, 6))
    rc.insert(range(10, 20))
    big = np.arange(40)
    rc.insert(big[::2])
    assert rc.exists([4, 5, 6])
    assert rc.exists(list(range(10, 20)))
    assert rc.exists(list(range(0, 40, 2)))


@pytest.mark.parametrize("dtype, lo, hi", [
    (np.int32, -2**31, 2**31 - 1),
    (np.uint16, 0, 2**16 - 1),
    (np.int16, -2**15, 2**15 - 1),
])
@pytest.mark.slow
def test_narrow_dtypes_store_their_range_and_reject_the_rest(dtype, lo, hi):
    rc = RadixCache(dtype=dtype)
    assert rc.dtype == np.dtype(dtype)
    rc.insert([lo, 0, hi])
    assert rc.exists([lo, 0, hi])
    before = snapshot(rc)
    for bad in ([hi + 1], [1, lo - 1], np.array([0, hi + 1])):
        with pytest.raises(OverflowError):
            rc.insert(bad)
        assert snapshot(rc) == before
    # queries with out-of-range tokens are simply not found
    assert not rc.exists([hi + 1])
    assert rc.match_prefix([lo, 0, hi + 1]) == 2
    rc.check_invariants()


@pytest.mark.parametrize("dtype", [np.float64, np.uint64, "S3", object, np.bool_])
def test_unsupported_tree_dtype(dtype):
    with pytest.raises(TypeError):
        RadixCache(dtype=dtype)


BAD_INPUTS = [
    ([1, 2.5], TypeError),
    ([1, "a"], TypeError),
    ([None], TypeError),
    ([[1, 2], [3]], TypeError),
    ("abc", TypeError),
    (b"abc", TypeError),
    (3, TypeError),
    (None, TypeError),
    ({1, 2}, TypeError),
    (np.array([1.0, 2.0]), TypeError),
    (np.array([True, False]), TypeError),
    (np.array(["1"]), TypeError),
    (np.array([[1, 2], [3, 4]]), ValueError),
    (np.array(5), ValueError),
    ([2**63], OverflowError),
    ([-2**63 - 1], OverflowError),
    (np.array([2**63], dtype=np.uint64), OverflowError),
]


@pytest.mark.parametrize("bad, exc", BAD_INPUTS)
def test_bad_input_raises_and_changes_nothing(bad, exc):
    rc = RadixCache()
    rc.insert([1, 2, 3])
    rc.insert([1, 2, 4, 5])
    before = snapshot(rc)
    with pytest.raises(exc):
        rc.insert(bad)
    for call in (rc.exists, rc.match_prefix, rc.remove):
        with pytest.raises(exc):
            call(bad)
    assert snapshot(rc) == before
    rc.check_invariants()
    assert rc.exists([1, 2, 3]) and rc.exists([1, 2, 4, 5])


def test_empty_sequence():
    rc = RadixCache()
    rc.insert([1])
    before = snapshot(rc)
    with pytest.raises(ValueError):
        rc.insert([])
    with pytest.raises(ValueError):
        rc.insert(np.array([], np.int64))
    with pytest.raises(KeyError):
        rc.remove([])
    assert rc.exists([]) is False
    assert snapshot(rc) == before
    rc.check_invariants()


def test_growth_through_many_inserts_matches_reference():
    rng = np.random.default_rng(1)
    rc, ref = RadixCache(), ReferenceRadixTree()
    base = rng.integers(0, 5, size=200)
    for i in range(3000):
        cut = int(rng.integers(0, 200))
        seq = np.concatenate([base[:cut], rng.integers(0, 4, size=int(rng.integers(1, 6)))])
        assert rc.insert(seq) == ref.insert(seq)
    rc.check_invariants()
    assert (len(rc), rc.num_nodes, rc.num_tokens) == (len(ref), ref.num_nodes, ref.num_tokens)
    assert [tuple(s.tolist()) for s in rc] == list(ref)
    s = rc._s
    assert s.table.shape[0] > 64 and s.start.shape[0] > 16  # it grew


def test_iteration_yields_each_sequence_once_sorted():
    rc = RadixCache()
    seqs = [[3, 1], [1, 2, 3], [1], [1, 2], [2, 9, 9], [-5]]
    for s in seqs + seqs:
        rc.insert(s)
    assert [s.tolist() for s in rc] == sorted(seqs)
    assert all(isinstance(s, np.ndarray) and s.dtype == np.int64 for s in rc)


def test_iteration_of_narrow_dtype_returns_int64():
    rc = RadixCache(dtype=np.int32)
    rc.insert([1, -2])
    (s,) = list(rc)
    assert s.dtype == np.int64 and s.tolist() == [1, -2]


def test_check_invariants_names_broken_invariant():
    rc = RadixCache()
    rc.insert([1, 2, 3])
    rc.insert([1, 2, 4])
    rc._s.nchild[rc._s.root] += 1
    with pytest.raises(AssertionError, match="nchild"):
        rc.check_invariants()


def test_check_invariants_detects_unreachable_table_entry():
    rc = RadixCache()
    for i in range(10):
        rc.insert([i, i + 1])
    table = rc._s.table
    filled = np.flatnonzero(table != -1)
    table[filled[0]], table[filled[0] - 3] = -1, table[filled[0]]
    with pytest.raises(AssertionError):
        rc.check_invariants()


def test_matches_naive_model_on_small_alphabet():
    rng = np.random.default_rng(7)
    rc, model = RadixCache(), NaiveSequenceSet()
    for _ in range(600):
        seq = rng.integers(0, 3, size=int(rng.integers(1, 7))).tolist()
        op = rng.integers(0, 4)
        if op == 0 or len(model) == 0:
            assert rc.insert(seq) == model.insert(seq)
        elif op == 1:
            victim = sorted(model.seqs)[int(rng.integers(0, len(model)))]
            rc.remove(list(victim))
            model.remove(victim)
        elif op == 2:
            assert rc.exists(seq) == model.exists(seq)
        else:
            assert rc.match_prefix(seq) == model.match_prefix(seq)
        assert (len(rc), rc.num_nodes, rc.num_tokens) == (len(model), model.num_nodes,
                                                           model.num_tokens)
    rc.check_invariants()
    assert [tuple(s.tolist()) for s in rc] == model.sorted()


# ---------------------------------------------------------------- tag collisions

_splitmix_key_hash = splitmix_key_hash


# first tokens whose keys under root 0 share the table tag (the hash's high 32
# bits) and its low 6 bits, so in a table of at most 64 slots they also share
# a home: each is the other's false candidate (found by a search over 2*10^6)
COLLIDING = [(1220149, 1372781), (713934, 1084941)]


@pytest.mark.parametrize("a, b", COLLIDING)
@pytest.mark.parametrize("parallel", [False, True])
def test_keys_sharing_a_tag_and_a_home_are_told_apart(a, b, parallel):
    ha, hb = _splitmix_key_hash(0, a), _splitmix_key_hash(0, b)
    assert ha >> 32 == hb >> 32 and ha & 63 == hb & 63 and a != b
    rc = RadixCache()
    assert rc._s.root == 0
    rc.insert([a, 5, 6])
    assert rc._s.table.shape[0] <= 64
    queries = [[b, 5, 6], [b], [a, 5, 6], [a, 5], [b, 5, 6, 7]]
    assert rc.exists_batch(queries, parallel=parallel).tolist() == [False, False, True, False, False]
    assert [rc.exists(q) for q in queries] == [False, False, True, False, False]
    assert rc.match_length_batch(queries, parallel=parallel).tolist() == [0, 0, 3, 2, 0]
    assert [rc.match_length(q) for q in queries] == [0, 0, 3, 2, 0]
    assert rc.insert([b, 5, 6])
    assert rc.exists_batch(queries, parallel=parallel).tolist() == [True, False, True, False, False]
    assert rc.match_length_batch(queries, parallel=parallel).tolist() == [3, 1, 3, 2, 3]
    rc.check_invariants()
    rc.remove([a, 5, 6])
    assert len(rc) == 1
    assert rc.exists_batch(queries, parallel=parallel).tolist() == [True, False, False, False, False]
    assert [rc.match_length(q) for q in queries] == [3, 1, 0, 0, 3]
    rc.check_invariants()
