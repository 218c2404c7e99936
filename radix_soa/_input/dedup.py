"""Duplicates within one batch, as indices that join back to the caller's
table (NumPy only: a 64-bit hash per sequence, then an exact check)."""

import numpy as np

from .batch import pack

_U64 = np.uint64


def first_occurrence(batch):
    """For each sequence of ``batch``, the index of the first sequence of the
    batch equal to it (its own index where it is the first): ``out[i] == i``
    marks the distinct sequences, ``out[i] < i`` a duplicate of ``out[i]``.

    ``batch`` is anything ``RadixCache.exists_batch`` takes. Exact: equal
    hashes are confirmed token by token. Uses about four int64 arrays the
    size of the batch's tokens.

    >>> first_occurrence([[1, 2], [3], [1, 2], [], [3], []]).tolist()
    [0, 1, 0, 3, 1, 3]
    """
    b = pack(batch)
    n = len(b)
    if n == 0:
        return np.empty(0, np.int64)
    first = _by_hash(b, _sequence_hashes(b))
    if not _confirmed(b, first):  # a 64-bit collision: settle it exactly
        first = _by_value(b)
    return first


def _splitmix(x):
    x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def _sequence_hashes(b):
    """One uint64 per sequence: the wrapping sum of a mix of (token, position)."""
    lengths = b.lengths
    starts = b.offsets[:-1]
    pos = np.arange(b.num_tokens, dtype=np.int64) - np.repeat(starts, lengths)
    with np.errstate(over="ignore"):
        mixed = _splitmix(b.flat.astype(np.int64).view(_U64) ^ _splitmix(pos.view(_U64) + _U64(1)))
        total = np.zeros(b.num_tokens + 1, _U64)
        np.cumsum(mixed, out=total[1:])
        return total[b.offsets[1:]] - total[starts]


def _by_hash(b, hashes):
    n = len(b)
    index = np.arange(n, dtype=np.int64)
    lengths = b.lengths
    order = np.lexsort((index, hashes, lengths))  # by length, hash, then index
    key_len, key_hash = lengths[order], hashes[order]
    head = np.ones(n, bool)  # the first of each run of equal (length, hash)
    head[1:] = (key_len[1:] != key_len[:-1]) | (key_hash[1:] != key_hash[:-1])
    group_first = order[np.flatnonzero(head)]
    first = np.empty(n, np.int64)
    first[order] = group_first[np.cumsum(head) - 1]
    return first


def _confirmed(b, first):
    """True if every sequence equals the one ``first`` names, token by token."""
    dup = np.flatnonzero(first != np.arange(len(b)))
    if dup.size == 0:
        return True
    lengths = b.lengths[dup]
    step = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(lengths) - lengths, lengths)
    mine = np.repeat(b.offsets[dup], lengths) + step
    theirs = np.repeat(b.offsets[first[dup]], lengths) + step
    return bool(np.array_equal(b.flat[mine], b.flat[theirs]))


def _by_value(b):
    seen = {}
    flat = b.flat.astype(np.int64, copy=False)
    off = b.offsets
    return np.array([seen.setdefault(flat[off[i]:off[i + 1]].tobytes(), i)
                     for i in range(len(b))], np.int64)
