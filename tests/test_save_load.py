"""Saving never destroys what it did not write; loading never trusts a byte
it did not check (issue: hardening)."""

import json
import os

import numpy as np
import pytest

import radix_soa as rs
from radix_soa import PrefixCache, RadixCache, TreeFormatError
from radix_soa._tree import persist as _persist


def small_tree():
    rc = RadixCache()
    rc.insert_batch([[1, 2, 3], [1, 2, 4], [5], [1, 2, 3, 9, 9]])
    rc.remove([5])  # leaves a free node
    return rc


def small_cache():
    pc = PrefixCache(capacity=3000)
    for q in ([1, 2, 3, 4], [1, 2, 7], [9, 9]):
        pc.insert(q, values=np.arange(len(q)))
    pc.evict(2)
    return pc


def read_header(path):
    return json.loads((path / "header.json").read_text())


def write_header(path, header):
    header["header_crc32"] = _persist.header_crc(header)
    (path / "header.json").write_text(json.dumps(header))


def edit_array(path, name, change):
    """Change one saved array and recompute its checksum (and the header's):
    damage the checksums cannot see."""
    arr = np.load(path / f"{name}.npy")
    arr = change(arr.copy())
    np.save(path / f"{name}.npy", arr)
    header = read_header(path)
    header["arrays"][name] = {"dtype": arr.dtype.name, "length": int(arr.shape[0]),
                              "crc32": _persist._crc(arr)}
    write_header(path, header)


# ---------------------------------------------------------------- saving

def test_save_refuses_a_directory_that_is_not_a_tree(tmp_path):
    target = tmp_path / "mine"
    (target / "sub").mkdir(parents=True)
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a saved radix_soa tree"):
        small_tree().save(target)
    assert (target / "notes.txt").read_text() == "keep me" and (target / "sub").is_dir()
    assert sorted(os.listdir(tmp_path)) == ["mine"]


def test_save_refuses_a_regular_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("data")
    with pytest.raises(FileExistsError):
        small_tree().save(target)
    assert target.read_text() == "data"


def test_save_into_an_empty_directory_and_over_a_saved_tree(tmp_path):
    target = tmp_path / "t"
    target.mkdir()
    small_tree().save(target)
    other = RadixCache()
    other.insert([42])
    other.save(target)
    assert list(RadixCache.load(target)) == [np.array([42])]
    assert sorted(os.listdir(tmp_path)) == ["t"]


def test_a_failed_replace_restores_the_old_tree(tmp_path, monkeypatch):
    target = tmp_path / "t"
    small_tree().save(target)
    real = os.rename
    calls = []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # between moving the old tree aside and the new one in
            raise KeyboardInterrupt
        return real(src, dst)

    new = RadixCache()
    new.insert([7, 7])
    monkeypatch.setattr(_persist.os, "rename", flaky)
    with pytest.raises(KeyboardInterrupt):
        new.save(target)
    monkeypatch.setattr(_persist.os, "rename", real)
    assert RadixCache.load(target).exists([1, 2, 4])
    assert sorted(os.listdir(tmp_path)) == ["t"]


def test_the_next_save_clears_leftovers_and_recovers_a_moved_tree(tmp_path, monkeypatch):
    target = tmp_path / "t"
    small_tree().save(tmp_path / "keep")
    (tmp_path / ".t.tmp-abc").mkdir()
    (tmp_path / ".t.tmp-abc" / "tokens.npy").write_bytes(b"partial")
    crashed = tmp_path / ".t.old-xyz"
    crashed.mkdir()
    os.rename(tmp_path / "keep", crashed / "tree")  # a crash between the two renames
    RadixCache().save(tmp_path / "unrelated")
    assert crashed.exists()  # only saves of "t" touch t's leftovers
    # the next save of "t" first puts the moved tree back: if this save then
    # fails before its own rename, the old tree is where it was
    new = RadixCache()
    new.insert([3])
    monkeypatch.setattr(_persist.np, "save", lambda *a, **k: (_ for _ in ()).throw(OSError("disk")))
    with pytest.raises(OSError, match="disk"):
        new.save(target)
    monkeypatch.undo()
    assert RadixCache.load(target).exists([1, 2, 4])
    assert sorted(os.listdir(tmp_path)) == ["t", "unrelated"]
    new.save(target)
    assert RadixCache.load(target).exists([3]) and sorted(os.listdir(tmp_path)) == ["t", "unrelated"]


