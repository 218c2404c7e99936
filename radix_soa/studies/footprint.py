"""What a set of token sequences costs in memory: ``RadixCache`` next to the
alternatives one might build instead, all fed the same sequences.

``compare_footprint(seqs)`` builds each alternative and returns a
``FootprintTable`` with one row per structure:

==============================  ==============================================  ===============
row                             what it is                                      bytes measured
==============================  ==============================================  ===============
``RadixCache <dtype>``          this project's radix tree, once per dtype       ``memory_report``
``token trie``                  one node per token (int64 token, int32          array bytes
                                parent, terminal bit) + a child table keyed by
                                ``(parent, token)`` (``baselines.arrays``)
``sequence hash set``           distinct sequences whole in one int64 buffer    array bytes
                                + offsets + a table of sequence ids keyed by a
                                hash of the whole sequence (no prefix sharing)
``Python set of tuples``        ``{tuple(ints), ...}``                          ``tracemalloc``
``Python dict-of-dicts trie``   ``{token: {token: ...}}``, one dict per token,  ``tracemalloc``
                                ``None: True`` marking a sequence's end (the
                                first baseline one writes by hand)
``Python radix tree``           ``baselines.reference.ReferenceRadixTree``      ``tracemalloc``
==============================  ==============================================  ===============

Array rows count "used" bytes the way ``RadixCache.memory_report`` does: each
array up to its high-water mark and every hash table whole (its empty slots
are what keep probes short); ``allocated_bytes`` adds the growth slack. All
three array structures grow tables by the same rule (load at most 0.7,
doubled when full). Python rows are the bytes ``tracemalloc`` still sees
allocated by the build's own code once the structure is built (every tuple,
int, node and dict it holds; small ints below 257 are cached by CPython and
cost nothing; what other threads allocate meanwhile is not counted). Their
build time is taken on a separate, untraced build, since tracing every
allocation makes a build 10-20x slower; that traced build is also what
dominates the running time of ``compare_footprint`` (a few microseconds per
inserted token).

Every ``bytes_per_stored_token`` divides by the radix tree's stored tokens
(the distinct non-empty prefixes, which is also the token trie's node count),
so rows compare directly; ``bytes_per_inserted_token`` divides by every token
handed in.
"""

import gc
import time
import tracemalloc

import numpy as np

from .._tree.storage import token_dtype
from ..baselines import reference as reference_module
from ..baselines.arrays import SequenceHashSet, TokenTrie
from ..baselines.reference import ReferenceRadixTree
from .._input.batch import pack
from ..radix_cache import RadixCache

__all__ = ["compare_footprint", "FootprintTable"]

COLUMNS = ("name", "bytes", "allocated_bytes", "bytes_per_stored_token",
           "bytes_per_inserted_token", "nodes", "build_seconds", "measured")


