"""memory_report, compact, save/load (copy and mmap), pickle."""

import json
import os
import pickle

import numpy as np
import pytest

import radix_soa as rs
from radix_soa import PrefixCache, RadixCache
from radix_soa._tree import persist as _persist
from radix_soa._tree.results import ReadOnlyTreeError, TreeFormatError


def contents(rc):
    flat, off = rc.to_csr()
    return flat.tolist(), off.tolist(), rc.num_nodes, rc.num_tokens


def chat(n=300, seed=0):
    return rs.workloads.shared_prefix(n_sequences=n, n_prompts=7, prompt_len=120,
                                      tail_len=(5, 60), seed=seed)


@pytest.fixture
def tree():
    rc = RadixCache()
    seqs = chat()
    rc.insert_batch(seqs)
    for s in seqs[::3]:
        rc.remove(s)
    return rc


@pytest.fixture
def prefix_cache():
    pc = PrefixCache(capacity=20_000, page_size=2)
    for i, s in enumerate(chat(200, seed=1)):
        pc.insert(s, values=s * 10, namespace="a" if i % 2 else 7)
    for s in chat(40, seed=1):
        pc.match(s, namespace=7)
    pc.lock(pc.match(chat(1, seed=1)[0], namespace=7).node)
    pc.evict(500)
    return pc


# ---------------------------------------------------------------- memory

def test_memory_report_is_exact_for_the_arrays(tree):
    rep = tree.memory_report()
    s = tree._s
    used = (s.count("tok_used") * 8 + s.node_end * (8 + 4 + 4 + 4 + 4)
            + (s.node_end + 7) // 8 + s.table.nbytes + s.meta.nbytes)
    assert rep["used_bytes"] == used
    allocated = sum(getattr(s, n).nbytes for n in ("tokens", "values", "start", "length", "parent",
                                                   "nchild", "cxor", "term", "table", "meta"))
    assert rep["total_bytes"] == allocated
    assert rep["slack_bytes"] == allocated - used
    assert rep["tokens_stored"] == tree.num_tokens and rep["nodes"] == tree.num_nodes
    assert rep["tokens_inserted"] == sum(len(x) for x in chat())
    assert rep["compression_ratio"] == pytest.approx(rep["tokens_inserted"] / rep["tokens_stored"])
    assert rep["dead_tokens"] > 0  # removes left dead runs behind
    assert "counts" in rep and set(rep["arrays"]) >= {"tokens", "table", "start"}


def test_tokens_inserted_counts_every_token_handed_to_insert():
    rc = RadixCache()
    rc.insert([1, 2, 3])
    rc.insert([1, 2, 3])
    rc.insert_batch([[1, 2], [4]])
    assert rc.memory_report()["tokens_inserted"] == 9
    pc = PrefixCache(values=False)
    pc.insert([1, 2, 3])
    pc.insert([1, 2])
    assert pc.memory_report()["tokens_inserted"] == 5


@pytest.mark.parametrize("dtype, width", [(np.int64, 8), (np.int32, 4), (np.uint16, 2)])
def test_narrow_dtypes_shrink_the_token_buffer(dtype, width):
    rc = RadixCache(dtype=dtype)
    rc.insert_batch(chat())
    rep = rc.memory_report()
    assert rep["arrays"]["tokens"]["used_bytes"] == width * rep["tokens_stored"]


# ---------------------------------------------------------------- compact

def test_compact_reclaims_dead_runs_and_slack(tree):
    before = contents(tree)
    rep0 = tree.memory_report()
    tree.compact()
    tree.check_invariants()
    assert contents(tree) == before
    rep = tree.memory_report()
    assert rep["dead_tokens"] == 0
    assert rep["arrays"]["tokens"]["used_bytes"] == 8 * tree.num_tokens
    assert rep["total_bytes"] < rep0["total_bytes"]
    assert rep["arrays"]["tokens"]["allocated_bytes"] <= 1.25 * 8 * tree.num_tokens + 2048
    tree.insert([1, 2, 3])  # still mutable and growing
    tree.check_invariants()
    tree.compact(headroom=0)
    rep = tree.memory_report()
    assert rep["total_bytes"] - rep["used_bytes"] < 2048  # only the minimum sizes' slack
    with pytest.raises(ValueError):
        tree.compact(headroom=-1)


def test_compact_keeps_prefix_cache_values_locks_and_handles(prefix_cache):
    pc = prefix_cache
    probe = chat(200, seed=1)
    before = [(pc.match_length(s, namespace=ns)) for s, ns in zip(probe, [7, "a"] * 100)]
    node = pc.match(probe[3], namespace="a")
    pc.lock(node.node)
    locked = pc.locked_tokens
    pc.compact()
    pc.check_invariants()
    assert pc.memory_report()["dead_tokens"] == 0
    assert [pc.match_length(s, namespace=ns) for s, ns in zip(probe, [7, "a"] * 100)] == before
    assert pc.locked_tokens == locked
    pc.unlock(node.node)  # the handle survived
    m = pc.match(probe[3], namespace="a")
    assert m.values.tolist() == (probe[3][: m.length] * 10).tolist()


# ---------------------------------------------------------------- save / load

@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16])
def test_save_load_round_trip(tmp_path, dtype):
    rc = RadixCache(dtype=dtype)
    rc.insert_batch(chat())
    rc.remove(chat()[0])
    rc.save(tmp_path / "t")
    back = RadixCache.load(tmp_path / "t")
    back.check_invariants()
    assert back.dtype == np.dtype(dtype)
    assert contents(back) == contents(rc)
    assert back.memory_report()["tokens_inserted"] == rc.memory_report()["tokens_inserted"]
    # it keeps working like the original
    for t in (rc, back):
        t.insert([5, 6, 7])
        t.remove(chat()[1])
    assert contents(back) == contents(rc)