# ---------------------------------------------------------------- the header

def test_the_header_has_a_checksum(tmp_path):
    small_cache().save(tmp_path / "t")
    text = (tmp_path / "t" / "header.json").read_text().replace('"capacity": 3000',
                                                                 '"capacity": 2000')
    (tmp_path / "t" / "header.json").write_text(text)
    with pytest.raises(TreeFormatError, match="header.json is corrupted"):
        PrefixCache.load(tmp_path / "t")


def test_an_identity_is_kept_under_the_checksum_and_plain_loads_ignore_it(tmp_path):
    rc = small_tree()
    rc._save(tmp_path / "t", {"part": 3, "save": "ab"})
    back, ident = RadixCache._load(tmp_path / "t")
    def contents(tree):
        return sorted(tuple(s.tolist()) for s in tree)

    assert ident == {"part": 3, "save": "ab"} and contents(back) == contents(rc)
    assert contents(RadixCache.load(tmp_path / "t", mmap=True)) == contents(rc)  # a plain tree
    rc.save(tmp_path / "plain")
    assert RadixCache._load(tmp_path / "plain")[1] is None
    assert "identity" not in read_header(tmp_path / "plain")  # saves without one unchanged
    path = tmp_path / "t" / "header.json"
    path.write_text(path.read_text().replace('"part": 3', '"part": 4'))
    with pytest.raises(TreeFormatError, match="checksum"):
        RadixCache._load(tmp_path / "t")
    header = read_header(tmp_path / "t")
    header["identity"] = [3]
    write_header(tmp_path / "t", header)
    with pytest.raises(TreeFormatError, match="identity"):
        RadixCache.load(tmp_path / "t")


@pytest.mark.parametrize("edit", [
    lambda h: h.update(track=False),
    lambda h: h.update(values="yes"),
    lambda h: h.update(root=10**7),
    lambda h: h.update(root=1),            # a live node, not a root
    lambda h: h.update(page_size=0),
    lambda h: h.update(page_size=-1),
    lambda h: h.update(page_size=3),       # disagrees with the table and the state
    lambda h: h["state"].update(page_size=2),
    lambda h: h["state"].update(capacity=4),  # below what the tree holds
    lambda h: h["state"].update(namespaces=[]),
    lambda h: h.update(state=[1]),
    lambda h: h["arrays"].update(tokens="x"),
])
@pytest.mark.parametrize("mmap", [False, True])
def test_header_fields_are_validated_against_the_arrays(tmp_path, edit, mmap):
    small_cache().save(tmp_path / "t")
    header = read_header(tmp_path / "t")
    edit(header)
    write_header(tmp_path / "t", header)
    with pytest.raises(TreeFormatError, match=str(tmp_path / "t")):
        PrefixCache.load(tmp_path / "t", mmap=mmap)


def test_a_radix_tree_header_claiming_prefix_cache_flags_is_refused(tmp_path):
    small_tree().save(tmp_path / "t")
    header = read_header(tmp_path / "t")
    header["track"] = True
    write_header(tmp_path / "t", header)
    with pytest.raises(TreeFormatError):
        RadixCache.load(tmp_path / "t")


# ---------------------------------------------------------------- the arrays

def _meta_slot(name):
    from radix_soa._tree.storage import COUNTERS
    return COUNTERS[name]


def _set_meta(name, value):
    def change(meta):
        meta[_meta_slot(name)] = value
        return meta
    return change


