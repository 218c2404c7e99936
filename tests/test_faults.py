"""Faults in the middle of a call: a ``MemoryError`` from the k-th allocation
of a growth, and a ``KeyboardInterrupt`` at every Python line radix_soa runs
during a call, for every k. After each, the cache must pass its invariants,
hold what it held before the call or what the call would have made (for a
batch: what it held plus a prefix of the batch), and take 1,000 more
inserts, every one stored."""

import pickle
import sys

import numpy as np
import pytest

import radix_soa as rs
from radix_soa import PrefixCache, RadixCache, _storage
from radix_soa._invariants import InvariantError

RNG = np.random.default_rng(7)
BASE = [RNG.integers(0, 5, size=int(n)).tolist() for n in RNG.integers(1, 12, size=30)]
LATER = [RNG.integers(0, 50, size=int(n)) for n in RNG.integers(1, 40, size=1000)]
BIG_BATCH = [RNG.integers(0, 7, size=int(n)) for n in RNG.integers(1, 60, size=120)]
LONG = RNG.integers(0, 3, size=700)


# ---------------------------------------------------------------- injectors

class InterruptAt:
    """Raise ``KeyboardInterrupt`` at the ``k``-th line executed in
    radix_soa's own Python code while active."""

    def __init__(self, k):
        self.k = k
        self.count = 0
        self.fired = False

    def _global(self, frame, event, arg):
        if frame.f_globals.get("__name__", "").startswith("radix_soa"):
            return self._local
        return None

    def _local(self, frame, event, arg):
        if event == "line" and not self.fired:
            self.count += 1
            if self.count == self.k:
                self.fired = True
                raise KeyboardInterrupt(f"injected at line step {self.k}")
        return self._local

    def __enter__(self):
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)
        return False


class FailAllocation:
    """Make the ``k``-th array the storage allocates raise ``MemoryError``."""

    def __init__(self, k, monkeypatch):
        self.k = k
        self.count = 0
        self.fired = False
        self.active = False
        self._real = _storage.allocate
        monkeypatch.setattr(_storage, "allocate", self._allocate)

    def _allocate(self, *args, **kwargs):
        if self.active:
            self.count += 1
            if self.count == self.k and not self.fired:
                self.fired = True
                raise MemoryError(f"injected at allocation {self.k}")
        return self._real(*args, **kwargs)

    def __enter__(self):
        self.active = True
        return self

    def __exit__(self, *exc):
        self.active = False
        return False


# ---------------------------------------------------------------- contents

def radix_contents(rc):
    flat, offsets = rc.to_csr()
    seqs = {tuple(flat[offsets[i]:offsets[i + 1]].tolist()) for i in range(len(offsets) - 1)}
    rep = rc.memory_report()
    return (frozenset(seqs), len(rc), rc.num_nodes, rc.num_tokens, rep["tokens_inserted"])


def prefix_contents(pc):
    """Everything observable of a PrefixCache, independent of array sizes and
    table layout: every live node (id, parent, span tokens and values,
    locks, stamp, generation), the LRU heap's members, counters and stats."""
    s = pc._s
    t = s.tree
    end = s.node_end
    nodes = []
    for v in range(end):
        L = int(t.length[v])
        if L < 0:
            continue
        a = int(t.start[v])
        vals = tuple(t.values[a:a + L].tolist()) if s.has_values else ()
        nodes.append((v, int(t.parent[v]), tuple(t.tokens[a:a + L].tolist()), vals,
                      int(t.lock[v]), int(t.own[v]), int(t.stamp[v]), int(t.gen[v])))
    heap = frozenset(t.heap[:s.count("heap_size")].tolist())
    counters = tuple(s.count(n) for n in ("nodes", "tokens", "heap_size", "locked_tokens",
                                           "clock", "roots", "tokens_inserted", "free_count"))
    namespaces = pc.namespaces  # re-reads the roots from the arrays when needed
    return (tuple(nodes), heap, counters, tuple(sorted(pc.stats.items())),
            tuple((ns, pc._roots[ns]) for ns in namespaces))


