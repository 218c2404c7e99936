"""Many threads on one cache: writers growing it while readers look up,
mixed prefix-cache traffic, saving beside inserts. Run with a tiny switch
interval so threads interleave between almost every bytecode."""

import sys
import threading
import time

import numpy as np
import pytest

import radix_soa as rs
from radix_soa import CacheFullError, PrefixCache, RadixCache


@pytest.fixture(autouse=True)
def fast_switching():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def run_threads(targets, background=(), seconds=30):
    """Run ``targets`` (``(fn, *args)``) to the end on threads while the
    ``background`` functions loop on threads of their own (each call gets
    the stop event); re-raise the first error any of them hit."""
    errors = []
    stop = threading.Event()

    def guard(fn, *args):
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
            stop.set()

    def loop(fn):
        while not stop.is_set():
            fn()

    threads = [threading.Thread(target=guard, args=t) for t in targets]
    side = [threading.Thread(target=guard, args=(loop, fn)) for fn in background]
    for t in threads + side:
        t.start()
    for t in threads:
        t.join(seconds)
    stop.set()
    for t in side:
        t.join(seconds)
    assert not any(t.is_alive() for t in threads + side), "a thread hung"
    if errors:
        raise errors[0]


def sequences(seed, n, vocab=6, longest=80):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(k)) for k in rng.integers(1, longest, size=n)]


def test_writers_and_readers_on_one_radix_cache():
    rc = RadixCache()
    writers = [sequences(w, 1500) for w in range(3)]
    published = []  # sequences whose insert has returned
    missing = []
    rng = np.random.default_rng(99)

    def write(seqs, batch):
        for i in range(0, len(seqs), 50):
            if batch:
                rc.insert_batch(seqs[i:i + 50])
            else:
                for q in seqs[i:i + 50]:
                    rc.insert(q)
            published.extend(seqs[i:i + 50])

    def read():
        n = len(published)
        if n == 0:
            return
        q = published[int(rng.integers(0, n))]
        if not rc.exists(q) or rc.match_prefix(q) != len(q):
            missing.append(q)
        if rng.random() < 0.05 and not rc.exists_batch(published[:n:7]).all():
            missing.append("batch")

    run_threads([(write, writers[0], False), (write, writers[1], True), (write, writers[2], False)],
                background=[read, read])
    assert missing == []
    everything = [q for w in writers for q in w]
    assert rc.exists_batch(everything).all()
    assert len(rc) == len({tuple(q.tolist()) for q in everything})
    rc.check_invariants()


def test_mixed_traffic_on_one_prefix_cache():
    capacity = 3000
    pc = PrefixCache(capacity=capacity, page_size=2)
    qs = sequences(5, 200, vocab=4, longest=60)
    rng = np.random.default_rng(5)

    def serve(seed):
        rng = np.random.default_rng(seed)
        for q in sequences(seed, 600, vocab=4, longest=60):
            m = pc.match(q, namespace=int(seed % 2))
            try:
                pc.lock(m.node)
            except ValueError:  # the evictor freed it between the two calls
                continue
            try:
                pc.insert(q, values=np.arange(len(q)), namespace=int(seed % 2))
            except CacheFullError:  # locked paths leave no room: an answer, not a failure
                pass
            pc.unlock(m.node)
            if rng.random() < 0.1:
                pc.match_batch([q, q[:3]])

    def evictor():
        pc.evict(64)
        pc.check_invariants(full=False)  # evictable + locked == total, within capacity

    def reader():
        q = qs[int(rng.integers(0, len(qs)))]
        n = pc.match_length(q)
        assert 0 <= n <= len(q) and n % 2 == 0

    run_threads([(serve, s) for s in range(4)], background=[evictor, reader])
    pc.check_invariants()
    assert pc.locked_tokens == 0
    assert pc.evictable_tokens == pc.total_tokens <= capacity


def test_saving_beside_inserts_writes_a_whole_tree(tmp_path):
    rc = RadixCache()
    seqs = sequences(3, 3000)
    done = threading.Event()

    def write():
        for i in range(0, len(seqs), 100):
            rc.insert_batch(seqs[i:i + 100])
        done.set()

    saved = []

    def save():
        k = 0
        while not done.is_set() or k == 0:
            path = tmp_path / f"t{k % 3}"
            rc.save(path)
            saved.append(path)
            loaded = RadixCache.load(path)
            loaded.check_invariants()
            assert loaded.exists_batch(list(loaded)).all()
            k += 1

    run_threads([(write,), (save,)])
    assert saved
    final = tmp_path / "final"
    rc.save(final)
    assert RadixCache.load(final).exists_batch(seqs).all()