DAMAGE = {
    "free head 10^9": ("meta", _set_meta("free_head", 10**9)),
    "free count 10^6": ("meta", _set_meta("free_count", 10**6)),
    "node count 0": ("meta", _set_meta("nodes", 0)),
    "token count": ("meta", _set_meta("tokens", 3)),
    "free link 10^9": ("start", None),     # filled in below: the free node's link
    "live leaf of length 0": ("length", None),
    "start 2^40": ("start", lambda a: np.where(np.arange(len(a)) == 1, 2**40, a)),
    "no empty table slot": ("table", lambda a: np.where(a == -1, 1, a).astype(a.dtype)),
    "table entry out of range": ("table", lambda a: np.where(a != -1, a + 10**6, a).astype(a.dtype)),
    "table entry with another key's tag": ("table", lambda a: np.where(a != -1, a ^ (1 << 40), a)),
}


def _damage(path, what):
    name, change = DAMAGE[what]
    if what == "free link 10^9":
        length = np.load(path / "length.npy")
        free = np.flatnonzero(length == -1)
        assert len(free)
        change = lambda a: np.where(np.arange(len(a)) == free[0], 10**9, a)  # noqa: E731
    if what == "live leaf of length 0":
        length = np.load(path / "length.npy")
        leaf = int(np.flatnonzero(length > 0)[-1])
        change = lambda a: np.where(np.arange(len(a)) == leaf, 0, a).astype(a.dtype)  # noqa: E731
    edit_array(path, name, change)


@pytest.mark.parametrize("what", sorted(DAMAGE))
@pytest.mark.parametrize("mmap", [False, True])
def test_arrays_damaged_past_their_checksums_are_refused(tmp_path, what, mmap):
    small_tree().save(tmp_path / "t")
    _damage(tmp_path / "t", what)
    with pytest.raises(TreeFormatError, match="corrupted|inconsistent"):
        RadixCache.load(tmp_path / "t", mmap=mmap)


def _as_format_2(path):
    """Rewrite a saved tree as format version 2 wrote it: the child table as
    int32 node ids, without the tags this version's entries carry."""
    edit_array(path, "table", lambda a: np.where(a != -1, a & 0xFFFFFFFF, -1).astype(np.int32))
    header = read_header(path)
    header["version"] = 2
    write_header(path, header)


def _as_format_3(path):
    """Rewrite a saved tree as format version 3 wrote it: int64 entries
    ``parent << 32 | id`` in the same slots."""
    parent = np.load(path / "parent.npy").astype(np.int64)

    def entries(a):
        filled = a != -1
        ids = a[filled] & 0xFFFFFFFF
        out = np.full(a.shape[0], -1, np.int64)
        out[filled] = (parent[ids] << 32) | ids
        return out

    edit_array(path, "table", entries)
    header = read_header(path)
    header["version"] = 3
    write_header(path, header)


@pytest.mark.slow
@pytest.mark.parametrize("cls, make", [(RadixCache, small_tree), (PrefixCache, small_cache)])
@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("old", [_as_format_2, _as_format_3])
def test_an_older_save_loads_with_its_table_entries_tagged(tmp_path, cls, make, mmap, old):
    tree = make()
    tree.save(tmp_path / "t")
    old(tmp_path / "t")
    saved = np.load(tmp_path / "t" / "table.npy")
    assert saved.dtype == (np.int32 if old is _as_format_2 else np.int64)
    assert not np.array_equal(saved, tree._s.table)
    loaded = cls.load(tmp_path / "t", mmap=mmap)
    assert loaded._s.table.dtype == np.int64
    assert np.array_equal(loaded._s.table, tree._s.table)  # the same entries, tags and all
    loaded.check_invariants()
    queries = [[1, 2, 3], [1, 2, 4], [5], [1, 2, 3, 9, 9], [1, 2, 3, 4], [1, 2, 7], [9, 9]]
    if cls is RadixCache:
        assert all(a.tolist() == b.tolist() for a, b in zip(loaded.to_csr(), tree.to_csr()))
        assert loaded.exists_batch(queries).tolist() == tree.exists_batch(queries).tolist()
    else:
        assert loaded.match_length_batch(queries).tolist() == \
            tree.match_length_batch(queries).tolist()