class FootprintTable:
    """What ``compare_footprint`` measured: one row (a dict) per structure,
    the totals of the sequences built, and ``plot()``.

    Each row has the keys

    - ``name``; ``bytes``: bytes in use; ``allocated_bytes``: bytes allocated
      (array rows; ``None`` for Python rows, whose slack is inside ``bytes``);
    - ``bytes_per_stored_token`` (``bytes`` / the radix tree's stored tokens),
      ``bytes_per_inserted_token`` (``bytes`` / all tokens inserted);
    - ``nodes`` (tree and trie rows; ``None`` for the sets); ``build_seconds``;
    - ``measured``: ``"arrays"`` or ``"tracemalloc"``.

    Totals: ``sequences`` (inserted), ``distinct``, ``tokens_inserted``,
    ``tokens_stored``.
    """

    def __init__(self, rows, *, sequences, distinct, tokens_inserted, tokens_stored):
        self.rows = [dict(r) for r in rows]
        self.sequences = int(sequences)
        self.distinct = int(distinct)
        self.tokens_inserted = int(tokens_inserted)
        self.tokens_stored = int(tokens_stored)

    def row(self, name):
        """The row called ``name`` (``KeyError`` naming the rows otherwise)."""
        for r in self.rows:
            if r["name"] == name:
                return r
        raise KeyError(f"no row {name!r}; rows are {[r['name'] for r in self.rows]}")

    def to_dict(self):
        """Plain, JSON-serialisable dict: the totals and ``rows`` (copies)."""
        return {"sequences": self.sequences, "distinct_sequences": self.distinct,
                "tokens_inserted": self.tokens_inserted, "tokens_stored": self.tokens_stored,
                "rows": [dict(r) for r in self.rows]}

    def plot(self, ax=None, per="stored"):
        """A horizontal bar per row, on a log axis: its bytes per stored
        token (``per="stored"``), per inserted token (``"inserted"``) or in
        all (``"total"``), each bar labelled with its value and its ratio to
        the first row. Needs matplotlib; returns the Axes (a new figure's
        unless ``ax`` is given).

        >>> t = FootprintTable([dict(name="a", bytes=10, bytes_per_stored_token=1.0,
        ...                          bytes_per_inserted_token=0.5)], sequences=1, distinct=1,
        ...                    tokens_inserted=20, tokens_stored=10)
        >>> ax = t.plot()  # doctest: +SKIP
        """
        keys = {"stored": ("bytes_per_stored_token", "bytes per stored token"),
                "inserted": ("bytes_per_inserted_token", "bytes per inserted token"),
                "total": ("bytes", "bytes")}
        if per not in keys:
            raise ValueError(f"per must be one of {list(keys)}; got {per!r}")
        key, label = keys[per]
        if ax is None:
            import matplotlib.pyplot as plt

            _, ax = plt.subplots(figsize=(7, 0.45 * len(self.rows) + 1.2))
        names = [r["name"] for r in self.rows]
        values = [r[key] for r in self.rows]
        y = np.arange(len(names))
        ax.barh(y, values, color=["C0" if r["measured"] == "arrays" else "C1"
                                  for r in self.rows])
        ax.set_yticks(y, names)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel(f"{label} (log scale; blue: arrays, orange: Python objects)")
        for i, v in enumerate(values):
            ax.annotate(f" {v:,.1f}  ({v / values[0]:.1f}x)", (v, i), va="center", fontsize=8)
        ax.set_xlim(right=max(values) * 8)
        ax.set_title(f"{self.sequences:,} sequences, {self.tokens_stored:,} tokens stored")
        return ax

    def __str__(self):
        head = (f"{self.sequences:,} sequences ({self.distinct:,} distinct), "
                f"{self.tokens_inserted:,} tokens inserted, {self.tokens_stored:,} stored "
                f"({self.tokens_inserted / self.tokens_stored:.2f}x prefix sharing)")
        titles = ("structure", "bytes", "allocated", "B/stored tok", "B/inserted tok",
                  "nodes", "build s", "measured")
        body = [(r["name"], f"{r['bytes']:,}", _maybe(r["allocated_bytes"]),
                 f"{r['bytes_per_stored_token']:.2f}", f"{r['bytes_per_inserted_token']:.2f}",
                 _maybe(r["nodes"]), f"{r['build_seconds']:.3f}", r["measured"])
                for r in self.rows]
        widths = [max(len(t), *(len(b[i]) for b in body)) for i, t in enumerate(titles)]

        def line(cells):
            return "  ".join(c.ljust(w) if i in (0, 7) else c.rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

        return "\n".join([head, line(titles), *(line(b) for b in body)])

    def __repr__(self):
        return (f"FootprintTable(sequences={self.sequences}, distinct={self.distinct}, "
                f"tokens_inserted={self.tokens_inserted}, tokens_stored={self.tokens_stored}, "
                f"rows={[r['name'] for r in self.rows]})")


def _maybe(x):
    return "-" if x is None else f"{x:,}"


def compare_footprint(seqs, *, dtypes=("int64", "int32")):
    """Build every structure on the same sequences and report what it costs.

    ``seqs``: anything ``radix_soa.pack`` takes, or a ``Batch``; duplicates
    are allowed (stored once). ``dtypes``: token dtypes of the ``RadixCache``
    rows, one row each. Raises ``ValueError`` for no sequences, an empty
    sequence or no/duplicate dtypes, ``TypeError`` for an unsupported dtype
    and ``OverflowError`` when a token does not fit one of ``dtypes`` (all
    before anything is built).

    >>> t = compare_footprint([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4]])
    >>> t.sequences, t.distinct, t.tokens_inserted, t.tokens_stored
    (3, 2, 12, 5)
    >>> [r["name"] for r in t.rows]  # doctest: +NORMALIZE_WHITESPACE
    ['RadixCache int64', 'RadixCache int32', 'token trie', 'sequence hash set',
     'Python set of tuples', 'Python dict-of-dicts trie', 'Python radix tree']
    >>> t.row("token trie")["nodes"], t.row("Python dict-of-dicts trie")["nodes"]
    (5, 5)
    >>> t.row("Python radix tree")["nodes"]
    3
    >>> r = t.row("sequence hash set")
    >>> r["bytes"] / t.tokens_stored == r["bytes_per_stored_token"]
    True
    >>> print(t)  # doctest: +SKIP
    3 sequences (2 distinct), 12 tokens inserted, 5 stored (2.40x prefix sharing)
    structure                  bytes  allocated  B/stored tok  B/inserted tok  nodes  build s  measured
    RadixCache int64             649      2,946        129.80           54.08      3    0.000  arrays
    RadixCache int32             629      1,922        125.80           52.42      3    0.000  arrays
    token trie                   233        354         46.60           19.42      5    0.000  arrays
    sequence hash set            248      2,344         49.60           20.67      -    0.000  arrays
    Python set of tuples         216          -         43.20           18.00      -    0.000  tracemalloc
    Python dict-of-dicts trie  1,344          -        268.80          112.00      5    0.000  tracemalloc
    Python radix tree          1,208          -        241.60          100.67      3    0.000  tracemalloc
    """
    batch = pack(seqs)
    if len(batch) == 0:
        raise ValueError("compare_footprint needs at least one sequence; got none")
    lengths = batch.lengths
    if np.any(lengths == 0):
        i = int(np.flatnonzero(lengths == 0)[0])
        raise ValueError(f"sequence {i} is empty; every structure here stores non-empty "
                         "sequences only")
    dts = _check_dtypes(dtypes, batch.flat)
    _warm(dts)
    inserted = batch.num_tokens
    rows = []

    stored = distinct = None
    for dt in dts:
        rc = RadixCache(dt)
        t0 = time.perf_counter()
        rc.insert_batch(batch)
        seconds = time.perf_counter() - t0
        rep = rc.memory_report()
        stored, distinct = rep["tokens_stored"], len(rc)
        rows.append(_row(f"RadixCache {dt.name}", rep["used_bytes"], rep["total_bytes"],
                         rep["nodes"], seconds, "arrays"))
        del rc

    trie = TokenTrie()
    t0 = time.perf_counter()
    trie.insert_batch(batch)
    seconds = time.perf_counter() - t0
    rep = trie.memory_report()
    _agree("token trie nodes", trie.num_nodes, "radix tokens stored", stored)
    _agree("token trie sequences", len(trie), "radix sequences", distinct)
    rows.append(_row("token trie", rep["used_bytes"], rep["total_bytes"], trie.num_nodes,
                     seconds, "arrays"))
    del trie

    hs = SequenceHashSet()
    t0 = time.perf_counter()
    hs.insert_batch(batch)
    seconds = time.perf_counter() - t0
    rep = hs.memory_report()
    _agree("hash set sequences", len(hs), "radix sequences", distinct)
    rows.append(_row("sequence hash set", rep["used_bytes"], rep["total_bytes"], None,
                     seconds, "arrays"))
    del hs

    for name, build, count, nodes in (
            ("Python set of tuples", _python_set, len, None),
            ("Python dict-of-dicts trie", _python_dict_trie, _dict_trie_sequences,
             _dict_trie_nodes),
            ("Python radix tree", _python_tree, len, lambda t: t.num_nodes)):
        seconds = _timed(build, batch)
        nbytes, n, n_nodes = _traced(build, batch, count, nodes)
        _agree(f"{name} sequences", n, "radix sequences", distinct)
        rows.append(_row(name, nbytes, None, n_nodes, seconds, "tracemalloc"))

    for r in rows:
        r["bytes_per_stored_token"] = r["bytes"] / stored
        r["bytes_per_inserted_token"] = r["bytes"] / inserted
    return FootprintTable(rows, sequences=len(batch), distinct=distinct,
                          tokens_inserted=inserted, tokens_stored=stored)


def _row(name, nbytes, allocated, nodes, seconds, measured):
    row = dict.fromkeys(COLUMNS)
    row.update(name=name, bytes=int(nbytes),
               allocated_bytes=None if allocated is None else int(allocated),
               nodes=None if nodes is None else int(nodes), build_seconds=float(seconds),
               measured=measured)
    return row


def _check_dtypes(dtypes, flat):
    if isinstance(dtypes, (str, np.dtype, type)):
        dtypes = (dtypes,)
    dts = [token_dtype(d) for d in dtypes]
    if not dts:
        raise ValueError("dtypes must name at least one token dtype")
    if len(set(dts)) != len(dts):
        raise ValueError(f"dtypes must not repeat; got {[d.name for d in dts]}")
    lo, hi = int(flat.min()), int(flat.max())
    for dt in dts:
        info = np.iinfo(dt)
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise OverflowError(f"token {bad} does not fit dtype {dt.name} "
                                f"[{info.min}, {info.max}]; leave {dt.name} out of dtypes")
    return dts


def _agree(what, value, other, expected):
    if value != expected:
        raise AssertionError(f"{what} = {value} but {other} = {expected}")


_WARM: set = set()


def _warm(dts):
    """Compile (or load) every kernel the builds use, so no row's build time
    includes compilation."""
    todo = [dt for dt in dts if dt not in _WARM]
    if todo or "baselines" not in _WARM:
        # enough sequences and tokens to make every structure grow once
        tiny = pack([list(range(i, i + 20)) for i in range(0, 400, 10)])
        for dt in todo:
            RadixCache(dt).insert_batch(tiny)
            _WARM.add(dt)
        TokenTrie().insert_batch(tiny)
        SequenceHashSet().insert_batch(tiny)
        _WARM.add("baselines")


# ---------------------------------------------------------------- Python rows

def _python_lists(batch):
    return batch.flat.tolist(), batch.offsets.tolist()


def _python_set(batch):
    flat, off = _python_lists(batch)
    return {tuple(flat[off[i]:off[i + 1]]) for i in range(len(off) - 1)}


#: The key that marks the end of a sequence in the dict-of-dicts trie.
_END = None


def _python_dict_trie(batch):
    """The trie one writes first: a dict per node, keyed by the next token,
    ``_END: True`` where a sequence ends."""
    flat, off = _python_lists(batch)
    root: dict = {}
    for i in range(len(off) - 1):
        node = root
        for t in flat[off[i]:off[i + 1]]:
            node = node.setdefault(t, {})
        node[_END] = True
    return root


def _dict_trie_walk(root):
    """``(sequences, nodes)`` of a dict-of-dicts trie (the root not a node)."""
    sequences = nodes = 0
    stack = [root]
    while stack:
        node = stack.pop()
        for key, child in node.items():
            if key is _END:
                sequences += 1
            else:
                nodes += 1
                stack.append(child)
    return sequences, nodes


def _dict_trie_sequences(root):
    return _dict_trie_walk(root)[0]


def _dict_trie_nodes(root):
    return _dict_trie_walk(root)[1]


def _python_tree(batch):
    flat, off = _python_lists(batch)
    tree = ReferenceRadixTree()
    for i in range(len(off) - 1):
        tree.insert(flat[off[i]:off[i + 1]])
    return tree


def _timed(build, batch):
    t0 = time.perf_counter()
    obj = build(batch)
    seconds = time.perf_counter() - t0
    del obj
    return seconds


def _traced(build, batch, count, nodes):
    """Bytes ``tracemalloc`` sees allocated by ``build(batch)`` and still held
    by its result (temporaries and any cyclic garbage freed first), the
    result's ``count`` and ``nodes``. Works whether or not tracemalloc was
    already tracing."""
    # A full collection frees pending garbage (which must not count against
    # the build when tracing was already on) and empties CPython's free lists
    # of small tuples and dicts: objects reused from them were allocated
    # untraced and would go uncounted.
    gc.collect()
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        before = _held_by_builders()
        obj = build(batch)
        gc.collect()
        nbytes = _held_by_builders() - before
    finally:
        if started:
            tracemalloc.stop()
    n = count(obj)
    n_nodes = None if nodes is None else nodes(obj)
    return nbytes, n, n_nodes


# Every allocation a build makes happens in the builders' own code (this
# module and the reference tree's), C calls included: tracemalloc files an
# allocation under the innermost Python frame. Counting only those files'
# traces keeps out what other threads allocate or free meanwhile, and frees of
# unrelated objects traced before the build (a global before/after total
# counted both, which made the rows vary by a few percent in a busy process).
_BUILDER_FILES = frozenset((__file__, reference_module.__file__))


def _held_by_builders():
    snap = tracemalloc.take_snapshot()
    raw = _raw_traces(snap)
    if raw is not None:  # what a Filter per file keeps (innermost frame), 20x faster
        files = _BUILDER_FILES
        return sum(t[1] for t in raw if t[2] and t[2][0][0] in files)
    stats = snap.statistics("filename")
    return sum(stat.size for stat in stats if stat.traceback[0].filename in _BUILDER_FILES)


def _raw_traces(snap):
    """CPython's trace tuples behind ``snap.traces`` (``(domain, size,
    frames, ...)``, frames innermost first as ``(filename, lineno)``), or
    None where they are not so: a private attribute, read only after its
    shape is checked. The public path (``Snapshot.statistics``, then the
    same files) runs a Python loop building objects per trace: a Python
    model's millions of traces made it most of a footprint study's time."""
    raw = getattr(getattr(snap, "traces", None), "_traces", None)
    if type(raw) is not list:
        return None
    if raw:
        t = raw[0]
        if not (type(t) is tuple and len(t) >= 3 and type(t[1]) is int and type(t[2]) is tuple
                and t[2] and type(t[2][0]) is tuple and type(t[2][0][0]) is str):
            return None
    return raw
