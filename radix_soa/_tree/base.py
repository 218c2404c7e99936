"""What ``RadixCache`` and ``PrefixCache`` share: the lock, memory reports,
compaction, persistence and pickling of their ``TreeStorage``.

Threads: every method that changes a cache, or reads it in more than one
step (``save``, pickling, ``memory_report``, iteration, ``check_invariants``),
holds the cache's lock (one ``RLock`` per cache) across room-making, kernel
and bookkeeping. Single reads (``exists``, ``match_prefix``,
``match_length``) take no lock: their kernels hold the GIL while they run,
and a read that saw the arrays replaced by a growth in the middle of it runs
again under the lock. Serial batch reads (``exists_batch``,
``match_prefix_batch``, ``match_length_batch``) release the GIL, so batch
reads from several threads run on several cores at once: each registers as
a reader, and a writer, once it holds the lock, waits until no reader runs
(new readers wait while a writer waits, so writers are not starved). So any
mix of calls from any threads is safe, and a read sees the cache as it was
at some instant during the call.
"""

import os
import threading
from typing import Any, Dict, Optional, Tuple, Type, TypeVar, Union

from . import persist
from .results import ReadOnlyTreeError, TreeFormatError


C = TypeVar("C", bound="TreeCache")


class _Writing:
    """``with self._writing:``: hold the lock as a writer, after any
    GIL-free reader is done (``ReadersWriter``). The opening every writer
    needs, written once. The per-call hot paths (insert, match, lock,
    unlock, the lifecycle transitions, evict) open it inline instead, as
    ``with self._lock:`` then ``if self._readers: self._drain_readers()``:
    a Python ``__enter__``/``__exit__`` costs 0.1-0.4 us a call, a tenth
    of a per-call operation (tests/test_layers.py checks both forms)."""

    __slots__ = ("_owner",)

    def __init__(self, owner):
        self._owner = owner

    def __enter__(self):
        owner = self._owner
        owner._lock.acquire()
        try:
            if owner._readers:
                owner._drain_readers()
        except BaseException:
            owner._lock.release()
            raise

    def __exit__(self, *exc):
        self._owner._lock.release()


class ReadersWriter:
    """The lock of an index others read without the GIL: one ``RLock`` that
    writers hold, GIL-free readers registered beside it (``_read_released``)
    and waited for by a writer (``_drain_readers``; ``_writing`` opens a
    writer's block). ``TreeCache`` and ``RouterIndex`` use it."""

    def _init_lock(self):
        self._lock = threading.RLock()
        self._no_readers = threading.Condition(self._lock)
        self._readers = 0          # batch reads running without the GIL
        self._writers_waiting = 0
        self._writing = _Writing(self)

    def _drain_readers(self):
        """Called by a writer holding the lock (``if self._readers:`` first):
        wait until no GIL-free batch read runs. ``wait`` releases the lock, so
        the readers can deregister; the writer holds it again on return."""
        self._writers_waiting += 1
        try:
            while self._readers:
                self._no_readers.wait()
        finally:
            self._writers_waiting -= 1
            self._no_readers.notify_all()  # readers held back by this writer

    def _read_released(self, call):
        """``call()``: one read-only kernel that releases the GIL, run as a
        registered reader (writers wait for it; it waits for waiting writers)."""
        with self._lock:
            while self._writers_waiting:
                self._no_readers.wait()
            self._readers += 1
        try:
            return call()
        finally:
            with self._lock:
                self._readers -= 1
                if not self._readers:
                    self._no_readers.notify_all()


