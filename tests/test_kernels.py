"""Kernels against obviously-correct references at their edges: the 64-token
compare blocks, probe runs that wrap around the child table, the status
vocabulary and the one resume helper."""

import numpy as np
import pytest

from radix_soa import PrefixCache, RadixCache
from radix_soa._kernels import descent as KD
from radix_soa._kernels import table as KT
from radix_soa._kernels.layout import DONE, ROOM
from radix_soa._tree.results import InvariantError
from radix_soa._tree.storage import TreeStorage, resume
from naive import splitmix_key_hash


def common_reference(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16])
@pytest.mark.parametrize("n", [1, 62, 63, 64, 65, 127, 128, 129, 200])
def test_common_prefix_around_the_64_token_blocks(n, dtype):
    rng = np.random.default_rng(n)
    base = rng.integers(0, 1000, size=n + 70).astype(dtype)
    offset = 5  # spans start inside the buffer, not at 0
    for where in sorted({0, 1, 62, 63, 64, 65, 66, 127, 128, 129, n - 1, n}):
        if where > n:
            continue
        q = base[offset:offset + n].astype(np.int64).copy()
        if where < n:
            q[where] += 1
        got = KD.common(base, offset, q, 0, n)
        assert got == common_reference(base[offset:offset + n].astype(np.int64), q) == where


