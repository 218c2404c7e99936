"""``RadixCache``: a set of integer sequences stored as a compressed radix tree."""

import operator
from typing import Iterator, Tuple

import numpy as np
from numpy.typing import DTypeLike

from ._tree.base import TreeCache
from ._tree.invariants import check_tree
from ._kernels import descent as descent_kernels
from ._kernels import ids as ids_kernels
from ._kernels import mutation as mutation_kernels
from ._kernels import walks as walks_kernels
from ._kernels import chunks as chunk_kernels
from ._kernels.layout import M_NODE_END, ROOM
from ._input.sequence import as_tokens, check_fits
from ._tree.storage import TreeStorage, batch_plan
from ._input.validate import MAX_SEQUENCE_TOKENS, check_length
from ._input.types import BatchLike, Parallel, Progress, TokenSequence
from ._input.batch import as_batches
from ._input.chunked import Chunks, check_chunks_fit
from ._input.chunked import descend as chunked_descend
from ._input.run import map_batches, run_batches


_NO_INT = np.empty(0, np.int64)
_NO_BOOL = np.empty(0, np.bool_)


class RadixCache(TreeCache):
    """A set of integer token sequences in a struct-of-arrays radix tree.

    Shared prefixes are stored once; a node splits where two sequences
    diverge; ``exists`` is true only for sequences inserted exactly.

    >>> rc = RadixCache()
    >>> rc.insert([1, 2, 3, 4, 5])
    True
    >>> rc.insert([1, 2, 3, 9])
    True
    >>> rc.exists([1, 2, 3, 4, 5]), rc.exists([1, 2, 3])
    (True, False)
    >>> rc.match_prefix([1, 2, 3, 4, 7])
    4
    >>> len(rc), rc.num_nodes, rc.num_tokens
    (2, 3, 6)

    ``dtype`` is the token buffer's type: ``np.int64`` (default) takes any
    signed 64-bit token; ``np.int32``/``np.uint16``... halve or quarter the
    buffer and raise ``OverflowError`` on tokens that do not fit.

    Safe to share between threads (see ``radix_soa._tree.base``): writes take the
    cache's lock, reads see the tree as it was at some instant of the call.
    An exception leaves the tree as it was or as the call made it (a batch:
    a prefix of it inserted).
    """

    def __init__(self, dtype: DTypeLike = np.int64) -> None:
        self._init_lock()
        self._s = TreeStorage(dtype)

    # ------------------------------------------------------------ sizes
    @property
    def dtype(self) -> np.dtype:
        """NumPy dtype of the token buffer."""
        return self._s.dtype

    def __len__(self) -> int:
        return self._s.count("terminals")

    @property
    def num_nodes(self) -> int:
        """Nodes in the tree, root excluded."""
        return self._s.count("nodes")

    @property
    def num_tokens(self) -> int:
        """Tokens held in live node spans (shared prefixes counted once)."""
        return self._s.count("tokens")

    # ------------------------------------------------------------ queries
    def exists(self, sequence: TokenSequence) -> bool:
        """True if ``sequence`` was inserted exactly (and not removed since).

        >>> rc = RadixCache(); _ = rc.insert([7, 8, 9])
        >>> rc.exists([7, 8, 9]), rc.exists([7, 8]), rc.exists([])
        (True, False, False)
        """
        q = as_tokens(sequence)
        s = self._s
        generation = s.generation
        found = descent_kernels.exists_at(s.directory, s.like, s.root, q)
        if s.generation != generation:  # a growth replaced the arrays meanwhile
            with self._lock:
                found = descent_kernels.exists_at(s.directory, s.like, s.root, q)
        return bool(found)

    __contains__ = exists

    def match_length(self, sequence: TokenSequence) -> int:
        """Length of the longest prefix of ``sequence`` present as a path
        (whether or not a stored sequence ends there): the name
        ``PrefixCache`` has for it too; ``match_prefix`` is its first name.

        >>> rc = RadixCache(); _ = rc.insert([1, 2, 3])
        >>> rc.match_length([1, 2, 5]), rc.match_prefix([4])
        (2, 0)
        """
        q = as_tokens(sequence)
        s = self._s
        generation = s.generation
        length = descent_kernels.match1_at(s.directory, s.like, s.root, q)
        if s.generation != generation:
            with self._lock:
                length = descent_kernels.match1_at(s.directory, s.like, s.root, q)
        return int(length)

    match_prefix = match_length

    # ------------------------------------------------------------ mutation
    def insert(self, sequence: TokenSequence) -> bool:
        """Store ``sequence``; True if it was not stored before.

        Raises ``ValueError`` for an empty sequence and ``OverflowError`` for
        a token outside the dtype; the tree is unchanged after an error.
        """
        self._writable()
        q = as_tokens(sequence)
        n = q.shape[0]
        if n == 0:
            raise ValueError("cannot insert an empty sequence")
        if n > MAX_SEQUENCE_TOKENS:
            check_length(n)  # raises
        s = self._s
        check_fits(q, s.dtype)
        with self._lock:
            if self._readers:
                self._drain_readers()
            status, new = mutation_kernels.radix_insert(s.directory, s.like, s.root, q)
            if status == ROOM:
                status, new = s.run(lambda: mutation_kernels.radix_insert(s.directory, s.like, s.root, q))
        return new == 1

    def remove(self, sequence: TokenSequence) -> None:
        """Remove a stored sequence; ``KeyError`` if it is not stored exactly.

        The tree stays canonical: the dead tail is pruned and a node left
        with one child and no terminal mark merges with that child.
        """
        self._writable()
        q = as_tokens(sequence)
        s = self._s
        with self._writing:
            status, removed = s.run(lambda: mutation_kernels.remove_one(s.arrays, s.root, q))
        if not removed:
            raise KeyError(_short(q))

    # ------------------------------------------------------------ batches
    def insert_batch(self, batch: BatchLike, *, progress: Progress = False) -> np.ndarray:
        """Insert many sequences; returns a bool array, True where a sequence
        was not stored before (the first of duplicates within the batch).

        ``batch`` is anything ``exists_batch`` takes. All-or-nothing: every
        sequence is validated (non-empty, integers that fit the dtype) before
        any is inserted. ``progress``: as for ``exists_batch``.

        >>> rc = RadixCache()
        >>> rc.insert_batch([[1, 2, 3], [1, 2], [1, 2, 3]]).tolist()
        [True, True, False]
        """
        self._writable()
        batches = as_batches(batch, chunks=True)
        for b in batches:
            lengths = b.lengths
            if np.any(lengths == 0):
                raise ValueError(f"cannot insert an empty sequence (sequence "
                                 f"{int(np.flatnonzero(lengths == 0)[0])} of the batch)")
            if isinstance(b, Chunks):
                check_chunks_fit(b, self._s.dtype)
            else:
                check_fits(b.flat, self._s.dtype)
            if len(b):
                check_length(int(lengths.max()), "a sequence of the batch")
        grew: list = []
        with self._writing:
            try:
                return map_batches(batches, np.bool_,
                                   lambda b, new: self._insert_csr(b, new, grew), progress)
            finally:
                if grew:  # once per call, not per chunk or slice
                    try:
                        self._s.trim_slack()
                    except MemoryError:  # giving memory back is optional; the batch is in
                        pass

    def _insert_csr(self, b, new, grew):
        s = self._s
        cursor = np.zeros(1, np.int64)
        if isinstance(b, Chunks):
            call = lambda: chunk_kernels.insert_chunks(  # noqa: E731
                s.arrays, s.root, *b.args, b.lo, b.hi, b.like, cursor, new)
        else:
            call = lambda: mutation_kernels.radix_insert_batch(  # noqa: E731
                s.arrays, s.root, b.flat, b.offsets, cursor, new)
        s.run(call, plan=batch_plan(b, cursor, s.count("tokens"), s.count("nodes"), grew))

    def exists_batch(self, batch: BatchLike, parallel: Parallel = None, *,
                     progress: Progress = False) -> np.ndarray:
        """``exists`` for every sequence of ``batch``, as a bool array.

        ``batch``: a list of sequences, a ``Batch``, a ``(flat, offsets)``
        tuple of NumPy arrays, a pyarrow List/LargeList/Chunked array, or
        any Arrow-speaking column (polars, pandas ``ArrowDtype``, Hugging
        Face ``datasets``, DuckDB; see ``radix_soa._input.batch.as_batches``).
        ``parallel``: None (default) uses Numba's threads for each batch (or
        chunk of a chunked column) of at least
        ``radix_soa._input.run.PARALLEL_MIN_TOKENS`` tokens; True/False forces it.
        ``NUMBA_NUM_THREADS`` caps the threads. ``progress=True`` shows a
        ``tqdm`` bar (the ``progress`` extra) for the call, updated every
        ``radix_soa._input.run.PROGRESS_STEP`` tokens; a callable
        ``progress(done, total)`` (in tokens) is called instead.

        >>> rc = RadixCache(); _ = rc.insert_batch([[1, 2], [3]])
        >>> rc.exists_batch([[1, 2], [1], [3]]).tolist()
        [True, False, True]
        """
        s = self._s
        return run_batches(
            as_batches(batch, chunks=True),
            np.bool_,
            parallel,
            lambda b, res: self._read_released(
                lambda: chunked_descend(s.exists_args, s.root, b, 1, True, res, _NO_INT)
                if isinstance(b, Chunks) else
                descent_kernels.exists_batch(*s.exists_args, s.root, b.flat, b.offsets, res)
            ),
            lambda b, res: self._read(
                lambda: chunked_descend(s.exists_args, s.root, b, 1, True, res, _NO_INT, True)
                if isinstance(b, Chunks) else
                descent_kernels.exists_batch_parallel(*s.exists_args, s.root, b.flat, b.offsets, res)
            ),
            progress,
        )

    def match_length_batch(self, batch: BatchLike, parallel: Parallel = None, *,
                           progress: Progress = False) -> np.ndarray:
        """``match_length`` for every sequence of ``batch``, as an int64 array
        (arguments as for ``exists_batch``); ``match_prefix_batch`` is its
        first name.

        >>> rc = RadixCache(); _ = rc.insert([1, 2, 3])
        >>> rc.match_length_batch([[1, 2, 9], [5], [1, 2, 3, 4]]).tolist()
        [2, 0, 3]
        """
        s = self._s
        return run_batches(
            as_batches(batch, chunks=True),
            np.int64,
            parallel,
            lambda b, res: self._read_released(
                lambda: chunked_descend(s.match_args, s.root, b, 1, False, _NO_BOOL, res)
                if isinstance(b, Chunks) else
                descent_kernels.match_batch(*s.match_args, s.root, b.flat, b.offsets, 1, res)
            ),
            lambda b, res: self._read(
                lambda: chunked_descend(s.match_args, s.root, b, 1, False, _NO_BOOL, res, True)
                if isinstance(b, Chunks) else
                descent_kernels.match_batch_parallel(
                    *s.match_args, s.root, b.flat, b.offsets, 1, res
                )
            ),
            progress,
        )

    match_prefix_batch = match_length_batch

    # ------------------------------------------------------------ sequence ids
    def ids(self, batch: BatchLike) -> np.ndarray:
        """The id of the stored sequence equal to each sequence of
        ``batch`` (int64; -1 where it is not stored), to join results back
        to a table of the stored rows.

        A stored sequence keeps its id while it is stored: across inserts
        and removes of other sequences, ``compact()``, ``save``/``load`` and
        pickling (it is the id of the node the sequence ends at). The id of
        a removed sequence may be given to one inserted later.
        ``sequence(id)`` gives the tokens back.

        >>> rc = RadixCache(); _ = rc.insert_batch([[1, 2, 3], [1, 2], [4]])
        >>> ids = rc.ids([[1, 2, 3], [1, 2, 3], [1, 2, 9], [4]])
        >>> bool(ids[0] == ids[1]), int(ids[2]), rc.sequence(ids[3]).tolist()
        (True, -1, [4])
        """
        return self._ids(batch)[0]

    def prefix_ids(self, batch: BatchLike) -> np.ndarray:
        """For each sequence of ``batch``, the id (see ``ids``) of the longest
        stored sequence that is a prefix of it (the sequence itself when
        stored; -1 when no stored sequence is a prefix of it).

        >>> rc = RadixCache(); _ = rc.insert_batch([[1, 2], [1, 2, 3, 4]])
        >>> p = rc.prefix_ids([[1, 2, 3], [1, 2, 3, 4, 5], [1], [1, 2]])
        >>> [rc.sequence(i).tolist() if i >= 0 else None for i in p]
        [[1, 2], [1, 2, 3, 4], None, [1, 2]]
        """
        return self._ids(batch)[1]

    def _ids(self, batch):
        s = self._s
        parts = []
        for b in as_batches(batch):
            exact = np.empty(len(b), np.int64)
            prefix = np.empty(len(b), np.int64)
            self._read_released(
                lambda: ids_kernels.ids_batch(*s.exists_args, s.root, b.flat, b.offsets, exact, prefix)
            )
            parts.append((exact, prefix))
        if len(parts) == 1:
            return parts[0]
        return (np.concatenate([p[0] for p in parts]) if parts else np.empty(0, np.int64),
                np.concatenate([p[1] for p in parts]) if parts else np.empty(0, np.int64))

    def sequence(self, sequence_id: int) -> np.ndarray:
        """The tokens of the stored sequence with id ``sequence_id`` (see
        ``ids``); ``KeyError`` when no stored sequence has it."""
        v = operator.index(sequence_id)
        if not -1 <= v < 1 << 31:  # node ids are int32
            raise KeyError(f"no stored sequence has id {sequence_id}")
        t = self._s.tree  # one publish's arrays: the kernel reads them holding the GIL
        found, out = ids_kernels.sequence_of(t.tokens, t.start, t.length, t.parent, t.term,
                                    int(t.meta[M_NODE_END]), v)
        if not found:
            raise KeyError(f"no stored sequence has id {sequence_id}")
        return out

    # ------------------------------------------------------------ iteration
    def to_csr(self) -> Tuple[np.ndarray, np.ndarray]:
        """All stored sequences as ``(flat, offsets)``: sequence ``i`` is
        ``flat[offsets[i]:offsets[i+1]]``, in lexicographic order."""
        s = self._s
        with self._lock:
            t = s.tree
            flat, offsets = walks_kernels.collect_sequences(
                t.tokens, t.start, t.length, t.parent, t.term, s.root, s.node_end
            )
        return flat.astype(np.int64, copy=False), offsets

    def __iter__(self) -> Iterator[np.ndarray]:
        flat, offsets = self.to_csr()
        for i in range(offsets.shape[0] - 1):
            yield flat[offsets[i]:offsets[i + 1]]

    def check_invariants(self, full: bool = True) -> None:
        """Raise ``AssertionError`` naming the first broken invariant.

        ``full=False`` runs only the O(1) counter checks.
        """
        with self._lock:
            check_tree(self._s, full=full, canonical=True)

    def __repr__(self) -> str:
        return (f"RadixCache(sequences={len(self)}, nodes={self.num_nodes}, "
                f"tokens={self.num_tokens}, dtype={self.dtype.name})")


def _short(q, limit=8):
    head = ", ".join(str(int(x)) for x in q[:limit])
    return f"[{head}{', ...' if q.shape[0] > limit else ''}] (length {q.shape[0]})"
