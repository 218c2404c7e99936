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
from radix_soa import PrefixCache, RadixCache
from radix_soa._tree import storage as _storage
from radix_soa._tree.invariants import InvariantError

RNG = np.random.default_rng(7)
BASE = [RNG.integers(0, 5, size=int(n)).tolist() for n in RNG.integers(1, 12, size=30)]
LATER = [RNG.integers(0, 50, size=int(n)) for n in RNG.integers(1, 40, size=1000)]
BIG_BATCH = [RNG.integers(0, 7, size=int(n)) for n in RNG.integers(1, 60, size=120)]
LONG = RNG.integers(0, 3, size=700)


# ---------------------------------------------------------------- injectors

class InterruptAt:
    """Raise ``KeyboardInterrupt`` (or ``exc``) at the ``k``-th line executed
    in radix_soa's own Python code while active."""

    def __init__(self, k, exc=KeyboardInterrupt):
        self.k = k
        self.exc = exc
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
                raise self.exc(f"injected at line step {self.k}")
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
    requests = tuple((r.steps, r.cached, r.reserved, int(r._st[1]), int(r._st[3]))
                     for r in pc.open_requests())
    return (tuple(nodes), heap, counters, tuple(sorted(pc.stats.items())),
            tuple((ns, pc._roots[ns]) for ns in namespaces), pc.inflight_tokens, requests)


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


def fresh_prefix(capacity=None, events=False):
    pc = PrefixCache(capacity=capacity, events=events)
    for q in BASE:
        pc.insert(q, values=np.arange(len(q)) + 1000)
    pc.insert(BASE[5], values=np.arange(len(BASE[5])) + 3000, namespace="tenant")
    m = pc.match(BASE[3])
    pc.lock(m.node)
    return pc


SERVED = list(BASE[3]) + [1, 1]  # the open request of fresh_serving


def fresh_serving():
    """A capped cache counting in-flight tokens, with one open request (and
    its prefix locked) and room for 47 more tokens."""
    pc = PrefixCache(capacity=200, count_inflight=True)
    for q in BASE:
        pc.insert(q, values=np.arange(len(q)) + 1000)
    pc.begin(SERVED)
    return pc


def served(pc):
    return pc.open_requests()[0]


def finish_tokens(extra):
    q = SERVED + extra
    return q, np.arange(len(q)) + 5000


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
    "insert_batch": lambda pc: pc.insert_batch(BIG_BATCH[:30], values=BIG_BATCH[:30]),
    "drop_namespace": lambda pc: pc.drop_namespace("tenant"),
    "peek": lambda pc: pc.peek(list(BASE[9]) + [4, 4]),
    "touch": lambda pc: pc.touch(pc.peek(BASE[12]).node),
}
# the request lifecycle on fresh_serving(): begin evicts for its reservation,
# checkpoint and finish insert (evicting) and move or release the lock
SERVING_OPS = {
    "begin": lambda pc: pc.begin(LONG[:80]),
    "begin_unknown_namespace": lambda pc: pc.begin(LONG[:30], namespace="nobody"),
    "checkpoint": lambda pc: pc.checkpoint(served(pc), *finish_tokens([2, 2, 2])),
    "finish": lambda pc: pc.finish(served(pc), *finish_tokens(list(range(40)))),
    "abort": lambda pc: pc.abort(served(pc)),
}


def expected(make, op):
    """Contents before and after an uninterrupted ``op`` on a fresh cache
    (``make`` is deterministic; a copy would not keep the open requests)."""
    before = make()
    after = make()
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
    exc = inj.exc if isinstance(inj, InterruptAt) else MemoryError
    try:
        with inj:
            op(obj)
    except exc:
        assert inj.fired
        return True
    return False


# ---------------------------------------------------------------- tests

@pytest.mark.slow
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


@pytest.mark.slow
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
    if name == "insert_batch":  # ... and of its inserts
        for j in range(1, 30):
            part = pickle.loads(pickle.dumps(before))
            part.insert_batch(BIG_BATCH[:j], values=BIG_BATCH[:j])
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


