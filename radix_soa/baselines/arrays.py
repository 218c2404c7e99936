"""Two array baselines ``radix_soa.studies.footprint`` measures ``RadixCache`` against,
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

Their kernels are in ``radix_soa._kernels.baselines``.

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

from .._kernels import baselines as baselines_kernels
from .._kernels.baselines import (NO_ENTRY, SET_META_SIZE, SET_SEQS, SET_TOKENS, TRIE_META_SIZE,
                                  TRIE_NODES, TRIE_TERMINALS)
from .._kernels.table import table_fits
from .._tree.storage import table_size_for
from .._input.batch import pack

__all__ = ["TokenTrie", "SequenceHashSet", "NO_ENTRY"]

_MIN_NODES = 16
_MIN_TOKENS = 256
_MIN_SEQS = 16


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
        self.table = np.full(table_size_for(cap), NO_ENTRY, np.int32)
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
        new = {}  # built beside the live arrays, swapped in by one update
        if end + nodes > self.token.shape[0]:
            cap = max(2 * self.token.shape[0], end + nodes)
            new["token"] = _grown(self.token, cap, end)
            new["parent"] = _grown(self.parent, cap, end)
            new["term"] = _grown(self.term, (cap + 7) // 8, (end + 7) // 8)
        if not table_fits(have + nodes, self.table.shape[0]):
            new["table"] = np.full(table_size_for(have + nodes), NO_ENTRY, np.int32)
            baselines_kernels.trie_rebuild_table(
                new.get("token", self.token), new.get("parent", self.parent), new["table"], have
            )
        self.__dict__.update(new)

    def insert_batch(self, seqs):
        """Insert every sequence (anything ``radix_soa.pack`` takes); a bool
        array, True where a sequence was not stored before. Empty sequences
        raise ``ValueError`` before anything is inserted."""
        b = _batch(seqs, "insert")
        new = np.zeros(len(b), np.bool_)
        i = 0
        while True:
            i = baselines_kernels.trie_insert_batch(
                self.token, self.parent, self.term, self.table, self.meta, b.flat, b.offsets, i, new
            )
            if i >= len(b):
                return new
            self._reserve(int(b.offsets[i + 1] - b.offsets[i]))

    def exists_batch(self, seqs):
        """True where a sequence was inserted exactly."""
        b = _batch(seqs, None)
        out = np.zeros(len(b), np.bool_)
        baselines_kernels.trie_exists_batch(
            self.token, self.parent, self.term, self.table, b.flat, b.offsets, out
        )
        return out

    def match_prefix_batch(self, seqs):
        """Length of the longest prefix present as a path, per sequence."""
        b = _batch(seqs, None)
        out = np.zeros(len(b), np.int64)
        baselines_kernels.trie_match_batch(
            self.token, self.parent, self.table, b.flat, b.offsets, out
        )
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
        self.table = np.full(table_size_for(scap), NO_ENTRY, np.int32)
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
        new = {}  # built beside the live arrays, swapped in by one update
        if used + tokens > self.buf.shape[0]:
            new["buf"] = _grown(self.buf, max(2 * self.buf.shape[0], used + tokens), used)
        if n + 1 + seqs > self.offs.shape[0]:
            new["offs"] = _grown(self.offs, max(2 * self.offs.shape[0], n + 1 + seqs), n + 1)
        if not table_fits(n + seqs, self.table.shape[0]):
            new["table"] = np.full(table_size_for(n + seqs), NO_ENTRY, np.int32)
            baselines_kernels.set_rebuild_table(
                new.get("buf", self.buf), new.get("offs", self.offs), new["table"], n
            )
        self.__dict__.update(new)

    def insert_batch(self, seqs):
        """Insert every sequence; a bool array, True where a sequence was not
        stored before. Empty sequences raise ``ValueError`` first."""
        b = _batch(seqs, "insert")
        new = np.zeros(len(b), np.bool_)
        i = 0
        while True:
            i = baselines_kernels.set_insert_batch(self.buf, self.offs, self.table, self.meta,
                                 b.flat, b.offsets, i, new)
            if i >= len(b):
                return new
            self._reserve(int(b.offsets[i + 1] - b.offsets[i]), 1)

    def contains_batch(self, seqs):
        """True where a sequence is stored."""
        b = _batch(seqs, None)
        out = np.zeros(len(b), np.bool_)
        baselines_kernels.set_contains_batch(
            self.buf, self.offs, self.table, b.flat, b.offsets, out
        )
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
