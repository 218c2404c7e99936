"""Two array baselines ``radix_soa.footprint`` measures ``RadixCache`` against,
built in the same struct-of-arrays style (plain NumPy arrays, Numba kernels,
one open-addressing hash table, splitmix64 mixing, linear probing, load kept
at or under 0.7 with the same sizing rule as the radix tree's child table):

* ``TokenTrie``: an uncompressed trie with **one node per token**. Per node:
  ``token`` (int64) and ``parent`` (int32), a terminal bitmap, and a child
  table keyed by ``(parent, token)``. Node 0 is the root; node ``v`` is the
  distinct prefix spelled by the tokens on the path root..v, so the trie has
  exactly one node per distinct non-empty prefix.
* ``SequenceHashSet``: a hash set of **whole sequences**, no prefix sharing.
  Distinct sequences are stored back to back in one flat int64 buffer with
  int64 offsets; the table holds int32 sequence ids keyed by a hash of the
  whole sequence (its length and every token).

The kernels live here, apart from ``radix_soa._kernels``: they call nothing
there (Numba's on-disk cache does not follow calls across modules), so
``_mix64`` is repeated.

>>> trie = TokenTrie()
>>> trie.insert_batch([[1, 2, 3], [1, 2, 4], [1, 2, 3]]).tolist()
[True, True, False]
>>> len(trie), trie.num_nodes    # prefixes 1, 12, 123, 124
(2, 4)
>>> trie.exists_batch([[1, 2, 3], [1, 2], [1, 2, 4, 5]]).tolist()
[True, False, False]
>>> hs = SequenceHashSet()
>>> hs.insert_batch([[1, 2, 3], [1, 2, 4], [1, 2, 3]]).tolist()
[True, True, False]
>>> len(hs), hs.num_tokens       # two sequences of 3 tokens, stored whole
(2, 6)
"""

import numpy as np
from numba import njit

from ._storage import _table_size_for
from .batch import pack

# Kernels never allocate; without NRT refcounting their calls stay cheap.
kernel = njit(cache=True, _nrt=False)

NO_ENTRY = -1

# TokenTrie meta slots
TRIE_NODES = 0       # nodes, root excluded (node ids 1..TRIE_NODES are used)
TRIE_TERMINALS = 1   # terminal marks set
TRIE_META_SIZE = 4

# SequenceHashSet meta slots
SET_SEQS = 0         # distinct sequences stored
SET_TOKENS = 1       # tokens in the flat buffer
SET_META_SIZE = 4

_MIN_NODES = 16
_MIN_TOKENS = 256
_MIN_SEQS = 16


# ---------------------------------------------------------------- hashing

@kernel
def _mix64(x):
    # splitmix64 finalizer, pure uint64 arithmetic
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


@kernel
def _edge_hash(p, tok):
    """Hash of the child key (parent id ``p``, token ``tok``)."""
    h = _mix64(np.uint64(np.int64(p)) + np.uint64(0x9E3779B97F4A7C15))
    return _mix64(h ^ np.uint64(np.int64(tok)))


@kernel
def _seq_hash(q, qs, qn):
    """Hash of the whole sequence ``q[qs:qs+qn]`` (its length, then each token)."""
    h = _mix64(np.uint64(np.int64(qn)) + np.uint64(0x9E3779B97F4A7C15))
    for j in range(qn):
        h = _mix64(h ^ np.uint64(np.int64(q[qs + j])))
    return h


@kernel
def _slot(table, h):
    return np.int64(h & np.uint64(table.shape[0] - 1))


@kernel
def _term_get(term, v):
    return (term[v >> 3] >> (v & 7)) & 1


# ---------------------------------------------------------------- token trie

@kernel
def _trie_find(token, parent, table, p, tok):
    """Child of ``p`` labelled ``tok``, or -1."""
    mask = table.shape[0] - 1
    i = _slot(table, _edge_hash(p, tok))
    while True:
        c = table[i]
        if c == NO_ENTRY:
            return NO_ENTRY
        if parent[c] == p and token[c] == tok:
            return c
        i = (i + 1) & mask


@kernel
def _trie_put(token, parent, table, c):
    mask = table.shape[0] - 1
    i = _slot(table, _edge_hash(parent[c], token[c]))
    while table[i] != NO_ENTRY:
        i = (i + 1) & mask
    table[i] = c


