"""The queries of ``PrefixCache``: ``match`` (splits and refreshes, as
SGLang's ``match_prefix``), the read-only ``peek``, ``match_length`` and
their batches."""

from typing import TYPE_CHECKING, Any, Union

import numpy as np

from .._input.batch import Batch, as_batches
from .._input.run import map_batches, use_parallel
from .._input.sequence import as_tokens
from .._input.types import BatchLike, Namespace, Parallel, TokenSequence
from .._kernels import descent as descent_kernels
from .._kernels import prefix as prefix_kernels
from .._kernels.layout import ROOM, STAT_SLOTS
from .._tree.results import NO_VALUES_MATCHED, BatchMatch, Match
from .._tree.storage import span_positions
from .handles import GEN_SHIFT as _GEN_SHIFT

if TYPE_CHECKING:
    from .core import PrefixCache

_NO_VALUES = np.empty(0, np.int64)  # ``out`` of a call that writes no values
_INT64 = np.dtype(np.int64)
_new = tuple.__new__  # a named tuple without its Python-level constructor


def match(self: "PrefixCache", tokens: TokenSequence, namespace: Namespace = None) -> Match:
    """Longest cached prefix of ``tokens`` in whole pages: ``Match(length,
    node, values)``.

    When the match ends inside a node, that node is split so ``node``
    ends exactly at ``length``; the path's access time is refreshed.
    ``length == 0`` gives the namespace's root handle.
    """
    s = self._s
    if s.readonly:
        self._writable()
    q = tokens  # as_tokens' answer for an int64 C-contiguous 1-D array, checked inline
    if type(q) is not np.ndarray or q.dtype is not _INT64 or q.ndim != 1 \
            or not q.flags.c_contiguous:
        q = as_tokens(tokens)
    out = np.empty(q.shape[0], np.int64) if s.has_values else _NO_VALUES
    with self._lock:
        if self._readers:
            self._drain_readers()
        s = self._s  # under the lock: a reset() may have replaced it
        key = 0 if namespace is None else namespace  # None: the default namespace
        root = self._roots.get(key, -1) if type(key) is int else -1
        if root < 0:
            root, _ = self._root(namespace, create=False)
            if root < 0:  # an unknown namespace: a miss, and nothing is created
                self._count_misses(1, q.shape[0])
                return _new(Match, (0, self._handle_of(s.root),
                                    NO_VALUES_MATCHED if s.has_values else None))
        status, length, v, gen = prefix_kernels.pc_match_one(
            s.directory, s.like, root, 0, q, self._page, out
        )
        if status == ROOM:
            status, length, v, gen = s.run(
                lambda: prefix_kernels.pc_match_one(s.directory, s.like, root, 0, q, self._page, out))
    # tuple.__new__: a named tuple's own constructor is a Python call; the
    # handle is ``_handle``'s formula inline (the kernel returns ints)
    values = (out if length == out.shape[0] else out[:length]) if s.has_values else None
    return _new(Match, (length, ((gen ^ self._salt) << _GEN_SHIFT) | v, values))


def _count_misses(self: "PrefixCache", lookups, tokens):
    """Statistics of lookups answered without a kernel (an unknown
    namespace): as the match kernels count them."""
    meta = self._s.meta
    meta[STAT_SLOTS["lookups"]] += lookups
    meta[STAT_SLOTS["query_tokens"]] += tokens


def peek(self: "PrefixCache", tokens: TokenSequence, namespace: Namespace = None) -> Match:
    """``match`` without side effects: no split, no recency refresh, no
    statistics; an unknown namespace matches nothing and creates nothing.
    ``node`` is the node the match ends in (locking it protects at least
    the matched prefix).

    >>> from radix_soa import PrefixCache
    >>> pc = PrefixCache(); _ = pc.insert([1, 2, 3, 4], values=[5, 6, 7, 8])
    >>> m = pc.peek([1, 2, 9]); m.length, m.values.tolist(), pc.num_nodes
    (2, [5, 6], 1)
    """
    q = as_tokens(tokens)
    s = self._s
    with self._lock:
        root, _ = self._root(namespace, create=False)
        out: Any = np.empty(q.shape[0], np.int64) if s.has_values else None
        if root < 0:
            return Match(0, self._handle_of(s.root), NO_VALUES_MATCHED if s.has_values else None)
        length, v, gen = prefix_kernels.pc_peek(s.directory, s.like, root, q, self._page,
                                   out if s.has_values else s.like.astype(np.int64))
    return Match(int(length), self._handle(v, gen), out[:length] if s.has_values else None)