class TreeCache(ReadersWriter):
    """Base of the cache classes; subclasses set ``self._s`` and implement
    ``_extra_state`` / ``_restore_state`` for what lives outside the arrays."""

    _s: Any = None  # the TreeStorage

    def _read(self, call):
        """``call()`` (one read-only kernel on ``self._s``'s current arrays),
        run again under the lock if a growth replaced the arrays meanwhile."""
        s = self._s
        generation = s.generation
        result = call()
        if s.generation != generation:
            with self._lock:
                result = call()
        return result

    # ------------------------------------------------------------ memory
    def memory_report(self) -> Dict[str, Any]:
        """Bytes the index costs, exact for its arrays.

        Keys: ``total_bytes`` (allocated), ``used_bytes`` (up to high-water
        marks), ``slack_bytes``, ``tokens_inserted`` (every token ever handed
        to insert), ``tokens_stored`` (in live spans), ``dead_tokens``,
        ``nodes``, ``bytes_per_stored_token``, ``bytes_per_node`` (used bytes
        beyond the token and value buffers, per node), ``compression_ratio``
        (inserted / stored), ``arrays`` (per array: dtype, used and allocated
        bytes) and ``counts`` (what is and is not counted).
        """
        with self._lock:
            return self._s.memory_report()

    def compact(self, headroom: float = 0.25) -> None:
        """Reclaim dead token runs (left by removes, merges and evictions) and
        slack: every array shrinks to what is used plus ``headroom`` (a
        fraction; 0 for the leanest tree, e.g. before saving or measuring).
        Contents, values, locks and node handles are unchanged."""
        if not 0 <= headroom <= 4:
            raise ValueError(f"headroom must be a fraction in [0, 4]; got {headroom}")
        self._writable()
        with self._writing:
            self._s.compact(headroom)

    # ------------------------------------------------------------ persistence
    @property
    def read_only(self) -> bool:
        """True for a tree loaded with ``mmap=True``."""
        return self._s.readonly

    def _writable(self):
        if self._s.readonly:
            raise ReadOnlyTreeError(
                f"this {type(self).__name__} is memory-mapped read-only; load it with "
                "mmap=False to change it")

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write the tree to directory ``path`` (``.npy`` files + a JSON
        header), atomically: the directory appears complete or not at all."""
        self._save(path)

    def _save(self, path: Union[str, os.PathLike],
              identity: Optional[Dict[str, Any]] = None) -> None:
        """``save``, with ``identity`` (a JSON object) written into the
        header under its checksum: what a saved part of a larger whole (a
        shard of a ``radix_soa.dask`` save) says it is. ``_load`` returns it;
        ``load`` ignores it."""
        with self._lock:  # writers wait: the saved arrays are one instant's
            persist.save(self, path, identity)

    @classmethod
    def load(cls: Type[C], path: Union[str, os.PathLike], mmap: bool = False) -> C:
        """Read a tree written by ``save``.

        ``mmap=False`` copies it into memory (mutable). ``mmap=True`` maps the
        files read-only: instant on huge trees, answers every read-only call
        and raises ``ReadOnlyTreeError`` on mutation. A truncated, corrupted,
        foreign or other-version directory raises ``TreeFormatError`` (the
        checksums of the two bulk buffers are skipped on a memory-mapped load;
        index ranges are always checked, so corruption cannot crash a kernel).
        """
        return cls._load(path, mmap)[0]

    @classmethod
    def _load(cls: Type[C], path: Union[str, os.PathLike],
              mmap: bool = False) -> Tuple[C, Optional[Dict[str, Any]]]:
        """``(tree, identity)``: ``load``, and the identity ``_save`` wrote
        into the checked header (None if there is none)."""
        path = os.fspath(path)
        try:
            header = persist.read_header(path, cls)
            arrays = persist.load_arrays(path, header, mmap)
            obj = cls.__new__(cls)
            obj._init_lock()
            obj._s = persist.build_storage(path, header, arrays, mmap)
            obj._restore_state(header.get("state") or {})
        except (FileNotFoundError, MemoryError, KeyboardInterrupt):
            raise
        except TreeFormatError as exc:
            message = str(exc)
            raise TreeFormatError(message if message.startswith(path) else f"{path}: {message}") \
                from None
        except Exception as exc:  # whatever else a damaged file provokes
            raise TreeFormatError(f"{path}: not a readable tree ({type(exc).__name__}: {exc})") \
                from None
        return obj, header.get("identity")

    def __getstate__(self):
        with self._lock:
            header, arrays = persist.state_of(self)
            return {"header": header, "arrays": {k: v.copy() for k, v in arrays.items()}}

    def __setstate__(self, state):
        self._init_lock()
        header = state["header"]
        self._s = persist.build_storage("<pickle>", header, state["arrays"], mmap=False)
        self._restore_state(header.get("state") or {})

    def _extra_state(self):
        return {}

    def _restore_state(self, state):
        pass