def check_radix_usable(rc, must_hold):
    rc.check_invariants()
    assert all(rc.exists(q) for q in must_hold)
    new = rc.insert_batch(LATER)
    assert rc.exists_batch(LATER).all() and len(new) == len(LATER)
    for q in LATER[:20]:
        rc.insert(np.concatenate([q, [99]]))
    assert all(rc.exists(np.concatenate([q, [99]])) for q in LATER[:20])
    rc.check_invariants()


def check_prefix_usable(pc, must_hold):
    pc.check_invariants()
    for q in must_hold:
        assert pc.match_length(q) == len(q) - len(q) % pc.page_size
    for q in LATER:
        pc.insert(q, values=np.arange(len(q)))
    assert all(pc.match_length(q) == len(q) for q in LATER)
    pc.check_invariants()


# ---------------------------------------------------------------- fixtures

def fresh_radix():
    rc = RadixCache()
    for q in BASE:
        rc.insert(q)
    for q in BASE[:6]:
        rc.remove(q)
    rc.insert(BASE[0])
    return rc


def fresh_prefix(capacity=None):
    pc = PrefixCache(capacity=capacity)
    for q in BASE:
        pc.insert(q, values=np.arange(len(q)) + 1000)
    m = pc.match(BASE[3])
    pc.lock(m.node)
    return pc


RADIX_OPS = {
    "insert": lambda rc: rc.insert(LONG),
    "insert_batch": lambda rc: rc.insert_batch(BIG_BATCH),
    "remove": lambda rc: rc.remove(BASE[7]),
    "compact": lambda rc: rc.compact(),
    "reserve": lambda rc: rc._s.reserve(tokens=5000, nodes=300),
}
PREFIX_OPS = {
    "insert": lambda pc: pc.insert(LONG, values=np.arange(len(LONG))),
    "insert_evicting": lambda pc: pc.insert(LONG[:60], values=np.arange(60), namespace="other"),
    "match": lambda pc: pc.match(list(BASE[9]) + [4, 4]),
    "match_batch": lambda pc: pc.match_batch(BIG_BATCH[:40]),
    "evict": lambda pc: pc.evict(25),
    "compact": lambda pc: pc.compact(),
}


def expected(make, op):
    """Contents before and after an uninterrupted ``op`` on a fresh cache."""
    obj = make()
    before = obj
    after = pickle.loads(pickle.dumps(obj))
    op(after)
    return before, after


def batch_outcomes(before_rc, batch):
    """The contents a batch insert may leave: what was there plus the first
    j sequences of the batch, for every j."""
    out = set()
    rc = pickle.loads(pickle.dumps(before_rc))
    out.add(radix_contents(rc)[:4])
    for q in batch:
        rc.insert(q)
        out.add(radix_contents(rc)[:4])
    return out


def faults(kind, monkeypatch):
    """Yield injectors for k = 1, 2, ... until one never fires."""
    k = 1
    while True:
        inj = InterruptAt(k) if kind == "interrupt" else FailAllocation(k, monkeypatch)
        yield inj
        if not inj.fired:
            return
        k += 1
        assert k < 5000, "the call never finished"


def run_faulted(inj, op, obj):
    exc = KeyboardInterrupt if isinstance(inj, InterruptAt) else MemoryError
    try:
        with inj:
            op(obj)
    except exc:
        assert inj.fired
        return True
    return False


# ---------------------------------------------------------------- tests

@pytest.mark.parametrize("kind", ["interrupt", "memory"])
@pytest.mark.parametrize("name", sorted(RADIX_OPS))
def test_radix_cache_survives_a_fault_at_every_step(name, kind, monkeypatch):
    op = RADIX_OPS[name]
    before, after = expected(fresh_radix, op)
    ok = {radix_contents(before), radix_contents(after)}
    batch_ok = batch_outcomes(before, BIG_BATCH) if name == "insert_batch" else None
    fired = 0
    for inj in faults(kind, monkeypatch):
        rc = fresh_radix()
        if run_faulted(inj, op, rc):
            fired += 1
        got = radix_contents(rc)
        if batch_ok is not None:
            assert got[:4] in batch_ok, f"{kind} at step {inj.k}: not a prefix of the batch"
        else:
            # tokens_inserted counts only what was stored, so it moves with the contents
            assert got in ok, f"{kind} at step {inj.k} left a half-changed tree"
        check_radix_usable(rc, [q for q in BASE[6:] if q != BASE[7]])
    if kind == "interrupt" or name != "remove":  # this remove merges in place: no growth
        assert fired > 0


