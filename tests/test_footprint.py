"""compare_footprint and the two array baselines it builds (TokenTrie,
SequenceHashSet), each checked against plain Python computations."""

import json
import sys
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import radix_soa as rs
from radix_soa import workloads
from radix_soa.baselines.arrays import NO_ENTRY, SequenceHashSet, TokenTrie
from radix_soa.studies.footprint import FootprintTable, compare_footprint

# one worker runs this file: its module-scoped fixture is built once
pytestmark = pytest.mark.xdist_group("footprint")
from radix_soa.baselines.reference import ReferenceRadixTree

NAMES = ["RadixCache int64", "RadixCache int32", "token trie", "sequence hash set",
         "Python set of tuples", "Python dict-of-dicts trie", "Python radix tree"]


# ---------------------------------------------------------------- obvious models

def tuples(seqs):
    return [tuple(int(x) for x in s) for s in seqs]


def distinct_prefixes(seqs):
    return {t[:k] for t in tuples(seqs) for k in range(1, len(t) + 1)}


def trie_paths(trie):
    """Every node's path, rebuilt by walking the parent array to the root."""
    n = trie.num_nodes
    paths = []
    for v in range(1, n + 1):
        path = []
        while v != 0:
            path.append(int(trie.token[v]))
            v = int(trie.parent[v])
        paths.append(tuple(reversed(path)))
    return paths


def trie_terminals(trie):
    bits = np.unpackbits(trie.term, bitorder="little")[:trie.num_nodes + 1]
    return {p for p, b in zip(trie_paths(trie), bits[1:]) if b}


def set_contents(hs):
    off = hs.offs[:len(hs) + 1]
    return [tuple(hs.buf[off[i]:off[i + 1]].tolist()) for i in range(len(hs))]


def first_occurrence(seqs):
    seen, out = set(), []
    for t in tuples(seqs):
        out.append(t not in seen)
        seen.add(t)
    return out


def longest_prefix(stored, q):
    q = tuple(q)
    return max((k for k in range(len(q) + 1) if q[:k] in stored), default=0)


def queries_for(seqs, rng, alphabet):
    """Inserted sequences, their proper prefixes and extensions, and random ones."""
    out = []
    for t in tuples(seqs):
        out.append(list(t))
        if len(t) > 1:
            out.append(list(t[:-1]))
        out.append(list(t) + [int(rng.choice(alphabet))])
    for _ in range(10):
        out.append([int(x) for x in rng.choice(alphabet, size=int(rng.integers(1, 6)))])
    return out


def check_trie(trie, seqs, queries):
    prefixes = distinct_prefixes(seqs)
    stored = set(tuples(seqs))
    paths = trie_paths(trie)
    assert trie.num_nodes == len(prefixes)
    assert len(paths) == len(set(paths)) and set(paths) == prefixes
    assert trie_terminals(trie) == stored and len(trie) == len(stored)
    # every node sits in the table exactly once
    table = trie.table[trie.table != NO_ENTRY]
    assert sorted(table.tolist()) == list(range(1, trie.num_nodes + 1))
    assert trie.exists_batch(queries).tolist() == [tuple(q) in stored for q in queries]
    assert trie.match_prefix_batch(queries).tolist() == [longest_prefix(prefixes, q)
                                                        for q in queries]


def check_hash_set(hs, seqs, queries):
    stored = set(tuples(seqs))
    contents = set_contents(hs)
    assert len(hs) == len(stored) and len(contents) == len(set(contents))
    assert set(contents) == stored
    assert hs.num_tokens == sum(len(t) for t in stored)
    table = hs.table[hs.table != NO_ENTRY]
    assert sorted(table.tolist()) == list(range(len(hs)))
    assert hs.contains_batch(queries).tolist() == [tuple(q) in stored for q in queries]


# ---------------------------------------------------------------- token trie

def test_token_trie_by_hand():
    trie = TokenTrie()
    assert trie.insert_batch([[1, 2, 3], [1, 2, 4], [7], [1, 2, 3]]).tolist() == [
        True, True, True, False]
    assert trie.num_nodes == 5 and len(trie) == 3  # 1, 12, 123, 124, 7
    assert set(trie_paths(trie)) == {(1,), (1, 2), (1, 2, 3), (1, 2, 4), (7,)}
    assert trie.insert_batch([[1, 2]]).tolist() == [True]  # an internal node becomes terminal
    assert trie.num_nodes == 5 and len(trie) == 4
    assert trie.exists_batch([[1, 2], [1], [], [7, 7]]).tolist() == [True, False, False, False]
    assert trie.match_prefix_batch([[1, 2, 9], [], [8]]).tolist() == [2, 0, 0]


