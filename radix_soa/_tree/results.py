"""The public result types and exceptions of the caches.

They live here, not in a baseline, so that their ``__module__`` and pickles
name the product; the pure-Python baselines return the same types.

>>> m = Match(3, 0, None)
>>> m.length, type(m).__module__
(3, 'radix_soa._tree.results')
"""

from typing import Any, NamedTuple, Optional

import numpy as np

__all__ = ["Match", "BatchMatch", "InsertResult", "EvictResult", "Finished", "CacheFullError", "InvariantError",
           "ReadOnlyTreeError", "TreeFormatError", "STATS"]

class EvictResult(NamedTuple):
    """Result of ``evict``: ``num_tokens`` freed and their ``values`` in
    eviction order (int64 array, or ``None`` for a cache without values)."""

    num_tokens: int
    values: Optional[np.ndarray]


class InsertResult(NamedTuple):
    """Result of ``insert``: ``cached`` page-aligned tokens were already
    present; ``node`` is the handle of the node the inserted sequence ends at;
    ``evicted`` is the ``EvictResult`` of what making room under the capacity
    freed (the caller frees those KV slots)."""

    cached: int
    node: int
    evicted: Optional[EvictResult] = None


class Match(NamedTuple):
    """Result of ``match``: the page-aligned ``length`` of the longest cached
    prefix, the ``node`` ending exactly there (the namespace root when 0), and
    the prefix's ``values`` (int64 array, or ``None`` for a cache without values)."""

    length: int
    node: int
    values: Optional[np.ndarray]


class BatchMatch(NamedTuple):
    """Result of ``PrefixCache.match_batch(..., with_values=True)``: per
    request the match ``lengths`` (int64) and the ``nodes`` (handles, uint64:
    they take 64 bits) as ``match`` returns them, and the matched ``values`` as
    a ``Batch`` (row i: request i's ``length`` values; ``None`` for a cache
    without values)."""

    lengths: np.ndarray
    nodes: np.ndarray
    values: Any  # a radix_soa._input.batch.Batch (a higher layer) or None


class Finished(NamedTuple):
    """Result of ``PrefixCache.finish``: ``cached`` leading tokens were in the
    cache already, ``node`` is where the request now ends in the tree, ``free``
    the request's slots the caller must free (duplicates of tokens cached first
    by another request, and the partial last page), ``evicted`` the
    ``EvictResult`` of making room (free those slots too)."""

    cached: int
    node: int
    free: Optional[np.ndarray]
    evicted: EvictResult


# shared empty results: a read-only empty array can be handed to every caller
NO_VALUES_MATCHED = np.empty(0, np.int64)
NO_VALUES_MATCHED.flags.writeable = False
NOTHING_EVICTED = {False: EvictResult(0, None), True: EvictResult(0, NO_VALUES_MATCHED)}

# the counters of PrefixCache.stats (and of the reference cache), in order
STATS = ("lookups", "query_tokens", "hit_tokens", "inserted_tokens", "evicted_tokens")


class CacheFullError(RuntimeError):
    """An insert would exceed the capacity even after evicting everything
    evictable outside the path it extends; the cache is left unchanged."""


class InvariantError(AssertionError):
    """A structural invariant of the tree does not hold."""


class TreeFormatError(ValueError):
    """A saved tree is truncated, corrupted, foreign or of another version."""


class ReadOnlyTreeError(RuntimeError):
    """A memory-mapped tree was asked to change."""