@pytest.mark.parametrize("change, message", [
    (lambda a: np.where(a >= 0, a + 10**6, a), "not a node id"),  # an id past the nodes
    (lambda a: np.where(a == -1, -5, a), "not a node id"),         # a negative id
    (lambda a: np.where(a >= 0, 0, a), "a root"),                  # the default root's id
    (lambda a: a.astype(np.int64), "int32"),                        # a format 3 table
])
def test_a_damaged_format_2_table_is_refused(tmp_path, change, message):
    small_tree().save(tmp_path / "t")
    _as_format_2(tmp_path / "t")
    edit_array(tmp_path / "t", "table", change)
    with pytest.raises(TreeFormatError, match=message):
        RadixCache.load(tmp_path / "t")


def test_a_format_4_save_with_an_int32_table_is_refused(tmp_path):
    small_tree().save(tmp_path / "t")
    edit_array(tmp_path / "t", "table", lambda a: np.where(a != -1, a & 0xFFFFFFFF, -1)
               .astype(np.int32))
    with pytest.raises(TreeFormatError, match="int64"):
        RadixCache.load(tmp_path / "t")


@pytest.mark.parametrize("change, message", [
    (lambda a: np.where(a != -1, a + (1 << 32), a), "parent"),      # parent bits not the node's
    (lambda a: np.where(a != -1, a + 10**6, a), "not a node id"),  # an id past the nodes
    (lambda a: a.astype(np.int32), "int64"),                       # a format 2 table
])
def test_a_damaged_format_3_table_is_refused(tmp_path, change, message):
    small_tree().save(tmp_path / "t")
    _as_format_3(tmp_path / "t")
    edit_array(tmp_path / "t", "table", change)
    with pytest.raises(TreeFormatError, match=message):
        RadixCache.load(tmp_path / "t")


@pytest.mark.parametrize("mmap", [False, True])
def test_parents_that_form_a_cycle_are_refused(tmp_path, mmap):
    # two leaves made each other's parent: every count and span checks out,
    # but a walk up from either never ends
    small_tree().save(tmp_path / "t")
    length = np.load(tmp_path / "t" / "length.npy")
    nchild = np.load(tmp_path / "t" / "nchild.npy")
    x, y = [int(v) for v in np.flatnonzero((length > 0) & (nchild == 0))[:2]]
    edit_array(tmp_path / "t", "parent",
               lambda a: np.where(np.arange(len(a)) == x, y, np.where(np.arange(len(a)) == y, x, a))
               .astype(a.dtype))
    with pytest.raises(TreeFormatError, match="reach a root"):
        RadixCache.load(tmp_path / "t", mmap=mmap)


def test_heap_damage_is_refused(tmp_path):
    small_cache().save(tmp_path / "t")
    edit_array(tmp_path / "t", "heap", lambda a: a * 0 + 10**6)
    with pytest.raises(TreeFormatError, match="heap"):
        PrefixCache.load(tmp_path / "t")


def test_lock_counts_past_the_limit_are_refused(tmp_path):
    small_cache().save(tmp_path / "t")
    edit_array(tmp_path / "t", "lock", lambda a: a * 0 + (2**31 - 1))
    with pytest.raises(TreeFormatError, match="lock count"):
        PrefixCache.load(tmp_path / "t")


@pytest.mark.parametrize("mangle", [
    lambda b: b[:6] + b"\xff" + b[7:],                  # magic
    lambda b: b[:12] + b"{'descr': '<i8', 'fortran_order': Tru" + b[49:],  # header text
    lambda b: b[:20] + bytes([b[20] ^ 0x40]) + b[21:],  # a bit in the header dict
    lambda b: b[:40],                                   # truncated
])
def test_a_damaged_npy_header_is_a_tree_format_error(tmp_path, mangle):
    small_tree().save(tmp_path / "t")
    f = tmp_path / "t" / "start.npy"
    f.write_bytes(mangle(f.read_bytes()))
    with pytest.raises(TreeFormatError, match="start.npy"):
        RadixCache.load(tmp_path / "t")