def test_token_trie_grows_across_batches():
    seqs = workloads.shared_prefix(n_sequences=300, n_prompts=5, prompt_len=40,
                                   tail_len=(1, 30), vocab=50, seed=4)
    trie = TokenTrie()
    new = np.concatenate([trie.insert_batch(seqs[i:i + 37]) for i in range(0, 300, 37)])
    assert new.tolist() == first_occurrence(seqs)
    check_trie(trie, seqs, queries_for(seqs, np.random.default_rng(0), np.arange(50)))
    rep = trie.memory_report()
    end = trie.num_nodes + 1
    assert rep["used_bytes"] == (end * 8 + end * 4 + (end + 7) // 8 + trie.table.nbytes
                                 + trie.meta.nbytes)
    assert rep["total_bytes"] >= rep["used_bytes"] and rep["nodes"] == trie.num_nodes
    # the same table rule as the radix tree: load <= 0.7
    assert trie.num_nodes * 10 <= trie.table.shape[0] * 7


def test_token_trie_rejects_empty_sequences_before_inserting():
    trie = TokenTrie()
    with pytest.raises(ValueError, match="sequence 1"):
        trie.insert_batch([[1, 2], []])
    assert trie.num_nodes == 0 and len(trie) == 0
    assert trie.insert_batch([]).tolist() == []


# ---------------------------------------------------------------- hash set

def test_hash_set_by_hand():
    hs = SequenceHashSet()
    assert hs.insert_batch([[1, 2, 3], [1, 2], [1, 2, 3], [3, 2, 1]]).tolist() == [
        True, True, False, True]
    assert set_contents(hs) == [(1, 2, 3), (1, 2), (3, 2, 1)]  # stored whole, in order
    assert hs.offs[:4].tolist() == [0, 3, 5, 8] and hs.num_tokens == 8
    assert hs.contains_batch([[1, 2], [1], [2, 1], [], [1, 2, 3, 4]]).tolist() == [
        True, False, False, False, False]


def test_hash_set_grows_and_keeps_everything():
    seqs = workloads.shared_prefix(n_sequences=500, n_prompts=3, prompt_len=20,
                                   tail_len=(0, 4), vocab=5, seed=1)  # many duplicates
    hs = SequenceHashSet()
    new = np.concatenate([hs.insert_batch(seqs[i:i + 64]) for i in range(0, 500, 64)])
    assert new.tolist() == first_occurrence(seqs)
    check_hash_set(hs, seqs, queries_for(seqs, np.random.default_rng(1), np.arange(5)))
    rep = hs.memory_report()
    assert rep["used_bytes"] == (hs.num_tokens * 8 + (len(hs) + 1) * 8 + hs.table.nbytes
                                 + hs.meta.nbytes)
    assert len(hs) * 10 <= hs.table.shape[0] * 7


def test_hash_set_rejects_empty_sequences():
    hs = SequenceHashSet()
    with pytest.raises(ValueError, match="sequence 0"):
        hs.insert_batch([[], [1]])
    assert len(hs) == 0


# ---------------------------------------------------------------- hypothesis

TOKENS = st.one_of(st.integers(0, 3), st.sampled_from([-1, 2**31, -(2**63), 2**63 - 1]))
SEQS = st.lists(st.lists(TOKENS, min_size=1, max_size=8), min_size=1, max_size=30)


@given(SEQS, st.sampled_from([np.int64, np.int32]), st.integers(1, 30))
def test_baselines_match_python_models(seqs, flat_dtype, chunk):
    fits = all(np.iinfo(flat_dtype).min <= x <= np.iinfo(flat_dtype).max for s in seqs for x in s)
    arrays = [np.array(s, flat_dtype if fits else np.int64) for s in seqs]
    alphabet = np.array(sorted({x for s in seqs for x in s} | {0, 1, 2, 3}))
    queries = queries_for(seqs, np.random.default_rng(len(seqs)), alphabet)
    trie, hs = TokenTrie(), SequenceHashSet()
    new_t = np.concatenate([trie.insert_batch(arrays[i:i + chunk]) for i in range(0, len(seqs), chunk)])
    new_h = np.concatenate([hs.insert_batch(arrays[i:i + chunk]) for i in range(0, len(seqs), chunk)])
    assert new_t.tolist() == new_h.tolist() == first_occurrence(seqs)
    check_trie(trie, seqs, queries)
    check_hash_set(hs, seqs, queries)


