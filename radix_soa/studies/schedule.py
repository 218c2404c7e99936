"""Cache-aware scheduling policies: the order a server runs waiting requests.

- ``"fcfs"``: arrival order.
- ``"lpm"``: longest prefix match first: of the waiting requests, the one
  whose prefix the cache holds longest runs next (SGLang's LPM); re-decided
  after every request, since each changes the cache.
- ``"dfs"``: depth-first order: waiting requests sorted so that those sharing
  a prefix run back to back (the depth-first order of a trie over them), so a
  shared prefix is computed once and reused while it is hot. Successive
  windows alternate direction, so each starts with the prefix used last
  (running every window in the same order would start each with the prefix
  LRU evicts first).

``radix_soa.replay(..., schedule=...)`` runs these inside its compiled loop;
the functions here give the same orders for a queue a caller holds.

>>> import radix_soa as rs
>>> queue = rs.pack([[5, 1], [1, 2, 3], [5, 0], [1, 2]])
>>> dfs_order(queue).tolist()
[3, 1, 2, 0]
>>> pc = rs.PrefixCache(values=False); _ = pc.insert([5, 0, 9])
>>> lpm_order(pc, queue).tolist()
[2, 0, 1, 3]
"""

import numpy as np

from .._kernels import replay as replay_kernels
from .._input.batch import as_batches, pack

POLICIES = ("fcfs", "lpm", "dfs")


def _one_batch(queue):
    batches = as_batches(queue)
    return batches[0] if len(batches) == 1 else pack([s for b in batches for s in b])


def fcfs_order(queue):
    """Arrival order: ``0, 1, ..., n-1``."""
    return np.arange(len(_one_batch(queue)), dtype=np.int64)


def dfs_order(queue, window=None, namespaces=None):
    """Indices of ``queue`` in depth-first (lexicographic) order, within
    consecutive windows of ``window`` requests (default: the whole queue),
    every other window reversed. Requests of different ``namespaces`` never
    interleave within a window."""
    b = _one_batch(queue)
    n = len(b)
    flat = b.flat.astype(np.int64, copy=False)
    ns = np.zeros(n, np.int64) if namespaces is None else np.asarray(namespaces, np.int64)
    if ns.shape != (n,):
        raise ValueError(f"namespaces must hold one int per request ({n})")
    order = np.empty(n, np.int64)
    replay_kernels.dfs_order(flat, b.offsets, ns, max(1, int(window or n)), order)
    return order


def lpm_order(cache, queue, namespace=0):
    """Indices of ``queue`` by the longest prefix ``cache`` (a
    ``PrefixCache``) holds now, longest first, arrival order on ties. Read
    only: the cache is not touched."""
    b = _one_batch(queue)
    lengths = cache.match_length_batch(b, namespace=namespace)
    return np.lexsort((np.arange(len(b)), -lengths)).astype(np.int64)