def match_length(self: "PrefixCache", tokens: TokenSequence, namespace: Namespace = None) -> int:
    """Length of the longest cached whole-page prefix of ``tokens``, read
    only: no split, no recency refresh, no stats (for schedulers and
    studies; also works on a memory-mapped cache).

    >>> from radix_soa import PrefixCache
    >>> pc = PrefixCache(values=False); _ = pc.insert([1, 2, 3])
    >>> pc.match_length([1, 2, 7]), pc.num_nodes
    (2, 1)
    """
    q = as_tokens(tokens)
    root, ns = self._root(namespace, create=False)
    if root < 0:
        return 0
    s = self._s
    generation = s.generation
    length = descent_kernels.match_at(s.directory, s.like, root, q, self._page)
    if s.generation != generation:  # a growth replaced the arrays meanwhile
        with self._lock:
            length = descent_kernels.match_at(s.directory, s.like, root, q, self._page)
    return int(length)


def match_length_batch(self: "PrefixCache", batch: BatchLike, namespace: Namespace = None,
                       parallel: Parallel = None) -> np.ndarray:
    """``match_length`` for every sequence of ``batch`` (an int64 array),
    in parallel for large batches (see ``RadixCache.exists_batch``)."""
    batches = as_batches(batch)
    root, ns = self._root(namespace, create=False)
    kernel = (
        descent_kernels.match_batch_parallel
        if use_parallel(parallel, batches)
        else descent_kernels.match_batch
    )
    s = self._s
    if root < 0:  # a namespace never used: nothing cached in it
        return map_batches(batches, np.int64, lambda b, res: None)
    read = self._read if kernel is descent_kernels.match_batch_parallel else self._read_released
    return map_batches(batches, np.int64, lambda b, res: read(
        lambda: kernel(*s.match_args, root, b.flat, b.offsets, self._page, res)))


def match_batch(self: "PrefixCache", batch: BatchLike, namespace: Namespace = None, *,
                with_values: bool = False) -> Union[np.ndarray, BatchMatch]:
    """Match lengths for many requests, exactly as a loop of ``match``
    (same splits, same recency updates, same stats), in one call.

    ``batch``: anything ``RadixCache.exists_batch`` takes. With
    ``with_values=True``, a ``BatchMatch(lengths, nodes, values)``: the
    node handles too, and the matched values as a ``Batch``.

    >>> from radix_soa import PrefixCache
    >>> pc = PrefixCache(); _ = pc.insert([1, 2, 3], values=[7, 8, 9])
    >>> pc.match_batch([[1, 2], [1, 2, 3, 4], [5]]).tolist()
    [2, 3, 0]
    >>> m = pc.match_batch([[1, 2, 3], [1, 5]], with_values=True)
    >>> m.lengths.tolist(), [v.tolist() for v in m.values]
    ([3, 1], [[7, 8, 9], [7]])
    """
    self._writable()
    batches = as_batches(batch)
    if not with_values:
        with self._writing:
            return map_batches(batches, np.int64,
                               lambda b, out: self._match_csr(namespace, b, out))
    parts = []
    with self._writing:
        s = self._s  # under the lock: a reset() may have replaced it
        for b in batches:
            out = np.zeros(len(b), np.int64)
            nodes = np.empty((len(b), 2), np.int64)
            nodes[:, 0], nodes[:, 1] = s.root, s.gen[s.root]  # an unknown namespace's answer
            vout = np.empty(b.flat.shape[0] if s.has_values else 0, np.int64)
            self._match_csr(namespace, b, out, vout, nodes.reshape(-1))
            parts.append((b, out, nodes, vout))
        nodes = np.concatenate([p[2] for p in parts])
        handles = self._handles(nodes[:, 0], nodes[:, 1])  # with this cache's salt
    lengths = np.concatenate([p[1] for p in parts]) if len(parts) != 1 else parts[0][1]
    values = None
    if s.has_values:  # each row's matched values, packed
        flat = np.concatenate([vout[span_positions(b.offsets[:-1], out)]
                               for b, out, _, vout in parts])
        offsets = np.zeros(lengths.shape[0] + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = Batch(flat, offsets)
    return BatchMatch(lengths, handles, values)


def _match_csr(self: "PrefixCache", namespace, b, out, vout=_NO_VALUES, nodes=_NO_VALUES):
    s = self._s
    root, _ = self._root(namespace, create=False)
    if root < 0:  # an unknown namespace: all misses, nothing created
        self._count_misses(len(b), b.num_tokens)
        return
    cursor = np.array([0, root], np.int64)
    s.run(
        lambda: prefix_kernels.pc_match_batch(
            s.arrays, 0, b.flat, b.offsets, self._page, cursor, out, vout, nodes
        ),
        plan=lambda st, tokens, nodes_: (0, max(nodes_, len(b) - int(cursor[0]))),
    )