def test_prefix_cache_round_trip_behaves_identically(tmp_path, prefix_cache):
    pc = prefix_cache
    pc.save(tmp_path / "p")
    back = PrefixCache.load(tmp_path / "p")
    back.check_invariants()
    assert (back.capacity, back.page_size, back.namespaces) == (pc.capacity, pc.page_size, pc.namespaces)
    assert back.stats == pc.stats and back.locked_tokens == pc.locked_tokens
    for cache in (pc, back):
        cache.insert(np.arange(1000), values=np.arange(1000), namespace="a")
    assert back.evict(3000).values.tolist() == pc.evict(3000).values.tolist()
    assert back.stats == pc.stats


@pytest.mark.slow
def test_mmap_answers_reads_and_refuses_writes(tmp_path, tree, prefix_cache):
    tree.save(tmp_path / "t")
    mm = RadixCache.load(tmp_path / "t", mmap=True)
    assert mm.read_only
    seqs = chat()
    assert mm.exists_batch(seqs).tolist() == tree.exists_batch(seqs).tolist()
    assert mm.match_prefix_batch(seqs, parallel=True).tolist() == tree.match_prefix_batch(seqs).tolist()
    assert [mm.exists(s) for s in seqs[:20]] == [tree.exists(s) for s in seqs[:20]]
    assert contents(mm) == contents(tree)
    mm.check_invariants()
    assert mm.memory_report()["tokens_stored"] == tree.num_tokens
    for call in (lambda: mm.insert([1]), lambda: mm.remove(seqs[1]), lambda: mm.insert_batch([[1]]),
                 mm.compact):
        with pytest.raises(ReadOnlyTreeError):
            call()
    prefix_cache.save(tmp_path / "p")
    pm = PrefixCache.load(tmp_path / "p", mmap=True)
    probe = chat(50, seed=1)
    assert pm.match_length_batch(probe, namespace="a").tolist() == \
        prefix_cache.match_length_batch(probe, namespace="a").tolist()
    for call in (lambda: pm.match([1, 2]), lambda: pm.insert([1, 2], values=[1, 2]),
                 lambda: pm.evict(2), lambda: pm.match_batch([[1, 2]]), pm.compact):
        with pytest.raises(ReadOnlyTreeError):
            call()


def _kernel_signatures():
    import importlib
    import pkgutil

    import radix_soa._kernels as K

    out = {}
    for m in pkgutil.iter_modules(K.__path__):
        mod = importlib.import_module(f"radix_soa._kernels.{m.name}")
        out.update({(m.name, k): len(v.signatures) for k, v in vars(mod).items()
                    if hasattr(v, "signatures")})
    return out


