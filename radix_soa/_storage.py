"""The struct-of-arrays tree: allocation, amortized growth, counters.

``TreeStorage`` owns the arrays the kernels work on and makes room before a
kernel runs. Arrays double when they fill up, so a long run of inserts costs
amortized O(1) copying per token and per node.
"""

import numpy as np

from . import _kernels as K

SUPPORTED_DTYPES = tuple(
    np.dtype(d) for d in ("int64", "int32", "int16", "int8", "uint32", "uint16", "uint8")
)
_MIN_NODES = 16
_MIN_TOKENS = 256
# the prefix-cache bookkeeping arrays (one entry per node) and their dtypes
TRACK_DTYPES = {"lock": np.int32, "stamp": np.int64, "hpos": np.int32, "heap": np.int32,
                "gen": np.uint32, "own": np.int32}


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


class TreeStorage:
    """Parallel arrays of a radix tree over integer tokens.

    ``values`` keeps an int64 per token; ``track`` keeps the prefix-cache
    bookkeeping (locks, access stamps, LRU heap, handle generations).
    The first root (namespace 0) is node 0.
    """

    def __init__(self, dtype=np.int64, *, values=False, track=False, page_size=1,
                 node_capacity=_MIN_NODES, token_capacity=_MIN_TOKENS):
        self.dtype = token_dtype(dtype)
        self.has_values = bool(values)
        self.track = bool(track)
        self.page_size = int(page_size)
        self.readonly = False
        ncap = max(int(node_capacity), _MIN_NODES)
        tcap = max(int(token_capacity), _MIN_TOKENS)
        self.tokens = np.zeros(tcap, self.dtype)
        self.values = np.zeros(tcap if self.has_values else 0, np.int64)
        self.start = np.zeros(ncap, np.int64)
        self.length = np.zeros(ncap, np.int32)
        self.parent = np.zeros(ncap, np.int32)
        self.nchild = np.zeros(ncap, np.int32)
        self.cxor = np.zeros(ncap, np.int32)
        self.term = np.zeros((ncap + 7) // 8, np.uint8)
        self.table = np.full(_table_size_for(ncap), K.NO_NODE, np.int32)
        tn = ncap if self.track else 0
        for name, dt in TRACK_DTYPES.items():
            setattr(self, name, np.zeros(tn, dt))
        self.hpos[:] = -1
        self.meta = np.zeros(K.META_SIZE, np.int64)
        self.meta[K.M_FREE_HEAD] = K.NO_NODE
        self._pack()
        self.root = self.new_root()

    # ------------------------------------------------------------ packing
    NODE_ARRAYS = ("start", "length", "parent", "nchild", "cxor")
    TRACK_ARRAYS = tuple(TRACK_DTYPES)

    @property
    def per_node_arrays(self):
        """Names of the arrays with one entry per node id (the terminal
        bitmap aside)."""
        return self.NODE_ARRAYS + (self.TRACK_ARRAYS if self.track else ())

    def _pack(self):
        self.T = (self.tokens, self.values, self.start, self.length, self.parent,
                  self.nchild, self.cxor, self.term, self.table, self.lock,
                  self.stamp, self.hpos, self.heap, self.gen, self.own, self.meta)
        # the arrays read-only walks need, in kernel argument order
        self.R = (self.tokens, self.start, self.length, self.parent, self.term, self.table)
        self.M = (self.tokens, self.start, self.length, self.parent, self.table)

    # ------------------------------------------------------------ counters
    def m(self, slot):
        return int(self.meta[slot])

    @property
    def node_end(self):
        return int(self.meta[K.M_NODE_END])

    # ------------------------------------------------------------ growth
    def reserve(self, tokens=0, nodes=0):
        """Make room for ``tokens`` more buffer tokens and ``nodes`` more
        nodes (and their table entries) before a kernel runs."""
        meta = self.meta
        changed = False
        need_t = int(meta[K.M_TOK_USED]) + int(tokens)
        if need_t > self.tokens.shape[0]:
            self._grow_tokens(max(2 * self.tokens.shape[0], need_t))
            changed = True
        need_n = int(meta[K.M_NODE_END]) + max(0, int(nodes) - int(meta[K.M_FREE_COUNT]))
        if need_n > self.start.shape[0]:
            self._resize_nodes(max(2 * self.start.shape[0], need_n))
            changed = True
        need_slots = int(meta[K.M_NODES]) + int(nodes)
        if need_slots * 10 > self.table.shape[0] * 7:  # same test as the kernels' has_room
            self._rebuild_table(_table_size_for(need_slots))
            changed = True
        if changed:
            self._pack()

    def trim_slack(self):
        """Give back what a generous ``reserve`` left unused: when the token
        buffer or the node arrays hold more than twice what is used (plus a
        quarter of headroom), shrink them to that. Shrinking reallocates in
        place, which copies nothing for large buffers, and pages a
        generous reservation never touched were never resident anyway."""
        used = int(self.meta[K.M_TOK_USED])
        target = max(_MIN_TOKENS, used + used // 4)
        if self.tokens.shape[0] > 2 * target:
            self.tokens = _shrunk(self.tokens, target)
            if self.has_values:
                self.values = _shrunk(self.values, target)
        end = self.node_end
        target = max(_MIN_NODES, end + end // 4)
        if self.start.shape[0] > 2 * target:
            for name in self.per_node_arrays:
                setattr(self, name, _shrunk(getattr(self, name), target))
            self.term = _shrunk(self.term, (target + 7) // 8)
        self._pack()

    def _grow_tokens(self, cap):
        used = int(self.meta[K.M_TOK_USED])
        self.tokens = _resized(self.tokens, cap, used)
        if self.has_values:
            self.values = _resized(self.values, cap, used)

    def _resize_nodes(self, cap):
        """Copy every per-node array (and the bitmap) into ``cap`` entries."""
        end = self.node_end
        for name in self.per_node_arrays:
            setattr(self, name, _resized(getattr(self, name), cap, end))
        self.term = _resized(self.term, (cap + 7) // 8, (end + 7) // 8)

    def _rebuild_table(self, size):
        self.table = np.full(size, K.NO_NODE, np.int32)
        K.table_rebuild(self.table, self.tokens, self.start, self.length,
                        self.parent, self.node_end, self.page_size)

    def new_root(self):
        self.reserve(nodes=1)
        return int(K.new_root(self.T, self.track))

    # ------------------------------------------------------------ memory
    def array_usage(self):
        """Per array: dtype, bytes in use and bytes allocated.

        In use: the token (and value) buffer up to its high-water mark, dead
        runs included; node arrays up to the node high-water mark; the whole
        child table (its empty slots are what keeps probing short); the heap
        up to its size.
        """
        tok_used = int(self.meta[K.M_TOK_USED])
        end = self.node_end
        used = {"tokens": tok_used, "values": tok_used if self.has_values else 0,
                "term": (end + 7) // 8, "table": self.table.shape[0],
                "meta": self.meta.shape[0]}
        for name in self.per_node_arrays:
            used[name] = end
        if self.track:
            used["heap"] = int(self.meta[K.M_HEAP_SIZE])
        out = {}
        for name, n in used.items():
            arr = getattr(self, name)
            out[name] = {"dtype": arr.dtype.name, "used_bytes": n * arr.itemsize,
                         "allocated_bytes": arr.nbytes}
        return out

    def compact(self, headroom=0.25):
        """Rewrite the token (and value) buffer with only live spans, laid
        out depth-first, and shrink every array to what is used plus
        ``headroom`` (a fraction). Node ids (and so handles) do not change."""
        extra = float(headroom)
        live = int(self.meta[K.M_TOKENS])
        cap = max(_MIN_TOKENS, live + int(live * extra))
        new_tokens = np.zeros(cap, self.dtype)
        new_values = np.zeros(cap if self.has_values else 0, np.int64)
        used = K.compact_spans(self.T, new_tokens, new_values)
        assert used == live, "compaction copied every live token"
        self.tokens, self.values = new_tokens, new_values
        self.meta[K.M_TOK_USED] = live
        self.meta[K.M_DEAD_TOKENS] = 0
        end = self.node_end
        self._resize_nodes(max(_MIN_NODES, end + int(end * extra)))
        nodes = int(self.meta[K.M_NODES])
        self._rebuild_table(_smallest_table_for(nodes + int(nodes * extra)))
        self._pack()

    def memory_report(self):
        """Bytes of the arrays (used vs allocated) and what they hold."""
        arrays = self.array_usage()
        used = sum(a["used_bytes"] for a in arrays.values())
        total = sum(a["allocated_bytes"] for a in arrays.values())
        stored = int(self.meta[K.M_TOKENS])
        inserted = int(self.meta[K.M_TOKENS_INSERTED])
        nodes = int(self.meta[K.M_NODES])
        per_token = arrays["tokens"]["used_bytes"] + arrays["values"]["used_bytes"]
        return {
            "total_bytes": total,
            "used_bytes": used,
            "slack_bytes": total - used,
            "tokens_inserted": inserted,
            "tokens_stored": stored,
            "dead_tokens": int(self.meta[K.M_DEAD_TOKENS]),
            "nodes": nodes,
            "bytes_per_stored_token": used / stored if stored else 0.0,
            "bytes_per_node": (used - per_token) / nodes if nodes else 0.0,
            "compression_ratio": inserted / stored if stored else 0.0,
            "arrays": arrays,
            "counts": ("NumPy array bytes only: 'used' is each array up to its high-water mark "
                       "(dead token runs included until compact()), the child hash table whole; "
                       "'total' is what is allocated. Python object overhead (about a kilobyte "
                       "per cache) is not counted."),
        }

    # ------------------------------------------------------------ views
    def terminal_mask(self):
        end = self.node_end
        bits = np.unpackbits(self.term, bitorder="little")[:end]
        return bits.astype(bool)


def _table_size_for(entries):
    size = 16
    while entries * 10 > size * 7 or size < 2 * entries:
        size *= 2
    return size


def _smallest_table_for(entries):
    """Smallest table holding ``entries`` under the 0.7 load limit."""
    size = 16
    while entries * 10 > size * 7:
        size *= 2
    return size


def _shrunk(arr, cap):
    """``arr[:cap]`` as an array of its own, shrunk in place when possible."""
    try:
        arr.resize(cap, refcheck=False)  # realloc: no copy for large buffers
        return arr
    except ValueError:  # not owning its data (e.g. a loaded memory map)
        return arr[:cap].copy()


def _resized(arr, cap, keep):
    out = np.zeros(cap, arr.dtype)
    out[:keep] = arr[:keep]
    return out


def run_batch(storage, batch, kernel):
    """Run a resumable batch kernel (``kernel(i)`` inserts from item ``i``
    and returns where it stopped for lack of room) to the end, growing the
    storage in between.

    Growth is sized from the batch itself: after a stop, the tokens the
    batch has added so far per token it has read predict what the rest will
    add; the buffer grows to that (at least doubling, at most all remaining
    tokens). A generous guess costs only address space (untouched pages are
    never resident), and ``trim_slack`` gives the excess back at the end.
    """
    n = len(batch)
    offsets = batch.offsets
    used0 = int(storage.meta[K.M_TOK_USED])
    i = 0
    grew = False
    while True:
        i = kernel(i)
        if i >= n:
            break
        item = int(offsets[i + 1] - offsets[i])
        done = int(offsets[i] - offsets[0])
        remaining = int(offsets[n] - offsets[i])
        added = int(storage.meta[K.M_TOK_USED]) - used0
        guess = item if done == 0 else min(remaining, (added * remaining) // done * 3 // 2)
        storage.reserve(tokens=max(item, guess), nodes=max(2, min(2 * (n - i), 2 * storage.node_end)))
        grew = True
    if grew:
        storage.trim_slack()
