"""What ``RadixCache`` and ``PrefixCache`` share: memory reports,
compaction, persistence and pickling of their ``TreeStorage``."""

import os

from . import _persist
from ._results import ReadOnlyTreeError


class TreeCache:
    """Base of the cache classes; subclasses set ``self._s`` and implement
    ``_extra_state`` / ``_restore_state`` for what lives outside the arrays."""

    _s = None

    # ------------------------------------------------------------ memory
    def memory_report(self):
        """Bytes the index costs, exact for its arrays.

        Keys: ``total_bytes`` (allocated), ``used_bytes`` (up to high-water
        marks), ``slack_bytes``, ``tokens_inserted`` (every token ever handed
        to insert), ``tokens_stored`` (in live spans), ``dead_tokens``,
        ``nodes``, ``bytes_per_stored_token``, ``bytes_per_node`` (used bytes
        beyond the token and value buffers, per node), ``compression_ratio``
        (inserted / stored), ``arrays`` (per array: dtype, used and allocated
        bytes) and ``counts`` (what is and is not counted).
        """
        return self._s.memory_report()

    def compact(self, headroom=0.25):
        """Reclaim dead token runs (left by removes, merges and evictions) and
        slack: every array shrinks to what is used plus ``headroom`` (a
        fraction; 0 for the leanest tree, e.g. before saving or measuring).
        Contents, values, locks and node handles are unchanged."""
        if not 0 <= headroom <= 4:
            raise ValueError(f"headroom must be a fraction in [0, 4]; got {headroom}")
        self._writable()
        self._s.compact(headroom)

    # ------------------------------------------------------------ persistence
    @property
    def read_only(self):
        """True for a tree loaded with ``mmap=True``."""
        return self._s.readonly

    def _writable(self):
        if self._s.readonly:
            raise ReadOnlyTreeError(
                f"this {type(self).__name__} is memory-mapped read-only; load it with "
                "mmap=False to change it")

    def save(self, path):
        """Write the tree to directory ``path`` (``.npy`` files + a JSON
        header), atomically: the directory appears complete or not at all."""
        _persist.save(self, path)

    @classmethod
    def load(cls, path, mmap=False):
        """Read a tree written by ``save``.

        ``mmap=False`` copies it into memory (mutable). ``mmap=True`` maps the
        files read-only: instant on huge trees, answers every read-only call
        and raises ``ReadOnlyTreeError`` on mutation. A truncated, corrupted,
        foreign or other-version directory raises ``TreeFormatError`` (the
        checksums of the two bulk buffers are skipped on a memory-mapped load;
        index ranges are always checked, so corruption cannot crash a kernel).
        """
        path = os.fspath(path)
        header = _persist.read_header(path, cls)
        arrays = _persist.load_arrays(path, header, mmap)
        obj = cls.__new__(cls)
        obj._s = _persist.build_storage(path, header, arrays, mmap)
        obj._restore_state(header.get("state") or {})
        return obj

    def __getstate__(self):
        header, arrays = _persist.state_of(self)
        return {"header": header, "arrays": {k: v.copy() for k, v in arrays.items()}}

    def __setstate__(self, state):
        header = state["header"]
        self._s = _persist.build_storage("<pickle>", header, state["arrays"], mmap=False)
        self._restore_state(header.get("state") or {})

    def _extra_state(self):
        return {}

    def _restore_state(self, state):
        pass