@kernel
def _trie_walk(token, parent, table, q, qs, qn):
    """Deepest node on the path of ``q[qs:qs+qn]`` and its depth."""
    v = 0
    d = 0
    while d < qn:
        c = _trie_find(token, parent, table, v, q[qs + d])
        if c == NO_ENTRY:
            break
        v = c
        d += 1
    return v, d


@kernel
def trie_insert_batch(token, parent, term, table, meta, flat, offsets, i0, new):
    """Insert sequences ``i0..`` of a CSR batch (non-empty), one node per new
    token; ``new[i]`` is True where sequence ``i`` was not stored before.
    Returns where it stopped: ``len`` when done, else the first sequence whose
    new nodes do not fit the arrays or the table's load limit (nothing of it
    was inserted)."""
    n = offsets.shape[0] - 1
    mask = table.shape[0] - 1
    for i in range(i0, n):
        qs = offsets[i]
        qn = offsets[i + 1] - qs
        v, d = _trie_walk(token, parent, table, flat, qs, qn)
        nodes = meta[TRIE_NODES]
        need = qn - d
        if nodes + 1 + need > token.shape[0] or (nodes + need) * 10 > table.shape[0] * 7:
            return i
        for j in range(d, qn):
            nodes += 1
            c = nodes
            tok = flat[qs + j]
            token[c] = tok
            parent[c] = v
            k = _slot(table, _edge_hash(v, tok))
            while table[k] != NO_ENTRY:
                k = (k + 1) & mask
            table[k] = c
            v = c
        meta[TRIE_NODES] = nodes
        if _term_get(term, v) == 1:
            new[i] = False
        else:
            term[v >> 3] |= np.uint8(1 << (v & 7))
            meta[TRIE_TERMINALS] += 1
            new[i] = True
    return n


@kernel
def trie_exists_batch(token, parent, term, table, flat, offsets, out):
    for i in range(offsets.shape[0] - 1):
        qs = offsets[i]
        qn = offsets[i + 1] - qs
        v, d = _trie_walk(token, parent, table, flat, qs, qn)
        out[i] = qn > 0 and d == qn and _term_get(term, v) == 1


@kernel
def trie_match_batch(token, parent, table, flat, offsets, out):
    for i in range(offsets.shape[0] - 1):
        qs = offsets[i]
        v, d = _trie_walk(token, parent, table, flat, qs, offsets[i + 1] - qs)
        out[i] = d


@kernel
def trie_rebuild_table(token, parent, table, nodes):
    """Fill an empty ``table`` with nodes ``1..nodes``."""
    for c in range(1, nodes + 1):
        _trie_put(token, parent, table, c)


# ---------------------------------------------------------------- sequence hash set

@kernel
def _set_find(buf, offs, table, q, qs, qn):
    """``(slot, id)``: the stored sequence equal to ``q[qs:qs+qn]`` and its
    slot, or ``id == -1`` and the empty slot where it would go."""
    mask = table.shape[0] - 1
    i = _slot(table, _seq_hash(q, qs, qn))
    while True:
        s = table[i]
        if s == NO_ENTRY:
            return i, NO_ENTRY
        a = offs[s]
        if offs[s + 1] - a == qn:
            same = True
            for j in range(qn):
                if buf[a + j] != q[qs + j]:
                    same = False
                    break
            if same:
                return i, s
        i = (i + 1) & mask


@kernel
def set_insert_batch(buf, offs, table, meta, flat, offsets, i0, new):
    """Insert sequences ``i0..`` of a CSR batch; ``new[i]`` is True where
    sequence ``i`` was not stored before. Returns where it stopped (``len``
    when done, else the first new sequence that does not fit; nothing of it
    was stored)."""
    n = offsets.shape[0] - 1
    for i in range(i0, n):
        qs = offsets[i]
        qn = offsets[i + 1] - qs
        slot, s = _set_find(buf, offs, table, flat, qs, qn)
        if s != NO_ENTRY:
            new[i] = False
            continue
        nseq = meta[SET_SEQS]
        used = meta[SET_TOKENS]
        if (used + qn > buf.shape[0] or nseq + 2 > offs.shape[0]
                or (nseq + 1) * 10 > table.shape[0] * 7):
            return i
        for j in range(qn):
            buf[used + j] = flat[qs + j]
        offs[nseq + 1] = used + qn
        table[slot] = nseq
        meta[SET_SEQS] = nseq + 1
        meta[SET_TOKENS] = used + qn
        new[i] = True
    return n