@pytest.mark.slow
@settings(max_examples=15)
@given(SEQS)
def test_compare_footprint_counts_match_python_models(seqs):
    small = all(-(2**31) <= x < 2**31 for s in seqs for x in s)
    t = compare_footprint(seqs, dtypes=("int64", "int32") if small else ("int64",))
    stored = set(tuples(seqs))
    assert t.sequences == len(seqs) and t.distinct == len(stored)
    assert t.tokens_inserted == sum(len(s) for s in seqs)
    assert t.tokens_stored == len(distinct_prefixes(seqs))
    assert t.row("token trie")["nodes"] == t.tokens_stored
    assert t.row("Python dict-of-dicts trie")["nodes"] == t.tokens_stored
    ref = ReferenceRadixTree()
    for s in seqs:
        ref.insert(s)
    for r in t.rows:
        assert r["bytes"] > 0
        assert r["bytes_per_stored_token"] == r["bytes"] / t.tokens_stored
        assert r["bytes_per_inserted_token"] == r["bytes"] / t.tokens_inserted
        if r["name"].startswith("RadixCache") or r["name"] == "Python radix tree":
            assert r["nodes"] == ref.num_nodes


# ---------------------------------------------------------------- compare_footprint

@pytest.fixture(scope="module")
def chat():
    seqs = workloads.shared_prefix(n_sequences=400, n_prompts=8, prompt_len=100,
                                   tail_len=(5, 60), seed=3)
    return seqs, compare_footprint(seqs)


def test_rows_and_array_bytes_match_the_structures(chat):
    seqs, t = chat
    assert [r["name"] for r in t.rows] == NAMES
    assert all(list(r) == ["name", "bytes", "allocated_bytes", "bytes_per_stored_token",
                           "bytes_per_inserted_token", "nodes", "build_seconds", "measured"]
               for r in t.rows)
    for dt in ("int64", "int32"):
        rc = rs.RadixCache(dt)
        rc.insert_batch(seqs)
        rep = rc.memory_report()
        row = t.row(f"RadixCache {dt}")
        assert (row["bytes"], row["allocated_bytes"], row["nodes"]) == (
            rep["used_bytes"], rep["total_bytes"], rc.num_nodes)
        assert t.tokens_stored == rc.num_tokens and t.distinct == len(rc)
    trie = TokenTrie()
    trie.insert_batch(seqs)
    assert t.row("token trie")["bytes"] == trie.memory_report()["used_bytes"]
    hs = SequenceHashSet()
    hs.insert_batch(seqs)
    assert t.row("sequence hash set")["bytes"] == hs.memory_report()["used_bytes"]
    for r in t.rows:
        assert r["build_seconds"] >= 0
        assert (r["allocated_bytes"] is None) == (r["measured"] == "tracemalloc")
        if r["allocated_bytes"] is not None:
            assert r["allocated_bytes"] >= r["bytes"]
    assert t.row("sequence hash set")["nodes"] is None
    assert t.row("Python set of tuples")["nodes"] is None


def test_python_rows_count_tuples_and_ints(chat):
    """Random tokens from a 32,000 vocabulary are ints CPython does not cache:
    each costs a pointer in its tuple and an int object (>= 28 bytes)."""
    seqs, t = chat
    distinct = {tuple(s.tolist()) for s in seqs}
    big = sum(1 for s in distinct for x in s if x > 256)
    py_set = t.row("Python set of tuples")["bytes"]
    assert py_set >= big * (8 + 28) + len(distinct) * 40
    assert py_set <= 2 * sum(len(s) for s in distinct) * (8 + 32) + 2**20
    # the object tree holds each stored token once (a pointer and an int)
    assert t.row("Python radix tree")["bytes"] >= 0.9 * t.tokens_stored * (8 + 28)


