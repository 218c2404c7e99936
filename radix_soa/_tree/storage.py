"""The struct-of-arrays tree: allocation, growth that cannot go half-way,
the one grow-and-resume helper, compaction and the counters.

``TreeStorage`` owns the arrays the kernels work on. They are published as
one unit (``_publish``: the ``Tree`` named tuple, the plain tuple the kernels
take and the read-only argument tuples, swapped in by one C-level update):
growth first allocates and fills every new array, then swaps them all in at
once, so a ``MemoryError`` or ``KeyboardInterrupt`` anywhere before the swap
leaves the storage exactly as it was, and one after it leaves it grown.

Arrays double when they fill up, so a long run of inserts costs amortized
O(1) copying per token and per node. When the token buffer must grow and
dead runs (left by removes, merges and evictions) outweigh the live tokens,
it is compacted instead.

>>> s = TreeStorage()
>>> s.count("nodes"), s.tree.tokens.dtype.name
(0, 'int64')
"""

from typing import Any

import numpy as np

from .._kernels import directory as directory_kernels
from .._kernels import layout as L
from .._kernels import mutation as mutation_kernels
from .._kernels import table as table_kernels
from .._kernels import walks as walks_kernels
from .._kernels.layout import NODE_FIELDS, ROOM, TRACK_FIELDS, Tree
from .results import InvariantError
from .._input.validate import MAX_NODES

SUPPORTED_DTYPES = tuple(
    np.dtype(d) for d in ("int64", "int32", "int16", "int8", "uint32", "uint16", "uint8")
)
MIN_NODES = 16
MIN_TOKENS = 256
# a token buffer that must grow is compacted instead when its dead runs
# outnumber both its live tokens and this
COMPACT_MIN_DEAD = 4096
SMALL_ARRAY = 1 << 16
NODE_DTYPES = {name: np.dtype(L.FIELD_DTYPES[name]) for name in NODE_FIELDS}
TRACK_DTYPES = {name: np.dtype(L.FIELD_DTYPES[name]) for name in TRACK_FIELDS}
# per-call kernels take the arrays' directory; False (or a Numba without the
# internals it needs) passes them as the plain tuple (tested both ways)
USE_DIRECTORY = directory_kernels.HAS_DIRECTORY
# the counters Python code reads, by name (the slots themselves stay here)
COUNTERS = {"tok_used": L.M_TOK_USED, "node_end": L.M_NODE_END, "free_head": L.M_FREE_HEAD,
            "free_count": L.M_FREE_COUNT, "nodes": L.M_NODES, "tokens": L.M_TOKENS,
            "terminals": L.M_TERMINALS, "dead_tokens": L.M_DEAD_TOKENS,
            "heap_size": L.M_HEAP_SIZE, "locked_tokens": L.M_LOCKED_TOKENS,
            "clock": L.M_CLOCK, "roots": L.M_ROOTS, "tokens_inserted": L.M_TOKENS_INSERTED}


def token_dtype(dtype):
    """The NumPy dtype for a token buffer, or ``TypeError``."""
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"dtype must be an integer NumPy dtype, got {dtype!r}") from exc
    if dt not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise TypeError(f"dtype must be one of {names}; got {dt.name}")
    return dt


def high_water_marks(meta):
    """``(tokens used, node ids used)`` of a counter array."""
    return int(meta[L.M_TOK_USED]), int(meta[L.M_NODE_END])


def allocate(n, dtype, fill=0):
    """A new array of ``n`` entries: every array the storage grows into is
    made here (the fault-injection tests fail it on purpose)."""
    if fill == 0:
        return np.zeros(n, dtype)
    return np.full(n, fill, dtype)


def table_size_for(entries):
    """Table size for ``entries`` with room to grow: at least twice the
    entries and under the load limit."""
    size = 16
    while not table_kernels.table_fits(entries, size) or size < 2 * entries:
        size *= 2
    return size