@pytest.mark.parametrize("n", [63, 64, 65, 128, 129])
def test_match_and_exists_at_block_boundaries(n):
    rc = RadixCache()
    seq = np.arange(n) % 7
    rc.insert(seq)
    for cut in (n - 1, n):
        assert rc.match_prefix(seq[:cut]) == cut
    for where in (0, n // 2, 62, 63, 64, 65, n - 1):
        if where >= n:
            continue
        q = seq.copy()
        q[where] = 100
        assert rc.match_prefix(q) == where
        assert not rc.exists(q)
    assert rc.exists(seq)


# the children's parent: a node id past theirs
PARENT_ID = 7


def _home(table, arr, pos):
    return int(KT.key_hash(PARENT_ID, arr, pos, 1)) & (table.shape[0] - 1)


def _node(entry):
    return int(entry) & ((1 << 32) - 1)


def _table_with_wrapping_run(size=16, count=6):
    """A child table of ``size`` slots holding ``count`` children of node
    PARENT_ID whose homes are the last two slots, so their probe run wraps
    to 0."""
    table = np.full(size, -1, np.int64)
    tokens = []
    t = 0
    while len(tokens) < count:
        arr = np.array([t], np.int64)
        if _home(table, arr, 0) >= size - 2:
            tokens.append(t)
        t += 1
    ids = np.arange(1, count + 1)
    buf = np.array([0] + tokens, np.int64)  # node v's span starts at v
    start = np.arange(count + 1, dtype=np.int64)
    parent = np.array([-1] + [PARENT_ID] * count, np.int32)
    for c in ids:
        KT.table_put(table, buf, start, parent, c, 1)
    return table, buf, start, parent, ids


def _reachable(table, buf, start, parent, ids):
    for c in ids:
        if KT.find_child(table, buf, start, parent, PARENT_ID, buf, int(start[c]), 1) != c:
            return False
    return True


def _tag(p, token):
    """The high 32 bits of key ``(p, token)``'s hash."""
    return splitmix_key_hash(p, token) >> 32


def test_a_table_entry_is_its_keys_tag_above_the_node_id():
    table, buf, start, parent, ids = _table_with_wrapping_run()
    entries = table[table != -1]
    assert sorted(_node(e) for e in entries) == ids.tolist()
    for e in entries:
        c = _node(e)
        assert (int(e) >> 32) & 0xFFFFFFFF == _tag(PARENT_ID, int(buf[start[c]]))
    # another parent's child with the same first token is not a match
    assert KT.find_child(table, buf, start, parent, PARENT_ID + 1, buf, int(start[1]), 1) == -1


def test_a_tag_match_is_confirmed_by_the_node():
    # an entry carrying the probe's tag names a candidate only: a node under
    # another parent, or with another first token, is passed over
    table, buf, start, parent, ids = _table_with_wrapping_run()
    c = int(ids[2])
    i = KT.table_slot(table, buf, start, parent, c, 1)
    tag = int(table[i]) & ~0xFFFFFFFF
    assert KT.child_tagged(table[i], tag) == c and KT.child_tagged(-1, tag) == -1
    assert KT.child_tagged(table[i], tag ^ (1 << 40)) == -1
    other = parent.copy()
    other[c] = PARENT_ID + 1
    assert KT.probe_on(table, buf, start, other, i, table[i], PARENT_ID, tag, buf,
                       int(start[c]), 1) == -1
    assert KT.probe_on(table, buf, start, parent, i, table[i], PARENT_ID, tag, buf,
                       int(start[c]), 1) == c
    assert KT.retarget(table[i], 99) & 0xFFFFFFFF == 99 and \
        KT.retarget(table[i], 99) >> 32 == int(table[i]) >> 32


def test_a_probe_run_that_wraps_around_the_table():
    table, buf, start, parent, ids = _table_with_wrapping_run()
    filled = np.flatnonzero(table != -1).tolist()
    assert 0 in filled and 15 in filled  # the run wraps
    assert _reachable(table, buf, start, parent, ids)


@pytest.mark.parametrize("victim", range(6))
def test_backward_shift_delete_across_the_wrap(victim):
    table, buf, start, parent, ids = _table_with_wrapping_run()
    c = int(ids[victim])
    slot = KT.table_slot(table, buf, start, parent, c, 1)
    KT.table_delete_slot(table, buf, start, parent, slot, 1)
    rest = [int(x) for x in ids if x != c]
    assert sorted(_node(e) for e in table[table != -1]) == rest
    assert _reachable(table, buf, start, parent, rest)
    assert KT.find_child(table, buf, start, parent, PARENT_ID, buf, int(start[c]), 1) == -1
    # no hole between any entry's home slot and its slot (cyclically)
    size = table.shape[0]
    for i in np.flatnonzero(table != -1):
        home = _home(table, buf, int(start[_node(table[i])]))
        j = home
        while j != i:
            assert table[j] != -1
            j = (j + 1) % size


def test_resume_grows_each_store_by_what_its_kernel_asked_for():
    a, b = TreeStorage(), TreeStorage()
    calls = []

    def kernel():
        calls.append((a.tokens.shape[0], b.start.shape[0]))
        if len(calls) == 1:
            a.meta[13], a.meta[14] = 10_000, 0   # M_NEED_TOKENS, M_NEED_NODES
            return ROOM
        if len(calls) == 2:
            b.meta[13], b.meta[14] = 0, 500
            return ROOM, 7
        return DONE, 42

    assert resume(kernel, (a, b)) == (DONE, 42)
    assert calls[1][0] >= 10_000 and calls[2][1] >= 500
    assert a.take_need() == (0, 0) and b.take_need() == (0, 0)


def test_resume_refuses_a_room_status_without_a_need():
    s = TreeStorage()
    with pytest.raises(InvariantError, match="without saying how much"):
        resume(lambda: ROOM, (s,))


def test_a_namespace_is_made_by_the_call_that_first_uses_it():
    pc = PrefixCache(capacity=4)
    pc.insert([1, 2, 3], values=[1, 2, 3])
    pc.lock(pc.match([1, 2, 3]).node)
    with pytest.raises(Exception, match="no room"):
        pc.insert([7, 8], values=[1, 2], namespace="tenant")
    assert pc.namespaces == [0]  # refused: no root was made for it
    pc.insert([7], values=[1], namespace="tenant")
    assert pc.namespaces == [0, "tenant"]
    assert pc._s.roots() == {0: pc._roots[0], 1: pc._roots["tenant"]}


@pytest.mark.parametrize("track, values", [(False, False), (True, False), (True, True)])
def test_a_new_storage_has_the_root_the_new_root_kernel_makes(track, values):
    from radix_soa._kernels import mutation as KM
    from radix_soa._kernels import layout as L

    s = TreeStorage(np.int32, values=values, track=track)
    arrays = {name: a.copy() for name, a in s.tree._asdict().items()}
    arrays["parent"][0] = 0  # back to the zeroed arrays before any root
    arrays["meta"][L.M_NODE_END] = 0
    arrays["meta"][L.M_ROOTS] = 0
    T = tuple(arrays[name] for name in L.TREE_FIELDS)
    status, root = KM.new_root(T, track, 0)
    assert (status, root, s.root) == (DONE, 0, 0)
    for name, a in s.tree._asdict().items():
        assert np.array_equal(a, arrays[name]), name
    assert s.roots() == {0: 0}


# ---------------------------------------------------------------- the directory

def _field_summaries(D, like):
    from numba import literal_unroll, njit

    from radix_soa._kernels.directory import tree_at

    @njit
    def summarize(D, like, out):
        i = 0
        for a in literal_unroll(tree_at(D, like)):
            out[i, 0] = a.shape[0]
            total = 0
            for x in a:
                total += np.int64(x)
            out[i, 1] = total
            out[i, 2] = a.itemsize
            i += 1

    from radix_soa._kernels.layout import TREE_FIELDS

    out = np.zeros((len(TREE_FIELDS), 3), np.int64)
    summarize(D, like, out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16])