@kernel
def set_contains_batch(buf, offs, table, flat, offsets, out):
    for i in range(offsets.shape[0] - 1):
        qs = offsets[i]
        slot, s = _set_find(buf, offs, table, flat, qs, offsets[i + 1] - qs)
        out[i] = s != NO_ENTRY


@kernel
def set_rebuild_table(buf, offs, table, nseq):
    """Fill an empty ``table`` with sequence ids ``0..nseq-1``."""
    mask = table.shape[0] - 1
    for s in range(nseq):
        a = offs[s]
        i = _slot(table, _seq_hash(buf, a, offs[s + 1] - a))
        while table[i] != NO_ENTRY:
            i = (i + 1) & mask
        table[i] = s


# ---------------------------------------------------------------- Python side

def _batch(seqs, what):
    """``seqs`` as a ``Batch``; empty sequences raise ``ValueError`` when
    ``what`` names an insert."""
    b = pack(seqs)
    if what is not None and len(b) and np.any(b.lengths == 0):
        i = int(np.flatnonzero(b.lengths == 0)[0])
        raise ValueError(f"cannot {what} an empty sequence (sequence {i} of the batch)")
    return b


def _grown(arr, cap, keep, fill=0):
    out = np.full(cap, fill, arr.dtype)
    out[:keep] = arr[:keep]
    return out


def _usage(named):
    """``{name: (array, used elements)}`` -> the usage dict of ``memory_report``."""
    return {name: {"dtype": a.dtype.name, "used_bytes": int(n) * a.itemsize,
                   "allocated_bytes": a.nbytes} for name, (a, n) in named.items()}


def _report(arrays, **counts):
    used = sum(a["used_bytes"] for a in arrays.values())
    total = sum(a["allocated_bytes"] for a in arrays.values())
    return {"used_bytes": used, "total_bytes": total, "slack_bytes": total - used,
            **counts, "arrays": arrays}