def smallest_table_for(entries):
    """Smallest table holding ``entries`` under the load limit."""
    size = 16
    while not table_kernels.table_fits(entries, size):
        size *= 2
    return size


def roots_and_depths(parent, live):
    """For node ids ``0..n-1`` (``parent`` int64; ``live``: the nodes with a
    span, so roots and free ids are their own targets): the id each reaches
    by following parents, and how many steps away it is. Pointer jumping in
    ``bit_length(n) + 1`` passes, so a damaged tree with a cycle still
    returns (its nodes then reach no root); it stops early once every node
    points at a fixed point (about log2 of the tree's depth passes)."""
    n = parent.shape[0]
    up = np.where(live, parent, np.arange(n))
    depth = live.astype(np.int64)
    for _ in range(max(1, n.bit_length() + 1)):
        depth = depth + depth[up]  # a root adds 0: depths stop growing once there
        jumped = up[up]
        if np.array_equal(jumped, up):
            break
        up = jumped
    return up, depth


def _grown(n):
    """The next capacity of an array of ``n`` entries: x4 while small (a
    growth costs ~30 µs however small the arrays are), then x2."""
    return 4 * n if n < SMALL_ARRAY else 2 * n


def _copied(arr, cap, keep):
    """``arr[:keep]`` in a new array of ``cap`` entries (zeros after)."""
    out = allocate(cap, arr.dtype)
    out[:keep] = arr[:keep]
    return out