EVENT_OPS = ["drop_namespace", "evict", "insert", "insert_batch", "insert_evicting"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["interrupt", "memory"])
@pytest.mark.parametrize("name", EVENT_OPS)
def test_events_stay_those_of_the_cache_after_a_fault_at_every_step(name, kind, monkeypatch):
    """With events on, a faulted call leaves the events of the state it left:
    those of the cache before the call, or after it (a batch: after a prefix
    of it), never a change without its event or an event without its change."""
    op = PREFIX_OPS[name]
    capacity = 200 if name == "insert_evicting" else None

    def make():  # its events taken: the call's log buffer is a new allocation
        pc = fresh_prefix(capacity, events=True)
        pc.take_events()
        return pc

    parts = [lambda pc: None, op]
    if name == "insert_batch":
        parts += [lambda pc, j=j: pc.insert_batch(BIG_BATCH[:j], values=BIG_BATCH[:j])
                  for j in range(1, 30)]
    ok = []
    for part in parts:
        pc = make()
        part(pc)
        ok.append((prefix_contents(pc), pc.take_events()))
    assert any(events for _, events in ok)
    fired = 0
    for inj in faults(kind, monkeypatch):
        pc = make()
        fired += run_faulted(inj, op, pc)
        got = (prefix_contents(pc), pc.take_events())
        assert got in ok, f"{kind} at step {inj.k}: the events are not those of the cache"
        pc.check_invariants()
    assert fired > 0


def event_history(pc, step):
    """Calls that queue every kind of event (stored, removed in an eviction
    and a namespace drop, cleared), in two steps."""
    if step == 0:
        for q in BASE:
            pc.insert(q, values=np.arange(len(q)))
        pc.insert(LONG[:90], values=np.arange(90), namespace="tenant")
        pc.evict(30)
        pc.drop_namespace("tenant")
        pc.reset()
    for q in BIG_BATCH[:12]:
        pc.insert(q, values=np.arange(len(q)))
    pc.insert_batch(BIG_BATCH[12:30], values=BIG_BATCH[12:30])
    pc.evict(40)


def make_history(event_hash="fast64"):
    pc = PrefixCache(capacity=300, page_size=2, events=True, event_hash=event_hash,
                     event_hash_seed="0")
    event_history(pc, 0)
    return pc


# sha256_cbor decodes in many more lines: every 11th of them, and the last ones
@pytest.mark.parametrize("exc,event_hash,stride", [(KeyboardInterrupt, "fast64", 1),
                                                   (MemoryError, "fast64", 1),
                                                   pytest.param(KeyboardInterrupt, "sha256_cbor",
                                                                11, marks=pytest.mark.slow)])
def test_take_events_loses_no_event_under_a_fault_at_every_step(exc, event_hash, stride):
    """``take_events`` interrupted at any line (or failing as an allocation
    would): the events it returned, if any, then those of the next calls
    are exactly the uninterrupted sequence, in order (with ``sha256_cbor``,
    whose map of the cached pages' hashes a fault must not change either)."""
    pc = make_history(event_hash)
    want = pc.take_events()
    event_history(pc, 1)
    want += pc.take_events()
    kinds = {type(e).__name__ for e in want}
    assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
    lines, counted = InterruptAt(10**9), make_history(event_hash)
    with lines:  # the lines of one take_events
        counted.take_events()
    steps = sorted(set(range(1, lines.count + 1, stride)) | set(range(lines.count - 40,
                                                                     lines.count + 2)))
    fired = 0
    for k in steps:
        pc = make_history(event_hash)
        inj = InterruptAt(k, exc)
        got = []
        try:
            with inj:
                got = pc.take_events()
        except exc:
            fired += 1
        event_history(pc, 1)
        got += pc.take_events()
        assert got == want, f"{exc.__name__} at line step {k}: events lost or repeated"
        assert pc.take_events() == []
        assert inj.fired == (k <= lines.count)
    assert fired > 3


def same_outcome(got, want):
    """Results of a lifecycle call (Finished, a free array, a Request or
    None), compared by what a caller would use."""
    if isinstance(want, rs.Finished):
        return (got.cached == want.cached and got.free.tolist() == want.free.tolist()
                and got.evicted.values.tolist() == want.evicted.values.tolist())
    if isinstance(want, np.ndarray):
        return got.tolist() == want.tolist()
    if isinstance(want, rs.Request):
        return (got.cached, got.reserved, got.values.tolist(), got.evicted.values.tolist()) == (
            want.cached, want.reserved, want.values.tolist(), want.evicted.values.tolist())
    return got is want


@pytest.mark.parametrize("kind", ["interrupt", "memory"])
@pytest.mark.parametrize("name", sorted(SERVING_OPS))
def test_request_lifecycle_survives_a_fault_at_every_step(name, kind, monkeypatch):
    """Each transition happens entirely or not at all, and either way the
    caller can finish the job: ``steps`` says whether it happened,
    ``result`` (or ``open_requests()`` for a begin) gives what it returned,
    and a retry of one that did not happen returns what it would have."""
    op = SERVING_OPS[name]
    before, after = expected(fresh_serving, op)
    ok = {prefix_contents(before), prefix_contents(after)}
    want = op(fresh_serving())
    fired = 0
    for inj in faults(kind, monkeypatch):
        pc = fresh_serving()
        mine = served(pc)
        steps = mine.steps
        faulted = run_faulted(inj, op, pc)
        fired += faulted
        state = prefix_contents(pc)
        assert state in ok, f"{kind} at step {inj.k} left a half-changed cache"
        if faulted:
            if name.startswith("begin"):
                new = [r for r in pc.open_requests() if r is not mine]
                got = new[0] if new else op(pc)  # it happened, or is retried
            elif mine.steps > steps:
                got = mine.result
            else:
                got = op(pc)
            assert same_outcome(got, want), f"{kind} at step {inj.k}: recovered a different result"
            assert prefix_contents(pc) == prefix_contents(after)
        pc.check_invariants()
        for r in pc.open_requests():
            pc.abort(r)
        assert pc.inflight_tokens == 0 and pc.locked_tokens == 0
    if kind == "interrupt":
        assert fired > 0