def test_pickling_beside_writers():
    import pickle

    pc = PrefixCache()
    seqs = sequences(8, 800)

    def write():
        for q in seqs:
            pc.insert(q, values=q)

    copies = []

    def copy():
        for _ in range(30):
            copies.append(pickle.loads(pickle.dumps(pc)))

    run_threads([(write,), (copy,)])
    for c in copies:
        c.check_invariants()


def test_batch_reads_without_the_gil_beside_writers():
    # Serial batch reads release the GIL and run as registered readers; the
    # writers must wait for them (never mutate under a running read) and must
    # not starve while readers keep arriving.
    rc = RadixCache()
    writers = [sequences(10 + w, 1200) for w in range(2)]
    published = []
    missing = []

    def write(seqs):
        for i in range(0, len(seqs), 40):
            part = seqs[i:i + 40]
            if i % 80:
                rc.insert_batch(part)
            else:
                for q in part:
                    rc.insert(q)
            published.extend(part)

    def batch_read():
        snapshot = published[:]
        if not snapshot:
            return
        if not rc.exists_batch(snapshot, parallel=False).all():
            missing.append("exists_batch")
        lengths = rc.match_prefix_batch(snapshot, parallel=False)
        if not np.array_equal(lengths, [len(q) for q in snapshot]):
            missing.append("match_prefix_batch")

    run_threads([(write, writers[0]), (write, writers[1])], background=[batch_read, batch_read])
    assert missing == []
    assert rc._readers == 0 and rc._writers_waiting == 0
    assert rc.exists_batch([q for w in writers for q in w]).all()
    rc.check_invariants()


def test_prefix_batch_reads_beside_eviction():
    capacity = 2000
    pc = PrefixCache(capacity=capacity, page_size=2)
    qs = sequences(21, 300, vocab=4, longest=60)

    def serve(seed):
        for q in sequences(seed, 500, vocab=4, longest=60):
            try:
                pc.insert(q, values=np.arange(len(q)))
            except CacheFullError:
                pass

    def batch_reader():
        got = pc.match_length_batch(qs, parallel=False)
        assert np.all((got >= 0) & (got <= [len(q) for q in qs]) & (got % 2 == 0))

    def evictor():
        pc.evict(50)

    run_threads([(serve, s) for s in range(3)], background=[batch_reader, batch_reader, evictor])
    pc.check_invariants()
    assert pc._readers == 0
    assert pc.total_tokens <= capacity
    assert np.array_equal(pc.match_length_batch(qs, parallel=False),
                          [pc.match_length(q) for q in qs])


class _ResetOnEnter:
    """The cache's lock, with ``reset()`` run just before the next
    acquisition: what another thread's reset between a call's first read of
    the storage and its lock does."""

    def __init__(self, pc):
        self.real, self.pc, self.armed = pc._lock, pc, False

    def acquire(self):  # what ``with pc._writing:`` takes
        if self.armed:
            self.armed = False
            with self.real:
                self.pc.reset()
        return self.real.acquire()

    def release(self):
        self.real.release()

    def __enter__(self):  # what an inline ``with pc._lock:`` takes
        self.acquire()

    def __exit__(self, *exc):
        self.release()


WRITES = {
    "insert": lambda pc: pc.insert([1, 2, 9], values=[7, 8, 9]),
    "insert_batch": lambda pc: pc.insert_batch([[1, 2, 9]], values=[[7, 8, 9]]),
    "match": lambda pc: pc.match([1, 2, 3]),
    "match_batch": lambda pc: pc.match_batch([[1, 2, 3]], with_values=True),
    "begin": lambda pc: pc.begin([1, 2, 3]),
    "evict": lambda pc: pc.evict(2),
}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_reset_before_the_lock_is_taken_leaves_no_write_in_the_old_arrays(name):
    pc = PrefixCache(capacity=100)
    pc.insert([1, 2, 3, 4], values=[1, 2, 3, 4])
    old = pc._s
    before = {k: v.copy() for k, v in old.tree._asdict().items()}
    hook = _ResetOnEnter(pc)
    pc._lock = hook
    hook.armed = True
    WRITES[name](pc)
    assert pc._s is not old
    for k, v in old.tree._asdict().items():  # the discarded arrays are untouched
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    pc._lock = hook.real
    pc.check_invariants()
    if name.startswith("insert"):  # the write went to the fresh cache
        assert pc.match_length([1, 2, 9]) == 3 and pc.total_tokens == 3
    else:
        assert pc.total_tokens == 0 and pc.stats["lookups"] == (name != "evict")