class TreeStorage:
    """Parallel arrays of a radix tree over integer tokens.

    ``values`` keeps an int64 per token; ``track`` keeps the prefix-cache
    bookkeeping (locks, access stamps, LRU heap, handle generations).
    The first root (namespace 0) is node 0.
    """

    # The views ``_publish`` sets, declared for type checkers (bare
    # annotations make no class attributes: every view stays an instance one).
    tokens: np.ndarray
    values: np.ndarray
    start: np.ndarray
    length: np.ndarray
    parent: np.ndarray
    nchild: np.ndarray
    cxor: np.ndarray
    term: np.ndarray
    table: np.ndarray
    lock: np.ndarray
    stamp: np.ndarray
    hpos: np.ndarray
    heap: np.ndarray
    hkey: np.ndarray
    gen: np.ndarray
    own: np.ndarray
    meta: np.ndarray
    generation: int
    tree: Tree
    arrays: tuple
    exists_args: tuple
    match_args: tuple
    directory: Any  # the directory array, or ``arrays`` without it
    like: np.ndarray

    def __init__(self, dtype=np.int64, *, values=False, track=False, page_size=1,
                 node_capacity=MIN_NODES, token_capacity=MIN_TOKENS):
        self.dtype = token_dtype(dtype)
        self.narrow = self.dtype != np.int64  # tokens need a range check
        self.has_values = bool(values)
        self.track = bool(track)
        self.page_size = int(page_size)
        self.readonly = False
        ncap = max(int(node_capacity), MIN_NODES)
        tcap = max(int(token_capacity), MIN_TOKENS)
        tn = ncap if self.track else 0
        arrays = {"tokens": allocate(tcap, self.dtype),
                  "values": allocate(tcap if self.has_values else 0, np.int64),
                  "term": allocate((ncap + 7) // 8, np.uint8),
                  "table": allocate(table_size_for(ncap), np.int64, L.EMPTY),
                  "meta": allocate(L.META_SIZE, np.int64)}
        arrays.update({name: allocate(ncap, dt) for name, dt in NODE_DTYPES.items()})
        arrays.update({name: allocate(tn, dt) for name, dt in TRACK_DTYPES.items()})
        arrays["hpos"][:] = -1
        arrays["meta"][L.M_FREE_HEAD] = L.NO_NODE
        # node 0 the root of namespace 0, as the ``new_root`` kernel makes it
        # on these zeroed arrays (written here: the kernel's first compile,
        # about 0.5 s, is not worth one constructor)
        arrays["parent"][0] = -1
        arrays["meta"][L.M_NODE_END] = 1
        arrays["meta"][L.M_ROOTS] = 1
        self._publish(Tree(**arrays))
        self.root = 0

    @classmethod
    def from_tree(cls, tree, *, dtype, values, track, page_size, root, readonly):
        """A storage over existing arrays (a loaded or unpickled tree)."""
        s = cls.__new__(cls)
        s.dtype = token_dtype(dtype)
        s.narrow = s.dtype != np.int64
        s.has_values = bool(values)
        s.track = bool(track)
        s.page_size = int(page_size)
        s.readonly = bool(readonly)
        s.root = int(root)
        s._publish(tree)
        return s

    # ------------------------------------------------------------ the views
    def _publish(self, tree):
        """Make ``tree`` the storage's arrays. Every view is built first; one
        ``dict.update`` then replaces them all (a single C call over keys that
        exist already, so neither a signal nor a ``MemoryError`` can stop it
        half-way, and every view stays a plain, fast attribute):

        - ``tree``: the ``Tree`` named tuple; each field also as an attribute
          (``tokens``, ``start``, ... ``meta``);
        - ``generation``: bumped by every publish, so a lock-free reader
          can tell that the arrays it read from were replaced;
        - ``arrays``: the same arrays as the plain tuple the mutating kernels
          take (the kernels' ``T``);
        - ``exists_args``: ``(tokens, start, length, parent, term, table)``, what the
          batch ``exists`` reads; ``match_args``: the same without ``term``,
          what the batch ``match`` reads;
        - ``directory``: the directory of every array the per-call entry
          kernels take (their ``D``; see ``radix_soa._kernels.directory``; it
          keeps the arrays alive), or ``arrays`` itself where this Numba lacks
          what the directory needs; ``like``: an empty array of the token
          dtype, passed beside ``directory``.
        """
        views = tree._asdict()
        views["generation"] = getattr(self, "generation", 0) + 1  # readers compare it
        views["tree"] = tree
        views["arrays"] = tuple(tree)
        views["exists_args"] = (tree.tokens, tree.start, tree.length, tree.parent, tree.term,
                               tree.table)
        views["match_args"] = (tree.tokens, tree.start, tree.length, tree.parent, tree.table)
        views["directory"] = (directory_kernels.directory_of(tree) if USE_DIRECTORY
                              else views["arrays"])
        views["like"] = tree.tokens[:0]
        self.__dict__.update(views)

    @property
    def per_node_arrays(self):
        """Names of the arrays with one entry per node id (the terminal
        bitmap aside)."""
        return NODE_FIELDS + (TRACK_FIELDS if self.track else ())

    # ------------------------------------------------------------ counters
    def count(self, name):
        """A counter by name (see ``COUNTERS``), as an int."""
        return int(self.meta[COUNTERS[name]])

    @property
    def node_end(self):
        return int(self.meta[L.M_NODE_END])

    def stats(self):
        """The prefix-cache statistics kept in meta, by name."""
        meta = self.tree.meta
        return {name: int(meta[slot]) for name, slot in L.STAT_SLOTS.items()}

    def set_stats(self, stats):
        meta = self.tree.meta
        for name, slot in L.STAT_SLOTS.items():
            meta[slot] = int(stats.get(name, 0))

    # ------------------------------------------------------------ growth
    def reserve(self, tokens=0, nodes=0):
        """Make room for ``tokens`` more buffer tokens and ``nodes`` more
        nodes (and their table entries) before a kernel runs. The new arrays
        are swapped in together at the end (a compaction first, when dead
        runs outweigh live tokens, is published on its own: either way every
        published state is whole)."""
        tree = self.tree
        meta = tree.meta
        tokens, nodes = int(tokens), int(nodes)
        used = int(meta[L.M_TOK_USED])
        changes = {}
        if used + tokens > tree.tokens.shape[0]:
            dead = int(meta[L.M_DEAD_TOKENS])
            if dead > max(int(meta[L.M_TOKENS]), COMPACT_MIN_DEAD):
                self._publish(self._compacted(0.5, tokens))
                return self.reserve(tokens, nodes)
            cap = max(_grown(tree.tokens.shape[0]), used + tokens)
            changes["tokens"] = _copied(tree.tokens, cap, used)
            if self.has_values:
                changes["values"] = _copied(tree.values, cap, used)
        end = int(meta[L.M_NODE_END])
        need_n = end + max(0, nodes - int(meta[L.M_FREE_COUNT]))
        if need_n > MAX_NODES:
            raise OverflowError(f"a tree holds at most {MAX_NODES} nodes (int32 ids); this call "
                                f"needs {need_n}")
        if need_n > tree.start.shape[0]:
            cap = min(MAX_NODES, max(_grown(tree.start.shape[0]), need_n))
            changes.update(self._node_arrays(tree, cap, end))
        need_slots = int(meta[L.M_NODES]) + nodes
        size = tree.table.shape[0]
        if not table_kernels.table_fits(need_slots, size):
            # at least double (amortized O(1) rebuilding), else the smallest
            # table for what is asked: sizing it by the node capacity (x4
            # while small) left a grown table a quarter full
            changes["table"] = self._built_table(tree._replace(**changes),
                                                 max(2 * size, smallest_table_for(need_slots)))
        if changes:
            self._publish(tree._replace(**changes))

    def take_need(self):
        """The room a kernel asked for with ``ROOM``: ``(tokens, nodes)``,
        cleared once read."""
        meta = self.tree.meta
        need = int(meta[L.M_NEED_TOKENS]), int(meta[L.M_NEED_NODES])
        meta[L.M_NEED_TOKENS] = 0
        meta[L.M_NEED_NODES] = 0
        return need

    def run(self, call, plan=None):
        """``resume(call, [self], plan)``."""
        return resume(call, (self,), plan)

    def _node_arrays(self, tree, cap, end):
        """Every per-node array (and the bitmap) copied into ``cap`` entries."""
        out = {name: _copied(getattr(tree, name), cap, end) for name in self.per_node_arrays}
        out["term"] = _copied(tree.term, (cap + 7) // 8, (end + 7) // 8)
        return out

    def _built_table(self, tree, size):
        table = allocate(size, np.int64, L.EMPTY)
        table_kernels.table_rebuild(table, tree.tokens, tree.start, tree.length, tree.parent,
                         int(tree.meta[L.M_NODE_END]), self.page_size)
        return table

    def trim_slack(self, floor_nodes=MIN_NODES, floor_tokens=MIN_TOKENS):
        """Cut what a generous ``reserve`` left unused: the token buffer and
        the node arrays shrink to what is used plus a quarter (so at most
        20% of them is slack), never below the floors. Batch inserts call it
        only after they grew the arrays.

        The shrunk arrays are views of the grown ones, not copies: what they
        cut off lies past every write (``reserve`` grows into zeroed arrays,
        whose pages the OS maps on first write), so it holds address space
        only, no memory, until the next growth or compaction replaces the
        arrays; a copy would write the whole tree again into fresh memory
        (7.7 of 21.8 s of a 10^7-sequence ``insert_batch`` on a VM)."""
        tree = self.tree
        changes = {}
        used = int(tree.meta[L.M_TOK_USED])
        target = max(floor_tokens, used + used // 4)
        if tree.tokens.shape[0] > target:
            changes["tokens"] = tree.tokens[:target]
            if self.has_values:
                changes["values"] = tree.values[:target]
        end = self.node_end
        target = max(floor_nodes, end + end // 4)
        if tree.start.shape[0] > target:
            changes.update({name: getattr(tree, name)[:target] for name in self.per_node_arrays})
            changes["term"] = tree.term[:(target + 7) // 8]
        nodes = self.count("nodes")
        size = smallest_table_for(nodes)
        if tree.table.shape[0] > size:
            # a batch's predicted growth overshot: at most half full, the
            # table is rebuilt at load (0.35, 0.7] (one pass over the nodes,
            # under the batch's own cost)
            changes["table"] = self._built_table(tree._replace(**changes), size)
        if changes:
            self._publish(tree._replace(**changes))

    def new_root(self, namespace=0):
        """Allocate a root for namespace number ``namespace`` (kept in the
        root's ``start``); returns its id."""
        status, root = self.run(lambda: mutation_kernels.new_root(self.arrays, self.track, namespace))
        return int(root)

    def root_ids(self):
        """Ids of every root, read from the arrays."""
        t = self.tree
        end = self.node_end
        return np.flatnonzero((t.parent[:end] == -1) & (t.length[:end] == 0))

    def roots(self):
        """``{namespace number: root id}`` for every root, read from the arrays."""
        start = self.tree.start
        return {int(start[r]): int(r) for r in self.root_ids()}

    # ------------------------------------------------------------ compaction
    def compact(self, headroom=0.25):
        """Rewrite the token (and value) buffer with only live spans, laid
        out depth-first, and shrink every array to what is used plus
        ``headroom`` (a fraction). Node ids (and so handles) do not change."""
        self._publish(self._compacted(float(headroom)))

    def _compacted(self, headroom, extra_tokens=0):
        """The compacted tree, built beside the current one."""
        tree = self.tree
        meta = tree.meta
        live = int(meta[L.M_TOKENS])
        cap = max(MIN_TOKENS, live + max(int(live * headroom), extra_tokens))
        end = self.node_end
        changes = self._node_arrays(tree, max(MIN_NODES, end + int(end * headroom)), end)
        changes["tokens"] = allocate(cap, self.dtype)
        changes["values"] = allocate(cap if self.has_values else 0, np.int64)
        written = walks_kernels.compact_spans(
            self.arrays, changes["start"], changes["tokens"], changes["values"]
        )
        if written != live:
            raise InvariantError(f"compaction copied {written} tokens of {live} live ones")
        changes["meta"] = new_meta = meta.copy()
        new_meta[L.M_TOK_USED] = live
        new_meta[L.M_DEAD_TOKENS] = 0
        nodes = int(meta[L.M_NODES])
        candidate = tree._replace(**changes)
        table = self._built_table(candidate, smallest_table_for(nodes + int(nodes * headroom)))
        return candidate._replace(table=table)

    # ------------------------------------------------------------ memory
    def array_usage(self):
        """Per array: dtype, bytes in use and bytes allocated.

        In use: the token (and value) buffer up to its high-water mark, dead
        runs included; node arrays up to the node high-water mark; the whole
        child table (its empty slots are what keeps probing short); the heap
        up to its size.
        """
        tree = self.tree
        tok_used = self.count("tok_used")
        end = self.node_end
        used = {"tokens": tok_used, "values": tok_used if self.has_values else 0,
                "term": (end + 7) // 8, "table": tree.table.shape[0],
                "meta": tree.meta.shape[0]}
        for name in self.per_node_arrays:
            used[name] = end
        if self.track:
            used["heap"] = self.count("heap_size")
        if self.track and tree.hkey is tree.stamp:  # a read-only load: one array, counted once
            del used["hkey"]
        out = {}
        for name, n in used.items():
            arr = getattr(tree, name)
            out[name] = {"dtype": arr.dtype.name, "used_bytes": n * arr.itemsize,
                         "allocated_bytes": arr.nbytes}
        return out

    def memory_report(self):
        """Bytes of the arrays (used vs allocated) and what they hold."""
        arrays = self.array_usage()
        used = sum(a["used_bytes"] for a in arrays.values())
        total = sum(a["allocated_bytes"] for a in arrays.values())
        stored = self.count("tokens")
        inserted = self.count("tokens_inserted")
        nodes = self.count("nodes")
        per_token = arrays["tokens"]["used_bytes"] + arrays["values"]["used_bytes"]
        return {
            "total_bytes": total,
            "used_bytes": used,
            "slack_bytes": total - used,
            "tokens_inserted": inserted,
            "tokens_stored": stored,
            "dead_tokens": self.count("dead_tokens"),
            "nodes": nodes,
            "bytes_per_stored_token": used / stored if stored else 0.0,
            "bytes_per_node": (used - per_token) / nodes if nodes else 0.0,
            "compression_ratio": inserted / stored if stored else 0.0,
            "arrays": arrays,
            "counts": MEMORY_COUNTS,
        }

    # ------------------------------------------------------------ views
    def terminal_mask(self):
        end = self.node_end
        bits = np.unpackbits(self.tree.term, bitorder="little")[:end]
        return bits.astype(bool)


# What memory_report's byte counts include (True) and leave out (False).
MEMORY_COUNTS = {
    "numpy_array_bytes": True,          # every array of the tree, exactly
    "dead_token_runs_in_used": True,    # until compact()
    "child_table_whole": True,          # its empty slots keep probing short
    "python_object_overhead": False,    # about a kilobyte per cache
}


def resume(call, stores, plan=None):
    """Run ``call()`` until its status is not ``ROOM``, growing between.

    ``call`` runs one kernel and returns its status (or a tuple whose first
    element is the status); after ``ROOM`` each storage of ``stores`` whose
    meta holds a need reserves it (``plan(storage, tokens, nodes)``, if
    given, may enlarge the reservation) and ``call`` runs again. Kernels
    change nothing of the item they stop at, so a call is resumed, never
    repeated. Returns the last result.
    """
    while True:
        result = call()
        status = result[0] if isinstance(result, tuple) else result
        if status != ROOM:
            return result
        grew = False
        for s in stores:
            tokens, nodes = s.take_need()
            if tokens or nodes:
                if plan is not None:
                    tokens, nodes = plan(s, tokens, nodes)
                s.reserve(tokens, nodes)
                grew = True
        if not grew:
            raise InvariantError("a kernel asked for room without saying how much")


def batch_plan(batch, cursor, live0, nodes0, grew):
    """A ``resume`` plan for a batch kernel with ``cursor``: after a stop,
    the tokens the batch has added so far per token it has read predict
    what the rest will add; the buffer grows to that (at least what the
    next item needs, at most all remaining tokens). A generous guess costs
    only address space (untouched pages are never resident), and
    ``trim_slack`` cuts the excess at the end. The nodes added per sequence
    so far predict the nodes in the same way (at most two per sequence
    left, at most 8x the nodes there are), so the child table, which every
    growth rebuilds, grows a few times, not once per doubling (it is not
    trimmed: an overshoot stays). ``live0``/``nodes0``:
    the live tokens and nodes before the batch; ``grew`` (a list) gets True
    appended when the plan is used."""
    n = len(batch)
    offsets = batch.offsets

    def plan(s, tokens, nodes):
        grew.append(True)
        i = int(cursor[0])
        done = int(offsets[i] - offsets[0])
        remaining = int(offsets[n] - offsets[i])
        added = s.count("tokens") - live0  # live tokens: a compaction keeps them
        guess = tokens if done == 0 else min(remaining, max(0, added) * remaining // done * 3 // 2)
        node_guess = 2 * s.node_end
        if i > 0:  # x8 at most: an early stop has seen few sequences
            rate_guess = max(0, s.count("nodes") - nodes0) * (n - i) // i * 6 // 5
            node_guess = max(node_guess, min(rate_guess, 8 * s.node_end))
        return max(tokens, guess), max(nodes, min(2 * (n - i), node_guess))

    return plan


def span_positions(starts, lengths):
    """Every position of the spans ``starts[i] .. starts[i] + lengths[i]``,
    span after span (int64): to gather spans out of a flat buffer.

    >>> span_positions(np.array([5, 0]), np.array([2, 3])).tolist()
    [5, 6, 0, 1, 2]
    """
    lengths = lengths.astype(np.int64)
    before = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return np.repeat(starts.astype(np.int64) - before, lengths) + np.arange(int(lengths.sum()))