@pytest.mark.parametrize("kind", ["interrupt", "memory"])
@pytest.mark.parametrize("name", sorted(PREFIX_OPS))
def test_prefix_cache_survives_a_fault_at_every_step(name, kind, monkeypatch):
    op = PREFIX_OPS[name]
    capacity = 200 if name == "insert_evicting" else None
    make = lambda: fresh_prefix(capacity)  # noqa: E731
    before, after = expected(make, op)
    ok = {prefix_contents(before), prefix_contents(after)}
    if name == "match_batch":  # an interrupted batch keeps a prefix of its matches
        for j in range(1, 40):
            part = pickle.loads(pickle.dumps(before))
            part.match_batch(BIG_BATCH[:j])
            ok.add(prefix_contents(part))
    fired = 0
    for inj in faults(kind, monkeypatch):
        pc = make()
        if run_faulted(inj, op, pc):
            fired += 1
        assert prefix_contents(pc) in ok, f"{kind} at step {inj.k} left a half-changed cache"
        if capacity is None:
            check_prefix_usable(pc, [BASE[3]])
        else:
            pc.check_invariants()
    if kind == "interrupt":
        assert fired > 0


def test_growth_failure_leaves_the_arrays_and_views_as_they_were(monkeypatch):
    rc = fresh_radix()
    tree = rc._s.tree
    with FailAllocation(3, monkeypatch) as inj:
        with pytest.raises(MemoryError):
            rc._s.reserve(tokens=10_000, nodes=1_000)
    assert inj.fired and rc._s.tree is tree
    rc.check_invariants()


def test_check_invariants_sees_kernel_views_that_are_not_the_storage(monkeypatch):
    rc = fresh_radix()
    s = rc._s
    grown = s.tree._replace(tokens=np.zeros(s.tokens.shape[0] * 2, s.dtype))
    s.tree = grown  # as if a growth had gone half-way: the kernels' tuple is the old one
    s.tokens = grown.tokens
    with pytest.raises(InvariantError, match="kernels' tree tuple"):
        rc.check_invariants(full=False)
    s.tokens = s.T[0]  # and the other way round
    with pytest.raises(InvariantError, match="array attribute"):
        rc.check_invariants(full=False)


def test_check_invariants_sees_per_node_arrays_of_different_lengths():
    pc = fresh_prefix()
    s = pc._s
    s._publish(s.tree._replace(stamp=np.zeros(s.start.shape[0] + 8, np.int64)))
    with pytest.raises(InvariantError, match="per-node array"):
        pc.check_invariants(full=False)


def test_an_interrupted_batch_keeps_a_prefix_and_can_be_finished():
    rc = RadixCache()
    with InterruptAt(400) as inj:
        try:
            rc.insert_batch(BIG_BATCH)
        except KeyboardInterrupt:
            pass
    assert inj.fired
    stored = rc.exists_batch(BIG_BATCH)
    first_missing = int(np.argmin(stored)) if not stored.all() else len(BIG_BATCH)
    assert all(any(np.array_equal(BIG_BATCH[j], BIG_BATCH[i]) for j in range(first_missing))
               for i in np.flatnonzero(stored) if i >= first_missing)
    rc.insert_batch(BIG_BATCH[first_missing:])
    assert rc.exists_batch(BIG_BATCH).all()
    rc.check_invariants()


def test_replay_after_a_memory_error_runs_again(monkeypatch):
    seqs = [LONG[: 100 + 3 * i] for i in range(50)]
    want = rs.replay(seqs, capacity=2000, host_capacity=1000)
    with FailAllocation(5, monkeypatch):
        with pytest.raises(MemoryError):
            rs.replay(seqs, capacity=2000, host_capacity=1000)
    again = rs.replay(seqs, capacity=2000, host_capacity=1000)
    assert again.hits.tolist() == want.hits.tolist()