def test_a_directory_in_place_of_an_array_is_a_tree_format_error(tmp_path):
    small_tree().save(tmp_path / "t")
    os.remove(tmp_path / "t" / "parent.npy")
    (tmp_path / "t" / "parent.npy").mkdir()
    with pytest.raises(TreeFormatError, match="parent.npy"):
        RadixCache.load(tmp_path / "t")


def test_an_undamaged_tree_still_loads_both_ways(tmp_path):
    pc = small_cache()
    pc.save(tmp_path / "t")
    for mmap in (False, True):
        got = PrefixCache.load(tmp_path / "t", mmap=mmap)
        got.check_invariants()
        assert got.match_length([1, 2, 7]) == pc.match_length([1, 2, 7])
    assert rs.RadixCache.load is not None


def test_two_heap_entries_moved_by_one_are_refused_and_nothing_hangs(tmp_path):
    # the case: ids stay in range and distinct, checksums recomputed
    pc = PrefixCache()
    for i in range(40):
        pc.insert([i, i], values=[0, 0])
    pc.save(tmp_path / "t")
    heap = np.load(tmp_path / "t" / "heap.npy")
    size = int(np.load(tmp_path / "t" / "meta.npy")[_meta_slot("heap_size")])
    # entries x and x + 1: +1 and -1 swap them, so every entry is still a
    # distinct evictable leaf, but out of place
    at = {int(v): k for k, v in enumerate(heap[:size])}
    i, j = at[10], at[11]

    def nudge(a):
        a[i] += 1
        a[j] -= 1
        return a
    edit_array(tmp_path / "t", "heap", nudge)
    for mmap in (False, True):
        with pytest.raises(TreeFormatError, match="heap"):
            PrefixCache.load(tmp_path / "t", mmap=mmap)


def _edits(a, rng):
    """Small edits of an integer array: a swap, a +1/-1 pair, a copied entry."""
    n = a.shape[0]
    if n < 2:
        return []
    i, j = (int(x) for x in rng.choice(n, 2, replace=False))
    swap, nudge, copy = a.copy(), a.copy(), a.copy()
    swap[i], swap[j] = a[j], a[i]
    with np.errstate(over="ignore"):  # an unsigned 0 - 1 wraps: an edit as good as any
        nudge[i] += 1
        nudge[j] -= 1
    copy[i] = a[j]
    return [e for e in (swap, nudge, copy) if not np.array_equal(e, a)]


@pytest.mark.parametrize("cls", [RadixCache, PrefixCache])
def test_a_load_accepts_only_trees_check_invariants_accepts(tmp_path, cls):
    """Every small edit of every saved array (checksums recomputed) is either
    refused by the load, or leaves a tree that passes the full check (an
    edit of a token or a stamp can be a valid tree too)."""
    rng = np.random.default_rng(7)
    tree = cls() if cls is RadixCache else cls(page_size=2, capacity=200)
    seqs = [rng.integers(0, 4, rng.integers(1, 9)).tolist() for _ in range(60)]
    for q in seqs:
        if cls is RadixCache:
            tree.insert(q)
        else:
            tree.insert(q, values=np.arange(len(q)))
    if cls is RadixCache:
        tree.remove(seqs[0])
    else:
        tree.lock(tree.match(seqs[1]).node)
        tree.evict(5)
    tree.save(tmp_path / "good")
    names = [f[:-4] for f in os.listdir(tmp_path / "good") if f.endswith(".npy")]
    refused = 0
    for name in sorted(names):
        good = np.load(tmp_path / "good" / f"{name}.npy")
        if good.dtype.kind not in "iu":
            continue
        for k, edited in enumerate(_edits(good, rng)):
            d = tmp_path / f"{name}-{k}"
            tree.save(d)
            edit_array(d, name, lambda a, e=edited: e)
            try:
                got = cls.load(d)
            except TreeFormatError:
                refused += 1
                continue
            got.check_invariants()  # raises if the load let a broken tree through
            if cls is PrefixCache:  # and the kernels run on it to the end
                got.evict(got.total_tokens)
                assert got.total_tokens == got.locked_tokens
                got.check_invariants()
    assert refused > 20
