"""Hypothesis tests: RadixCache against the brute-force model and the object
reference tree, with the invariants checked after every step."""

import pytest
import numpy as np
from hypothesis import given, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radix_soa import RadixCache
from radix_soa.baselines.reference import ReferenceRadixTree

from naive import NaiveSequenceSet

I64 = np.iinfo(np.int64)

# small alphabets force shared prefixes, splits and merges; extreme values
# exercise the full int64 range and the hash mixing
small_tokens = st.sampled_from([0, 1, 2, -1, I64.min, I64.max])
sequences = st.lists(small_tokens, min_size=1, max_size=12)
ops = st.lists(st.tuples(st.sampled_from(["insert", "remove", "exists", "match"]), sequences),
               max_size=60)


@given(ops, st.sampled_from(["list", "numpy"]))
def test_random_operation_sequences_match_model(operations, kind):
    rc, model = RadixCache(), NaiveSequenceSet()
    for op, seq in operations:
        arg = np.array(seq, dtype=np.int64) if kind == "numpy" else seq
        if op == "insert":
            assert rc.insert(arg) == model.insert(seq)
        elif op == "remove":
            if model.exists(seq):
                rc.remove(arg)
                model.remove(seq)
            else:
                try:
                    rc.remove(arg)
                    raise AssertionError("remove of an absent sequence must raise KeyError")
                except KeyError:
                    pass
        elif op == "exists":
            assert rc.exists(arg) == model.exists(seq)
        else:
            assert rc.match_prefix(arg) == model.match_prefix(seq)
        rc.check_invariants()
    assert (len(rc), rc.num_nodes, rc.num_tokens) == (len(model), model.num_nodes, model.num_tokens)
    assert [tuple(s.tolist()) for s in rc] == model.sorted()


@pytest.mark.slow
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=30), max_size=40),
       st.sampled_from([np.int64, np.int32, np.uint16, np.int8]))
def test_any_dtype_stores_the_same_tree(seqs, dtype):
    rc, ref = RadixCache(dtype=dtype), ReferenceRadixTree()
    for s in seqs:
        assert rc.insert(s) == ref.insert(s)
    rc.check_invariants()
    assert (len(rc), rc.num_nodes, rc.num_tokens) == (len(ref), ref.num_nodes, ref.num_tokens)
    for s in seqs:
        assert rc.exists(s)
        assert rc.match_prefix(s + [9]) == len(s)


class RadixCacheMachine(RuleBasedStateMachine):
    """Random inserts, removes, exists and match_prefix; the tree, the
    brute-force model and the object reference tree must agree throughout."""

    @initialize(dtype=st.sampled_from([np.int64, np.int32]))
    def setup(self, dtype):
        self.rc = RadixCache(dtype=dtype)
        self.model = NaiveSequenceSet()
        self.ref = ReferenceRadixTree()

    @rule(seq=st.lists(st.integers(-2, 2), min_size=1, max_size=15))
    def insert(self, seq):
        new = self.model.insert(seq)
        assert self.rc.insert(seq) == new
        assert self.ref.insert(seq) == new

    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data())
    def remove_stored(self, data):
        seq = list(data.draw(st.sampled_from(self.model.sorted())))
        self.rc.remove(np.array(seq))
        self.ref.remove(seq)
        self.model.remove(seq)

    @rule(seq=st.lists(st.integers(-2, 2), max_size=15))
    def remove_absent_is_keyerror(self, seq):
        if self.model.exists(seq):
            return
        try:
            self.rc.remove(seq)
        except KeyError:
            return
        raise AssertionError("KeyError expected")

    @rule(seq=st.lists(st.integers(-2, 2), max_size=15))
    def exists(self, seq):
        assert self.rc.exists(seq) == self.model.exists(seq) == self.ref.exists(seq)

    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data(), extra=st.lists(st.integers(-2, 2), max_size=4), cut=st.integers(0, 15))
    def match_near_stored(self, data, extra, cut):
        base = list(data.draw(st.sampled_from(self.model.sorted())))
        q = base[:cut] + extra
        assert self.rc.match_prefix(q) == self.model.match_prefix(q) == self.ref.match_prefix(q)

    @rule(bad=st.sampled_from([[], [1.5], [[1]], [2**63], "ab"]))
    def bad_insert_changes_nothing(self, bad):
        before = (len(self.rc), self.rc.num_nodes, self.rc.num_tokens)
        try:
            self.rc.insert(bad)
        except (TypeError, ValueError, OverflowError):
            pass
        else:
            raise AssertionError("bad input accepted")
        assert (len(self.rc), self.rc.num_nodes, self.rc.num_tokens) == before

    @invariant()
    def consistent(self):
        self.rc.check_invariants()
        assert len(self.rc) == len(self.model) == len(self.ref)
        assert self.rc.num_nodes == self.model.num_nodes == self.ref.num_nodes
        assert self.rc.num_tokens == self.model.num_tokens == self.ref.num_tokens

    def teardown(self):
        assert [tuple(s.tolist()) for s in self.rc] == self.model.sorted()


TestRadixCacheMachine = RadixCacheMachine.TestCase
TestRadixCacheMachine.pytestmark = [pytest.mark.slow]  # a few hundred random runs
