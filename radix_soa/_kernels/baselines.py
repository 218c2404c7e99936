"""Kernels of the array baselines ``radix_soa.baselines.arrays`` (an
uncompressed per-token trie and a whole-sequence hash set), in the same
style as the tree's: plain arrays, one open-addressing table, splitmix64
mixing, linear probing, the same load limit.

``TokenTrie`` arrays: ``token`` int64 and ``parent`` int32 per node (node 0
the root), ``term`` uint8 bitmap, ``table`` int32 keyed by (parent, token),
``meta`` int64 (``TRIE_*`` slots). ``SequenceHashSet``: ``buf`` int64 tokens
of the distinct sequences back to back, ``offs`` int64 offsets, ``table``
int32 sequence ids keyed by a hash of the whole sequence, ``meta`` (``SET_*``).
All allocated by the classes; kernels never allocate.

Call graph (callers after their callees): the array baselines' kernels
(token trie, sequence hash set)
"""

import numpy as np

from .config import kernel, kernel_inner
from .table import home_slot, mix64, table_fits, term_get

NO_ENTRY = -1

# TokenTrie meta slots
TRIE_NODES = 0       # nodes, root excluded (node ids 1..TRIE_NODES are used)
TRIE_TERMINALS = 1   # terminal marks set
TRIE_META_SIZE = 4

# SequenceHashSet meta slots
SET_SEQS = 0         # distinct sequences stored
SET_TOKENS = 1       # tokens in the flat buffer
SET_META_SIZE = 4


# ---------------------------------------------------------------- hashing

@kernel_inner
def _edge_hash(p, tok):
    """Hash of the child key (parent id ``p``, token ``tok``)."""
    h = mix64(np.uint64(np.int64(p)) + np.uint64(0x9E3779B97F4A7C15))
    return mix64(h ^ np.uint64(np.int64(tok)))


@kernel_inner
def _seq_hash(q, qs, qn):
    """Hash of the whole sequence ``q[qs:qs+qn]`` (its length, then each token)."""
    h = mix64(np.uint64(np.int64(qn)) + np.uint64(0x9E3779B97F4A7C15))
    for j in range(qn):
        h = mix64(h ^ np.uint64(np.int64(q[qs + j])))
    return h


# ---------------------------------------------------------------- token trie

@kernel_inner
def _trie_find(token, parent, table, p, tok):
    """Child of ``p`` labelled ``tok``, or -1."""
    mask = table.shape[0] - 1
    i = home_slot(table, _edge_hash(p, tok))
    while True:
        c = table[i]
        if c == NO_ENTRY:
            return NO_ENTRY
        if parent[c] == p and token[c] == tok:
            return c
        i = (i + 1) & mask


@kernel_inner
def _trie_put(token, parent, table, c):
    mask = table.shape[0] - 1
    i = home_slot(table, _edge_hash(parent[c], token[c]))
    while table[i] != NO_ENTRY:
        i = (i + 1) & mask
    table[i] = c


@kernel_inner
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
        if nodes + 1 + need > token.shape[0] or not table_fits(nodes + need, table.shape[0]):
            return i
        for j in range(d, qn):
            nodes += 1
            c = nodes
            tok = flat[qs + j]
            token[c] = tok
            parent[c] = v
            k = home_slot(table, _edge_hash(v, tok))
            while table[k] != NO_ENTRY:
                k = (k + 1) & mask
            table[k] = c
            v = c
        meta[TRIE_NODES] = nodes
        if term_get(term, v) == 1:
            new[i] = False
        else:
            term[v >> 3] |= np.uint8(1 << (v & 7))
            meta[TRIE_TERMINALS] += 1
            new[i] = True
    return n


@kernel
def trie_exists_batch(token, parent, term, table, flat, offsets, out):
    """``out[i]`` (bool, caller-allocated): sequence i of the CSR batch is stored."""
    for i in range(offsets.shape[0] - 1):
        qs = offsets[i]
        qn = offsets[i + 1] - qs
        v, d = _trie_walk(token, parent, table, flat, qs, qn)
        out[i] = qn > 0 and d == qn and term_get(term, v) == 1


@kernel
def trie_match_batch(token, parent, table, flat, offsets, out):
    """``out[i]`` (int64): tokens of sequence i present as a path."""
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

@kernel_inner
def _set_find(buf, offs, table, q, qs, qn):
    """``(slot, id)``: the stored sequence equal to ``q[qs:qs+qn]`` and its
    slot, or ``id == -1`` and the empty slot where it would go."""
    mask = table.shape[0] - 1
    i = home_slot(table, _seq_hash(q, qs, qn))
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
                or not table_fits(nseq + 1, table.shape[0])):
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
    """``out[i]`` (bool, caller-allocated): sequence i of the CSR batch is in the set."""
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
        i = home_slot(table, _seq_hash(buf, a, offs[s + 1] - a))
        while table[i] != NO_ENTRY:
            i = (i + 1) & mask
        table[i] = s