def test_a_finished_request_cannot_finish_twice_but_keeps_its_result():
    pc = fresh_serving()
    r = served(pc)
    q, vals = finish_tokens([7, 7])
    first = pc.finish(r, q, vals)
    with pytest.raises(ValueError, match="request.result"):
        pc.finish(r, q, vals)
    assert same_outcome(r.result, first) and r.steps == 2 and not r.open
    pc.check_invariants()


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
    s.tokens = s.arrays[0]  # and the other way round
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


# the batch lifecycle on fresh_serving(): one kernel call each, all or nothing
# (begin_batch past the capacity's sure bound runs with its undo copy beside
# it; the finish batch evicts under the capacity, so it does too)
def _batch_of_served(pc):
    return [served(pc)]


BATCH_OPS = {
    "begin_batch": lambda pc: pc.begin_batch([LONG[:20], LONG[:30], BASE[2]]),
    "begin_batch_evicting": lambda pc: pc.begin_batch([LONG[:40], LONG[100:130]]),
    "begin_batch_near_capacity": lambda pc: pc.begin_batch(BASE[:30] + [LONG[:40]]),
    "checkpoint_batch": lambda pc: pc.checkpoint_batch(
        _batch_of_served(pc), [finish_tokens([2, 2, 2])[0]], [finish_tokens([2, 2, 2])[1]]),
    "finish_batch": lambda pc: pc.finish_batch(
        _batch_of_served(pc), [finish_tokens(list(range(40)))[0]],
        [finish_tokens(list(range(40)))[1]]),
}


def _batch_outcome(x):
    if isinstance(x, rs.BatchBegin):
        return (x.cached.tolist(), x.requests.reserved.tolist(),
                [v.tolist() for v in x.requests.values], [v.tolist() for v in x.requests.evicted])
    if isinstance(x, rs.BatchFinished):
        return (x.cached.tolist(), [v.tolist() for v in x.free], [v.tolist() for v in x.evicted])
    return [v.tolist() for v in x]


@pytest.mark.parametrize("kind", ["interrupt", "memory"])
@pytest.mark.parametrize("name", sorted(BATCH_OPS))
def test_batch_lifecycle_survives_a_fault_at_every_step(name, kind, monkeypatch):
    """A batch call happens entirely or not at all (never a prefix of its
    requests), and a retry of one that did not happen returns what it
    would have."""
    op = BATCH_OPS[name]
    before, after = expected(fresh_serving, op)
    ok = {prefix_contents(before), prefix_contents(after)}
    assert len(ok) == 2
    want = _batch_outcome(op(fresh_serving()))
    fired = 0
    for inj in faults(kind, monkeypatch):
        pc = fresh_serving()
        mine = served(pc)
        steps = mine.steps
        faulted = run_faulted(inj, op, pc)
        fired += faulted
        state = prefix_contents(pc)
        assert state in ok, f"{kind} at step {inj.k} left a half-changed cache"
        if faulted and state == prefix_contents(before):
            assert mine.steps == steps
            assert _batch_outcome(op(pc)) == want, f"{kind} at step {inj.k}: a different retry"
            assert prefix_contents(pc) == prefix_contents(after)
        pc.check_invariants()
        for r in pc.open_requests():
            pc.abort(r)
        assert pc.inflight_tokens == 0 and pc.locked_tokens == 0
    if kind == "interrupt":
        assert fired > 0


def test_a_refused_batch_near_capacity_is_undone_under_a_fault_at_every_step(monkeypatch):
    """The 31st begin cannot reserve its tokens: the 30 before it were
    begun (locking paths) and are put back by the same kernel call."""
    def op(pc):
        return pc.begin_batch(BASE[:30] + [LONG[:140]])

    want = prefix_contents(fresh_serving())
    for kind in ("interrupt", "memory"):
        for inj in faults(kind, monkeypatch):
            pc = fresh_serving()
            try:
                run_faulted(inj, op, pc)
            except rs.CacheFullError:
                pass
            assert prefix_contents(pc) == want, f"{kind} at step {inj.k}"
            pc.check_invariants()