def test_a_memory_mapped_tree_runs_the_kernels_of_an_in_memory_one(tmp_path):
    # the maps are copy-on-write: the kernels see writable arrays, the same
    # types as an in-memory tree's, so mapping a tree compiles nothing new
    from radix_soa._warmup import warmup_radix

    warmup_radix()
    before = _kernel_signatures()
    rc = RadixCache()
    rc.insert_batch(chat(50))
    rc.save(tmp_path / "t")
    files = {p.name: p.read_bytes() for p in (tmp_path / "t").iterdir()}
    mm = RadixCache.load(tmp_path / "t", mmap=True)
    seqs = chat(60, seed=3)
    assert mm.exists_batch(seqs).tolist() == rc.exists_batch(seqs).tolist()
    assert mm.match_prefix_batch(seqs, parallel=True).tolist() == \
        rc.match_prefix_batch(seqs, parallel=True).tolist()
    assert [mm.exists(s) for s in seqs[:10]] == [rc.exists(s) for s in seqs[:10]]
    assert [mm.match_prefix(s) for s in seqs[:10]] == [rc.match_prefix(s) for s in seqs[:10]]
    assert contents(mm) == contents(rc)
    after = _kernel_signatures()
    assert {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v} == {}
    with pytest.raises(ReadOnlyTreeError):
        mm.insert([1, 2, 3])
    del mm
    assert {p.name: p.read_bytes() for p in (tmp_path / "t").iterdir()} == files


def test_save_overwrites_atomically_and_leaves_no_temporaries(tmp_path, tree, monkeypatch):
    target = tmp_path / "t"
    tree.save(target)
    old = contents(tree)
    tree.insert([424242])
    calls = []
    real_save = np.save

    def crash_midway(path, arr, *a, **k):
        calls.append(path)
        if len(calls) == 4:
            raise OSError("disk died")
        return real_save(path, arr, *a, **k)

    monkeypatch.setattr(np, "save", crash_midway)
    with pytest.raises(OSError):
        tree.save(target)
    monkeypatch.setattr(np, "save", real_save)
    assert contents(RadixCache.load(target)) == old  # the old tree is intact
    assert sorted(os.listdir(tmp_path)) == ["t"]  # no half-written directories
    with pytest.raises(OSError):
        monkeypatch.setattr(np, "save", crash_midway)
        calls.clear()
        tree.save(tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


def corrupt(tmp_path, tree, how):
    d = tmp_path / "t"
    tree.save(d)
    header = json.loads((d / "header.json").read_text())
    if how == "truncated":
        raw = (d / "start.npy").read_bytes()
        (d / "start.npy").write_bytes(raw[: len(raw) // 2])
    elif how == "flipped":
        raw = bytearray((d / "tokens.npy").read_bytes())
        raw[-3] ^= 0xFF
        (d / "tokens.npy").write_bytes(bytes(raw))
    elif how == "bad_index":
        arr = np.load(d / "parent.npy")
        arr[3] = 10**6
        np.save(d / "parent.npy", arr)
        header["arrays"]["parent"]["crc32"] = _persist._crc(arr)
    elif how == "missing_file":
        (d / "table.npy").unlink()
    elif how == "missing_header":
        (d / "header.json").unlink()
        return d
    elif how == "foreign":
        header = {"format": "something-else"}
    elif how == "version":
        header["version"] = 99
    elif how == "class":
        header["class"] = "PrefixCache"
    elif how == "dtype":
        header["dtype"] = "float32"
    elif how == "length":
        header["arrays"]["length"]["length"] += 1
    elif how == "not_json":
        (d / "header.json").write_text("{not json")
        return d
    (d / "header.json").write_text(json.dumps(header))
    return d


CORRUPTIONS = ["truncated", "flipped", "bad_index", "missing_file", "missing_header", "foreign",
               "version", "class", "dtype", "length", "not_json"]


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_damaged_trees_are_refused_with_a_clear_error(tmp_path, tree, how):
    d = corrupt(tmp_path, tree, how)
    with pytest.raises(TreeFormatError):
        RadixCache.load(d)
    if how != "flipped":  # token checksums are skipped on a memory-mapped load
        with pytest.raises(TreeFormatError):
            RadixCache.load(d, mmap=True)


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        RadixCache.load(tmp_path / "nope")


# ---------------------------------------------------------------- pickle

def test_pickle_round_trips_exactly(tree, prefix_cache):
    back = pickle.loads(pickle.dumps(tree))
    assert contents(back) == contents(tree)
    back.check_invariants()
    pc = pickle.loads(pickle.dumps(prefix_cache))
    pc.check_invariants()
    assert pc.stats == prefix_cache.stats and pc.namespaces == prefix_cache.namespaces
    for cache in (pc, prefix_cache):
        cache.insert(np.arange(500), values=np.arange(500), namespace=7)
    assert pc.evict(2000).values.tolist() == prefix_cache.evict(2000).values.tolist()


def test_pickled_mmap_tree_becomes_an_ordinary_copy(tmp_path, tree):
    tree.save(tmp_path / "t")
    mm = RadixCache.load(tmp_path / "t", mmap=True)
    back = pickle.loads(pickle.dumps(mm))
    assert not back.read_only
    back.insert([9, 9, 9])
    assert back.exists([9, 9, 9])