def test_python_rows_count_short_tuples_from_free_lists():
    """CPython reuses short tuples from free lists; objects put there before
    tracing started must not make the set look smaller than it is."""
    import sys

    seqs = [[1000 + i, 2000 + i, 3000 + i] for i in range(300)]
    junk = [tuple(s) for s in seqs]  # fill the free list of 3-tuples
    del junk
    t = compare_footprint(seqs, dtypes=("int64",))
    expect = {tuple(s) for s in seqs}
    floor = sys.getsizeof(expect) + sum(sys.getsizeof(x) for x in expect) + 900 * 28
    assert t.row("Python set of tuples")["bytes"] >= floor


def test_the_dict_of_dicts_trie_row_holds_a_dict_per_stored_token(chat):
    """The hand-written baseline: one dict (>= 64 bytes empty) per stored
    token, so it costs more than the token trie's arrays many times over."""
    seqs, t = chat
    row = t.row("Python dict-of-dicts trie")
    assert row["measured"] == "tracemalloc" and row["allocated_bytes"] is None
    assert row["bytes"] >= t.tokens_stored * sys.getsizeof({})
    assert row["bytes"] >= 5 * t.row("RadixCache int64")["bytes"]


def test_the_table_plots_a_bar_per_row(chat):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, t = chat
    for per, key in (("stored", "bytes_per_stored_token"), ("total", "bytes")):
        ax = t.plot(per=per)
        bars = ax.patches
        assert [b.get_width() for b in bars] == [r[key] for r in t.rows]
        assert [tick.get_text() for tick in ax.get_yticklabels()] == NAMES
        assert ax.get_xscale() == "log"
        plt.close(ax.figure)
    with pytest.raises(ValueError, match="per must be one of"):
        t.plot(per="node")


PY_ROWS = ("Python set of tuples", "Python dict-of-dicts trie", "Python radix tree")


@pytest.mark.slow
def test_python_rows_do_not_depend_on_tracemalloc_already_running():
    seqs = workloads.shared_prefix(n_sequences=50, n_prompts=2, prompt_len=30,
                                   tail_len=(5, 10), seed=5)
    plain = compare_footprint(seqs, dtypes=("int64",))
    tracemalloc.start()
    try:
        junk = [object() for _ in range(1000)]  # traced before the build, freed during it
        traced = compare_footprint(seqs, dtypes=("int64",))
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()
    del junk
    for name in PY_ROWS:
        a, b = plain.row(name)["bytes"], traced.row(name)["bytes"]
        assert abs(a - b) <= 0.02 * a, name


@pytest.mark.slow
def test_python_rows_ignore_other_threads_allocations():
    """Another thread allocating and freeing during the measurement (in the
    full suite: leftover threads, Numba, the gc) counts nothing; a global
    before/after total counted it and varied by more than the row itself."""
    import threading

    seqs = workloads.shared_prefix(n_sequences=50, n_prompts=2, prompt_len=30,
                                   tail_len=(5, 10), seed=5)
    quiet = compare_footprint(seqs, dtypes=("int64",))
    stop = threading.Event()

    def churn():
        held = []
        while not stop.is_set():
            held.append([object() for _ in range(50)])
            if len(held) > 200:
                held.clear()

    th = threading.Thread(target=churn)
    th.start()
    try:
        noisy = [compare_footprint(seqs, dtypes=("int64",)) for _ in range(3)]
        tracemalloc.start()
        try:
            noisy.append(compare_footprint(seqs, dtypes=("int64",)))
        finally:
            tracemalloc.stop()
    finally:
        stop.set()
        th.join()
    for name in PY_ROWS:
        a = quiet.row(name)["bytes"]
        for t in noisy:
            assert abs(t.row(name)["bytes"] - a) <= 0.02 * a, name


def test_table_text_dict_and_repr(chat):
    seqs, t = chat
    text = str(t)
    lines = text.splitlines()
    assert lines[0].startswith(f"{len(seqs):,} sequences") and "prefix sharing" in lines[0]
    assert len(lines) == 2 + len(NAMES)
    col = lines[1].index("measured")
    for line, name in zip(lines[2:], NAMES):
        assert line.startswith(name)
        assert line[col:] in ("arrays", "tracemalloc")
    # right-aligned numeric columns end at the same place on every line
    end = lines[1].index("bytes") + len("bytes")
    assert all(line[end - 1].isdigit() and line[end] == " " for line in lines[2:])
    d = t.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["tokens_stored"] == t.tokens_stored and len(d["rows"]) == len(NAMES)
    d["rows"][0]["bytes"] = -1
    assert t.rows[0]["bytes"] > 0  # to_dict hands out copies
    assert repr(t).startswith("FootprintTable(sequences=400") and "token trie" in repr(t)
    with pytest.raises(KeyError, match="no row"):
        t.row("B-tree")