class TokenTrie:
    """A set of integer sequences in an uncompressed trie of parallel arrays:
    one node (an int64 token, an int32 parent, a terminal bit) per distinct
    non-empty prefix, and one open-addressing child table keyed by
    ``(parent, token)``.

    >>> t = TokenTrie()
    >>> t.insert_batch([[5, 6], [5, 7, 8]]).tolist()
    [True, True]
    >>> t.num_nodes, len(t), t.match_prefix_batch([[5, 7, 9]]).tolist()
    (4, 2, [2])
    """

    def __init__(self, node_capacity=_MIN_NODES):
        cap = max(int(node_capacity), _MIN_NODES)
        self.token = np.zeros(cap, np.int64)
        self.parent = np.zeros(cap, np.int32)
        self.parent[0] = -1
        self.term = np.zeros((cap + 7) // 8, np.uint8)
        self.table = np.full(_table_size_for(cap), NO_ENTRY, np.int32)
        self.meta = np.zeros(TRIE_META_SIZE, np.int64)

    @property
    def num_nodes(self):
        """Nodes, root excluded: the number of distinct non-empty prefixes."""
        return int(self.meta[TRIE_NODES])

    def __len__(self):
        return int(self.meta[TRIE_TERMINALS])

    def _reserve(self, nodes):
        """Room for ``nodes`` more nodes and their table entries."""
        have = self.num_nodes
        end = have + 1  # root included
        if end + nodes > self.token.shape[0]:
            cap = max(2 * self.token.shape[0], end + nodes)
            self.token = _grown(self.token, cap, end)
            self.parent = _grown(self.parent, cap, end)
            self.term = _grown(self.term, (cap + 7) // 8, (end + 7) // 8)
        if (have + nodes) * 10 > self.table.shape[0] * 7:
            self.table = np.full(_table_size_for(have + nodes), NO_ENTRY, np.int32)
            trie_rebuild_table(self.token, self.parent, self.table, have)

    def insert_batch(self, seqs):
        """Insert every sequence (anything ``radix_soa.pack`` takes); a bool
        array, True where a sequence was not stored before. Empty sequences
        raise ``ValueError`` before anything is inserted."""
        b = _batch(seqs, "insert")
        new = np.zeros(len(b), np.bool_)
        i = 0
        while True:
            i = trie_insert_batch(self.token, self.parent, self.term, self.table, self.meta,
                                  b.flat, b.offsets, i, new)
            if i >= len(b):
                return new
            self._reserve(int(b.offsets[i + 1] - b.offsets[i]))

    def exists_batch(self, seqs):
        """True where a sequence was inserted exactly."""
        b = _batch(seqs, None)
        out = np.zeros(len(b), np.bool_)
        trie_exists_batch(self.token, self.parent, self.term, self.table, b.flat, b.offsets, out)
        return out

    def match_prefix_batch(self, seqs):
        """Length of the longest prefix present as a path, per sequence."""
        b = _batch(seqs, None)
        out = np.zeros(len(b), np.int64)
        trie_match_batch(self.token, self.parent, self.table, b.flat, b.offsets, out)
        return out

    def memory_report(self):
        """Array bytes: ``used_bytes`` counts each node array up to the last
        node (root included) and the child table whole; ``total_bytes`` is
        what is allocated."""
        end = self.num_nodes + 1
        arrays = _usage({"token": (self.token, end), "parent": (self.parent, end),
                         "term": (self.term, (end + 7) // 8),
                         "table": (self.table, self.table.shape[0]),
                         "meta": (self.meta, self.meta.shape[0])})
        return _report(arrays, nodes=self.num_nodes, sequences=len(self))

    def __repr__(self):
        return f"TokenTrie(sequences={len(self)}, nodes={self.num_nodes})"


class SequenceHashSet:
    """A set of integer sequences stored whole: distinct sequences back to
    back in one flat int64 buffer with int64 offsets, and an open-addressing
    table of int32 sequence ids keyed by a hash of the whole sequence. No
    prefix sharing: it is what a cache of exact sequences costs.

    >>> s = SequenceHashSet()
    >>> s.insert_batch([[1, 2], [1, 2, 3]]).tolist()
    [True, True]
    >>> s.contains_batch([[1, 2], [1], [1, 2, 3]]).tolist()
    [True, False, True]
    """

    def __init__(self, token_capacity=_MIN_TOKENS, seq_capacity=_MIN_SEQS):
        tcap = max(int(token_capacity), _MIN_TOKENS)
        scap = max(int(seq_capacity), _MIN_SEQS)
        self.buf = np.zeros(tcap, np.int64)
        self.offs = np.zeros(scap + 1, np.int64)
        self.table = np.full(_table_size_for(scap), NO_ENTRY, np.int32)
        self.meta = np.zeros(SET_META_SIZE, np.int64)

    def __len__(self):
        return int(self.meta[SET_SEQS])

    @property
    def num_tokens(self):
        """Tokens in the buffer: the lengths of the distinct sequences, summed."""
        return int(self.meta[SET_TOKENS])

    def _reserve(self, tokens, seqs):
        n = len(self)
        used = self.num_tokens
        if used + tokens > self.buf.shape[0]:
            self.buf = _grown(self.buf, max(2 * self.buf.shape[0], used + tokens), used)
        if n + 1 + seqs > self.offs.shape[0]:
            self.offs = _grown(self.offs, max(2 * self.offs.shape[0], n + 1 + seqs), n + 1)
        if (n + seqs) * 10 > self.table.shape[0] * 7:
            self.table = np.full(_table_size_for(n + seqs), NO_ENTRY, np.int32)
            set_rebuild_table(self.buf, self.offs, self.table, n)

    def insert_batch(self, seqs):
        """Insert every sequence; a bool array, True where a sequence was not
        stored before. Empty sequences raise ``ValueError`` first."""
        b = _batch(seqs, "insert")
        new = np.zeros(len(b), np.bool_)
        i = 0
        while True:
            i = set_insert_batch(self.buf, self.offs, self.table, self.meta,
                                 b.flat, b.offsets, i, new)
            if i >= len(b):
                return new
            self._reserve(int(b.offsets[i + 1] - b.offsets[i]), 1)

    def contains_batch(self, seqs):
        """True where a sequence is stored."""
        b = _batch(seqs, None)
        out = np.zeros(len(b), np.bool_)
        set_contains_batch(self.buf, self.offs, self.table, b.flat, b.offsets, out)
        return out

    def memory_report(self):
        """Array bytes: ``used_bytes`` counts the buffer up to its last token,
        the offsets up to the last sequence and the table whole;
        ``total_bytes`` is what is allocated."""
        n = len(self)
        arrays = _usage({"buf": (self.buf, self.num_tokens), "offs": (self.offs, n + 1),
                         "table": (self.table, self.table.shape[0]),
                         "meta": (self.meta, self.meta.shape[0])})
        return _report(arrays, sequences=n, tokens=self.num_tokens)

    def __repr__(self):
        return f"SequenceHashSet(sequences={len(self)}, tokens={self.num_tokens})"