def test_the_directory_rebuilds_every_array_of_the_tree(dtype):
    pc = PrefixCache(page_size=2, dtype=dtype)
    rng = np.random.default_rng(3)
    for _ in range(50):
        q = rng.integers(0, 200, size=int(rng.integers(2, 40)))
        h = pc.insert(q, values=q * 3).node
        pc.lock(h)
    s = pc._s
    expected = np.array([[len(a), int(a.astype(np.int64).sum()), a.itemsize] for a in s.tree])
    assert np.array_equal(_field_summaries(s.directory, s.like), expected)
    assert np.array_equal(_field_summaries(s.arrays, s.like), expected)  # the fallback: T itself


@pytest.mark.slow
def test_without_the_directory_every_call_gives_the_same_answers(monkeypatch):
    from radix_soa._tree import storage as _storage

    def run():
        rng = np.random.default_rng(11)
        rc, pc = RadixCache(np.int32), PrefixCache(capacity=300, page_size=2)
        answers = []
        for _ in range(300):
            q = rng.integers(0, 5, size=int(rng.integers(1, 30)))
            answers.append((rc.insert(q), rc.exists(q[:-1]), rc.match_prefix(q[::-1])))
            m = pc.match(q)
            locked = pc.lock(m.node)
            r = pc.insert(q, values=np.arange(len(q)))
            answers.append((m.length, m.values.tolist(), locked, r.cached,
                            r.evicted.values.tolist(), pc.unlock(m.node),
                            pc.match_length(q), pc.evict(3).values.tolist()))
        rc.check_invariants()
        pc.check_invariants()
        return answers, rc._s.directory, pc._s.directory

    with_directory, d1, d2 = run()
    assert isinstance(d1, np.ndarray) and isinstance(d2, np.ndarray)
    monkeypatch.setattr(_storage, "USE_DIRECTORY", False)
    without, t1, t2 = run()
    assert isinstance(t1, tuple) and isinstance(t2, tuple)
    assert with_directory == without


def test_a_directory_keeps_its_arrays_alive():
    import gc
    import weakref

    from radix_soa._kernels.directory import directory_of

    s = TreeStorage(values=True, track=True)
    D = directory_of(s.tree)
    ref = weakref.ref(s.tree.tokens)
    s.reserve(tokens=10_000)  # publishes new arrays: the old ones live on through D
    gc.collect()
    assert ref() is not None and D[1] == ref().shape[0]
    del D
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("page", [1, 3])
def test_grouped_batch_descents_equal_one_descent_per_query(page):
    # more queries than a group (lanes refill), more than a parallel chunk,
    # small alphabet (long probe runs, shared prefixes, splits), and queries
    # that are empty, shorter than a page, strict prefixes and near misses
    rng = np.random.default_rng(7)
    stored = [rng.integers(0, 4, int(k)) for k in rng.integers(1, 30, 3000)]
    stored = [s[:len(s) - len(s) % page] for s in stored if len(s) >= page]
    pc = PrefixCache(page_size=page, values=False)
    for s in stored:
        pc.insert(s)
    queries = [s.copy() for s in stored] + [s[:len(s) // 2] for s in stored]
    queries += [np.zeros(0, np.int64), np.array([1]), np.array([1, 2])]
    for s in stored[:2000]:
        q = s.copy()
        q[-1] = 9
        queries.append(q)
    order = rng.permutation(len(queries))
    queries = [queries[i] for i in order] * 2  # > KD.CHUNK queries in all
    assert len(queries) > KD.CHUNK
    expect = [pc.match_length(q) for q in queries]
    for parallel in (False, True):
        assert pc.match_length_batch(queries, parallel=parallel).tolist() == expect
    if page == 1:
        rc = RadixCache()
        rc.insert_batch(stored)
        want_exists = [rc.exists(q) for q in queries]
        want_match = [rc.match_prefix(q) for q in queries]
        for parallel in (False, True):
            assert rc.exists_batch(queries, parallel=parallel).tolist() == want_exists
            assert rc.match_prefix_batch(queries, parallel=parallel).tolist() == want_match