@pytest.mark.slow
def test_inputs_batch_array_and_dtypes():
    seqs = [[5, 6, 7], [5, 6, 8], [5, 6, 7]]
    a = compare_footprint(seqs, dtypes=("int64",))
    b = compare_footprint(rs.pack(seqs), dtypes=np.int64)
    c = compare_footprint(np.array(seqs), dtypes=["int64"])
    for t in (a, b, c):
        assert [r["name"] for r in t.rows] == ["RadixCache int64"] + NAMES[2:]
        assert (t.distinct, t.tokens_stored) == (2, 4)
    u = compare_footprint(seqs, dtypes=("uint16", "int64"))
    assert [r["name"] for r in u.rows][:2] == ["RadixCache uint16", "RadixCache int64"]
    assert isinstance(u, FootprintTable)


@pytest.mark.parametrize("seqs, kwargs, exc, match", [
    ([], {}, ValueError, "at least one sequence"),
    ([[1], []], {}, ValueError, "sequence 1 is empty"),
    ([[1]], {"dtypes": ()}, ValueError, "at least one"),
    ([[1]], {"dtypes": ("int32", "int32")}, ValueError, "repeat"),
    ([[1]], {"dtypes": ("float32",)}, TypeError, "dtype"),
    ([[1, 2**40]], {}, OverflowError, "int32"),
    ([[-1]], {"dtypes": ("uint16",)}, OverflowError, "uint16"),
    ([[1.5]], {}, TypeError, "integers"),
    ("abc", {}, TypeError, "sequence of sequences"),
])
def test_bad_input_raises(seqs, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        compare_footprint(seqs, **kwargs)


# ---------------------------------------------------------------- the project target

@pytest.mark.slow
def test_shared_prefix_radix_vs_python_object_tree():
    """RadixCache against the pure-Python object radix tree on the
    shared-prefix workload (the 5x target itself is tracked by the memory
    benchmarks, not asserted here).

    Measured (Python 3.11, tracemalloc): 4.97x at 2,000 sequences, 4.99x at
    the default 20,000. Both trees store each shared token once, so the ratio
    is about (8-byte pointer + 32-byte int object + node overhead) / (8-byte
    token + node overhead): the int64 token buffer alone caps it near 5x.
    int32 halves the buffer and clears the target easily.
    """
    t = compare_footprint(workloads.shared_prefix(n_sequences=2_000, seed=0))
    py = t.row("Python radix tree")["bytes"]
    r64 = py / t.row("RadixCache int64")["bytes"]
    r32 = py / t.row("RadixCache int32")["bytes"]
    assert r32 >= 5, f"int32: {r32:.2f}x"
    assert r64 >= 4.8, f"int64: {r64:.2f}x (regression below the measured 4.97x)"
    # the 5x array-only ratio also holds against the Python set of tuples
    assert t.row("Python set of tuples")["bytes"] >= 5 * t.row("RadixCache int64")["bytes"]


@pytest.mark.slow
def test_the_public_tracemalloc_path_counts_what_the_fast_path_counts(monkeypatch):
    """``_held_by_builders`` reads CPython's raw trace tuples when they have
    the shape it checks, else ``Snapshot.statistics``: both give the same
    rows, and a snapshot whose traces are not that shape takes the public path."""
    from radix_soa.studies import footprint as F

    seqs = workloads.shared_prefix(n_sequences=40, n_prompts=2, prompt_len=30,
                                   tail_len=(5, 10), seed=6)
    fast = compare_footprint(seqs, dtypes=("int64",))
    calls = []

    def public_only(snap):
        calls.append(snap)
        return None

    monkeypatch.setattr(F, "_raw_traces", public_only)
    public = compare_footprint(seqs, dtypes=("int64",))
    assert calls  # the public path ran
    for name in PY_ROWS:
        a, b = fast.row(name)["bytes"], public.row(name)["bytes"]
        assert a > 0 and abs(a - b) <= 0.02 * a, name
    monkeypatch.undo()

    class Odd:
        class traces:
            _traces = [("not", "a trace")]
    assert F._raw_traces(Odd()) is None
    assert F._raw_traces(object()) is None
