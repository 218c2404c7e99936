"""Rules every entry point shares: one integer validator, errors that name
what they are about, statistics that move with the tree, reports as data,
and trees saved by the previous format version."""

import json

import numpy as np
import pytest

import radix_soa as rs
from radix_soa import PrefixCache, RadixCache
from radix_soa.cli import main


@pytest.mark.parametrize("bad, exc", [(2.0, TypeError), (1.5, TypeError), ("2", TypeError),
                                      (True, TypeError), (0, ValueError), (-3, ValueError)])
def test_page_size_is_checked_the_same_everywhere(bad, exc):
    with pytest.raises(exc, match="page_size"):
        PrefixCache(page_size=bad)
    with pytest.raises(exc, match="page_size"):
        rs.replay([[1, 2, 3]], page_size=bad)


@pytest.mark.parametrize("bad", ["2.0", "0", "x"])
def test_the_command_line_refuses_the_same_page_sizes(bad, capsys):
    with pytest.raises(SystemExit) as e:
        main(["study", "--page-size", bad, "--points", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--page-size" in err[0]


@pytest.mark.parametrize("bad, exc", [(4.0, TypeError), (-1, ValueError)])
def test_capacity_and_evict_counts_are_checked_the_same(bad, exc):
    with pytest.raises(exc, match="capacity"):
        PrefixCache(capacity=bad)
    with pytest.raises(exc, match="capacity"):
        rs.replay([[1, 2]], capacity=bad)
    with pytest.raises(exc, match="num_tokens"):
        PrefixCache().evict(bad)


def test_value_errors_say_value():
    pc = PrefixCache()
    with pytest.raises(TypeError, match="values must be integers; element 1") as e:
        pc.insert([1, 2], values=[5, 2.5])
    assert "token" not in str(e.value)
    with pytest.raises(OverflowError, match="value 18446744073709551615 at position 0"):
        pc.insert([1], values=[2**64 - 1])
    with pytest.raises(ValueError, match="values has 1 entries for 2 tokens"):
        pc.insert([1, 2], values=[5])
    assert pc.total_tokens == 0


def test_statistics_move_with_the_tree():
    pc = PrefixCache(capacity=6)
    pc.insert([1, 2, 3, 4], values=[1, 2, 3, 4])
    pc.match([1, 2, 9])
    pc.match_batch([[1, 2, 3], [7]])
    pc.insert([5, 6, 7, 8], values=[5, 6, 7, 8])  # evicts 2 to fit
    st = pc.stats
    assert (st["lookups"], st["query_tokens"], st["hit_tokens"]) == (3, 7, 5)
    assert st["inserted_tokens"] == 8 and st["evicted_tokens"] == 2
    clone = PrefixCache.__new__(PrefixCache)
    clone.__setstate__(pc.__getstate__())
    assert clone.stats == st


def test_memory_report_counts_are_data():
    counts = RadixCache().memory_report()["counts"]
    assert counts == {"numpy_array_bytes": True, "dead_token_runs_in_used": True,
                      "child_table_whole": True, "python_object_overhead": False}


def write_header(path, header):
    """Write an edited header with its checksum recomputed (an edit the
    checksum cannot see)."""
    from radix_soa._tree.persist import header_crc
    header["header_crc32"] = header_crc(header)
    (path / "header.json").write_text(json.dumps(header))


def _as_version_1(path):
    """Rewrite a saved PrefixCache the way format version 1 stored it: 16
    counter slots, statistics and roots in the header, roots' start 0, the
    child table as int32 node ids."""
    header = json.loads((path / "header.json").read_text())
    meta = np.load(path / "meta.npy")
    stats = {name: int(meta[slot]) for name, slot in rs._kernels.layout.STAT_SLOTS.items()}
    start = np.load(path / "start.npy")
    parent, length = np.load(path / "parent.npy"), np.load(path / "length.npy")
    roots = np.flatnonzero((parent == -1) & (length == 0))
    keys = header["state"].pop("namespaces")
    header["state"]["roots"] = [[keys[int(start[r])], int(r)] for r in roots]
    header["state"]["stats"] = stats
    start[roots] = 0
    meta = meta[:16].copy()
    meta[13:] = 0
    table = np.load(path / "table.npy")
    table = np.where(table != -1, table & 0xFFFFFFFF, -1).astype(np.int32)
    from radix_soa._tree.persist import _crc
    for name, arr in (("meta", meta), ("start", start), ("table", table)):
        np.save(path / f"{name}.npy", arr)
        header["arrays"][name] = {"dtype": arr.dtype.name, "length": int(arr.shape[0]),
                                  "crc32": _crc(arr)}
    header["version"] = 1
    header.pop("header_crc32")
    (path / "header.json").write_text(json.dumps(header))


@pytest.mark.parametrize("mmap", [False, True])
def test_trees_saved_by_format_version_1_still_load(tmp_path, mmap):
    pc = PrefixCache()
    pc.insert([1, 2, 3], values=[7, 8, 9])
    pc.insert([4, 5], values=[1, 2], namespace="b")
    pc.insert([6], values=[3], namespace=9)
    pc.match([1, 2])
    pc.save(tmp_path / "t")
    want_stats = pc.stats
    _as_version_1(tmp_path / "t")
    old = PrefixCache.load(tmp_path / "t", mmap=mmap)
    assert old.namespaces == [0, "b", 9]
    assert old.stats == want_stats
    assert old.match_length([4, 5], namespace="b") == 2 and old.match_length([6], namespace=9) == 1
    old.check_invariants()
    if not mmap:
        old.insert([1, 2, 3, 4], values=[0, 0, 0, 1], namespace="c")
        assert old.namespaces == [0, "b", 9, "c"]
        old.save(tmp_path / "again")
        again = PrefixCache.load(tmp_path / "again")
        assert again.namespaces == [0, "b", 9, "c"] and again.stats == old.stats


def test_a_header_naming_too_few_namespaces_is_refused(tmp_path):
    pc = PrefixCache()
    pc.insert([1], values=[1], namespace="x")
    pc.save(tmp_path / "t")
    header = json.loads((tmp_path / "t" / "header.json").read_text())
    header["state"]["namespaces"] = [0]
    write_header(tmp_path / "t", header)
    with pytest.raises(rs.TreeFormatError, match="namespace"):
        PrefixCache.load(tmp_path / "t")


def test_a_refused_insert_does_not_grow_the_arrays():
    pc = PrefixCache(capacity=100)
    before = pc.memory_report()["total_bytes"]
    with pytest.raises(rs.CacheFullError):
        pc.insert(np.zeros(1_000_000, np.int64), values=np.zeros(1_000_000, np.int64))
    assert pc.memory_report()["total_bytes"] == before


def test_a_version_1_tree_mapped_then_saved_loads_again(tmp_path):
    pc = PrefixCache()
    for ns in (0, "b", 7):
        pc.insert([1, 2], values=[1, 2], namespace=ns)
    pc.save(tmp_path / "t")
    _as_version_1(tmp_path / "t")
    mapped = PrefixCache.load(tmp_path / "t", mmap=True)
    mapped.save(tmp_path / "again")
    again = PrefixCache.load(tmp_path / "again")
    assert again.namespaces == [0, "b", 7] and again.match_length([1, 2], namespace=7) == 2
    import pickle
    assert pickle.loads(pickle.dumps(mapped)).namespaces == [0, "b", 7]


@pytest.mark.parametrize("field, value", [("capacity", 1), ("capacity", True), ("page_size", 2),
                                          ("namespaces", [0, 0])])
def test_header_state_is_checked_against_the_arrays(tmp_path, field, value):
    pc = PrefixCache(capacity=50)
    pc.insert([1, 2, 3], values=[1, 2, 3])
    pc.save(tmp_path / "t")
    header = json.loads((tmp_path / "t" / "header.json").read_text())
    header["state"][field] = value
    write_header(tmp_path / "t", header)
    with pytest.raises(rs.TreeFormatError):
        PrefixCache.load(tmp_path / "t")


def test_the_storage_declares_each_array_it_publishes():
    """``TreeStorage``'s class annotations (what mypy sees of the views
    ``_publish`` sets) name every array of the tree, and only attributes a
    storage really has."""
    from radix_soa._kernels.layout import TREE_FIELDS
    from radix_soa._tree.storage import TreeStorage

    declared = set(TreeStorage.__annotations__)
    assert set(TREE_FIELDS) <= declared
    s = TreeStorage(track=True)
    assert declared <= set(vars(s))
    assert not declared & set(vars(TreeStorage))  # annotations only: no class attributes


def test_the_prefix_cache_binds_its_features_without_mixins():
    """``PrefixCache`` is one class over ``TreeCache`` whose methods are
    functions of its package's feature modules, bound in ``core``: no
    mixin anywhere in the package, and nothing declared twice."""
    import ast
    import inspect
    from pathlib import Path

    import radix_soa
    from radix_soa import PrefixCache
    from radix_soa._tree.base import TreeCache

    assert PrefixCache.__bases__ == (TreeCache,)
    package = Path(radix_soa.__file__).parent
    classes = [n.name for p in package.rglob("*.py")
               for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef)]
    assert not [c for c in classes if c.endswith("Mixin")]
    bound = {name: v for name, v in vars(PrefixCache).items()
             if inspect.isfunction(getattr(v, "__func__", v))}
    homes = {getattr(v, "__func__", v).__module__ for v in bound.values()}
    assert homes >= {"radix_soa.prefix_cache.lookup", "radix_soa.prefix_cache.mutation",
                     "radix_soa.prefix_cache.lifecycle", "radix_soa.prefix_cache.batch_lifecycle"}
    assert all(h.startswith("radix_soa.prefix_cache.") for h in homes), homes
    for name, v in bound.items():  # each bound under the name it was defined with
        assert getattr(v, "__func__", v).__name__ == name, name
    assert PrefixCache._writable is TreeCache._writable
    assert PrefixCache._drain_readers is TreeCache._drain_readers


def test_the_matching_operation_has_one_name_on_every_class():
    import radix_soa as rs

    rc, pc = rs.RadixCache(), rs.PrefixCache(values=False)
    rc.insert([1, 2, 3])
    pc.insert([1, 2, 3])
    q = [1, 2, 9]
    assert rc.match_length(q) == pc.match_length(q) == rc.match_prefix(q) == 2
    assert rc.match_length_batch([q, [5]]).tolist() == pc.match_length_batch([q, [5]]).tolist() \
        == rc.match_prefix_batch([q, [5]]).tolist() == [2, 0]
    assert rs.RadixCache.match_prefix is rs.RadixCache.match_length  # the first name, kept


def test_a_cache_with_values_asked_for_none_names_values_false():
    import pytest

    import radix_soa as rs

    pc = rs.PrefixCache()
    for call in (lambda: pc.insert([1, 2]), lambda: pc.insert_batch([[1, 2]])):
        with pytest.raises(ValueError, match=r"pass values=, or make it with "
                                             r"PrefixCache\(values=False\)"):
            call()
    assert pc.total_tokens == 0