# ---------------------------------------------------------------- the router index

def worker_chunks(seed, n_inserts=60):
    """One worker's events, in the ``apply`` calls it makes (a chunk every
    few inserts into a capped cache, so evictions are in them too)."""
    pc = PrefixCache(capacity=120, page_size=2, events=True, values=False)
    chunks = []
    for i, q in enumerate(sequences(seed, n_inserts, vocab=3, longest=40)):
        pc.insert(q)
        if i % 3 == 2:
            evs = pc.take_events()
            if evs:
                chunks.append(evs)
    return chunks


@pytest.mark.slow
def test_router_index_threads_answer_as_a_serial_order(monkeypatch):
    """Workers apply their events from threads of their own (one refused
    apply among them, one worker removed at the end) while readers call
    ``overlap`` and ``overlap_batch``; a switch is forced between any two
    events of an apply. Every answer is one a serial order gives: per worker,
    its overlap after j of its applies, for a j between those done before
    the read and those begun by its end, the same j for every row of a batch."""
    from radix_soa import EventError, RouterIndex
    from radix_soa import router_index as RI

    workers = 4
    chunks = [worker_chunks(10 + w) for w in range(workers)]
    queries = sequences(77, 24, vocab=3, longest=40)
    # expected[w][j][qi]: worker w alone after its first j applies
    expected = []
    for w in range(workers):
        alone = RouterIndex(page_size=2)
        alone.apply(w, [])
        rows = [[0] * len(queries)]
        for c in chunks[w]:
            alone.apply(w, c)
            rows.append([int(alone.overlap(q)[0]) for q in queries])
        expected.append(rows)
    assert all(len(set(map(tuple, rows))) > 3 for rows in expected)

    ix = RouterIndex(page_size=2)
    for w in range(workers):  # columns in worker order; chunk 0 applied
        ix.apply(w, chunks[w][0])
    started = [1] * workers
    done = [1] * workers
    removed = threading.Event()

    real = RI.RouterIndex._apply_one

    def switching(self, *args):
        real(self, *args)
        time.sleep(0)  # let another thread in between two events of one apply

    monkeypatch.setattr(RI.RouterIndex, "_apply_one", switching)

    def write(w):
        for j, c in enumerate(chunks[w][1:], start=1):
            if w == 1 and j == len(chunks[w]) // 2:  # refused: the chunk, then a block never held
                with pytest.raises(EventError, match="does not hold"):
                    ix.apply(w, c + [rs.BlockRemoved([12345])])
            started[w] += 1
            ix.apply(w, c)
            done[w] += 1
        if w == workers - 1:
            ix.remove_worker(w)
            removed.set()

    def allowed(w, lo, hi, qi):
        return {expected[w][j][qi] for j in range(lo, hi + 1)}

    def read_one(seed=[0]):
        seed[0] += 1
        qi = seed[0] % len(queries)
        lo = list(done)
        got = ix.overlap(queries[qi]).tolist()
        hi = list(started)
        gone = removed.is_set()
        assert len(got) in (workers, workers - 1)
        if len(got) == workers - 1:
            assert removed.is_set() or started[-1] == len(chunks[-1])
        elif gone:
            raise AssertionError("a removed worker still answers")
        for w, n in enumerate(got):
            assert n in allowed(w, lo[w], hi[w], qi), (w, n, lo[w], hi[w])

    def read_batch():
        lo = list(done)
        got = ix.overlap_batch(queries)
        hi = list(started)
        for w in range(got.shape[1]):
            col = got[:, w].tolist()
            assert any(col == [expected[w][j][qi] for qi in range(len(queries))]
                       for j in range(lo[w], hi[w] + 1)), f"worker {w}: no single state"

    run_threads([(write, w) for w in range(workers)], background=[read_one, read_batch])
    assert ix.workers == list(range(workers - 1))
    for qi, q in enumerate(queries):
        assert ix.overlap(q).tolist() == [expected[w][-1][qi] for w in range(workers - 1)]
