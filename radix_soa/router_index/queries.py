"""``RouterIndex``'s queries: ``overlap`` (one request, every worker),
``overlap_scores``, ``overlap_report``, ``overlap_batch`` (many requests,
one GIL-free kernel call) and ``blocks_of``. Bound as methods by
``core.RouterIndex``.
"""

import operator
from typing import NamedTuple

import numpy as np

from .._events.block_hash import block_hashes, key64
from .._events.kv_events import extra_hash, namespace_seed
from .._input.batch import as_batches
from .._input.sequence import as_tokens
from .._kernels import router as router_kernels
from .._kernels.router_keys import ZERO, fold
from .workers import worker_id

SEEDS_KEPT = 4096  # namespace seeds remembered per index


class OverlapReport(NamedTuple):
    """``RouterIndex.overlap_report``: the overlap of every registered
    worker (``overlap_scores``) and the workers among them whose pages are
    not known exactly (``RouterIndex.degraded``), read at one instant."""
    scores: dict
    degraded: frozenset
    syncing: frozenset = frozenset()  # not confirmed yet (``RouterIndex.syncing``)


def _page_keys(self, q, namespace):
    """``sha256_cbor``: the 64-bit keys of the whole pages of ``q``."""
    if namespace is None:
        namespace = 0
    if not (isinstance(namespace, str) or type(namespace) is int):
        namespace = operator.index(namespace)  # the _seed check named the type already
    hs = block_hashes(q.tolist(), self._page, None, namespace, self._none_hash)
    return np.array([key64(h) for h in hs], np.uint64)


def _seed(self, namespace):
    try:
        return self._seeds[namespace]
    except (KeyError, TypeError):
        seed = None
    if seed is None:
        if not (namespace is None or isinstance(namespace, str)):
            try:
                operator.index(namespace)
            except TypeError:
                raise TypeError("a namespace must be an int or a str; got "
                                f"{type(namespace).__name__}") from None
        seed = np.uint64(namespace_seed(namespace))
        # remembered for the namespaces seen first (a service's callers can send
        # any number of new ones: the rest are hashed again each time)
        if type(namespace) in (int, str) and len(self._seeds) < SEEDS_KEPT:
            self._seeds[namespace] = seed
    return seed

def _res_size(words):
    """The row ``overlap_at`` fills: 64 columns a word, then its scratch."""
    return 65 * words + 2 * router_kernels.GROUP


def _query_seed(self, namespace, lora_name, extra_keys):
    """The key before a request's first page: its namespace's seed (a
    ``lora_name`` is the str namespace of vLLM's LoRA pages) with the
    request's ``extra_keys`` (vLLM's first-block keys, such as a cache
    salt) folded in."""
    if lora_name is not None:
        if not isinstance(lora_name, str):
            raise TypeError(f"lora_name must be None or a str; got {type(lora_name).__name__}")
        if namespace is not None and namespace != lora_name:
            raise ValueError("give a namespace or a lora_name, not both")
        namespace = lora_name
    seed = self._seed_none if namespace is None else self._seed(namespace)
    if extra_keys is None:
        return seed
    if self._none_hash is not None:
        raise ValueError("extra_keys need pages keyed by their tokens (an index with "
                         "event_hash='fast64'); the engine-hash form takes a namespace only")
    if isinstance(extra_keys, (str, bytes)) or not isinstance(extra_keys, (list, tuple)):
        raise TypeError("extra_keys must be a list of keys (such as [cache_salt]); got "
                        f"{type(extra_keys).__name__}")
    x = extra_hash(list(extra_keys))
    return np.uint64(fold(np.uint64(seed), np.uint64(x)))


def overlap(self, tokens, namespace=None, *, lora_name=None, extra_keys=None):
    """Per worker (``workers`` order), the leading tokens of ``tokens``
    whose whole pages it caches under ``namespace``: an int64 array.
    ``lora_name`` (vLLM's LoRA adapter: the str namespace its pages are
    keyed under) and ``extra_keys`` (what vLLM folds into a request's
    first block beside it, such as its cache salt: ``[salt]``) select the
    pages such a request may reuse.

    Parameters
    ----------
    tokens : sequence of int
        The request's tokens.
    namespace : int, str or None
        The namespace the pages were cached under (None: the default).
    lora_name : str or None
        vLLM's LoRA adapter name: only that adapter's pages match.
    extra_keys : list or None
        What vLLM folds into the request's first block (``[cache_salt]``).

    >>> import radix_soa as rs
    >>> ix = rs.RouterIndex(page_size=2)
    >>> ix.apply("w", [rs.BlockStored([7, 8], None, [1, 2, 3, 4], 2, lora_name="a",
    ...                               extra_keys=[["a", "salt"], ["a"]])])
    >>> [ix.overlap([1, 2, 3, 4], lora_name=n, extra_keys=k).tolist()
    ...  for n, k in [(None, None), ("a", None), ("a", ["salt"])]]
    [[0], [0], [4]]
    """
    q = as_tokens(tokens)
    if lora_name is None and extra_keys is None:
        seed = self._seed_none if namespace is None else self._seed(namespace)
    else:
        seed = self._query_seed(namespace, lora_name, extra_keys)
    hkeys = self._no_keys if self._none_hash is None else self._page_keys(q, namespace)
    with self._lock:  # the kernel holds the GIL: the lock keeps out a half-done apply
        res = np.empty(self._res_size(self._words), np.int64)
        router_kernels.rx_overlap(self._table, self._keys, self._masks, q, self._page, seed, self._live,
                      res, hkeys, self._stamps)
        return res[self._out]

def overlap_scores(self, tokens, namespace=None, *, lora_name=None, extra_keys=None):
    """``overlap`` as a dict from worker id to the leading tokens of
    ``tokens`` it caches (every registered worker, 0 included), as
    Dynamo's ``OverlapScores``.

    Parameters
    ----------
    tokens : sequence of int
        The request's tokens.
    namespace : int, str or None
        The namespace the pages were cached under (None: the default).
    lora_name : str or None
        vLLM's LoRA adapter name: only that adapter's pages match.
    extra_keys : list or None
        What vLLM folds into the request's first block (``[cache_salt]``).

    >>> import radix_soa as rs
    >>> ix = rs.RouterIndex(page_size=2, workers=[("w", 1), ("w", 0)])
    >>> ix.overlap_scores([1, 2])
    {('w', 1): 0, ('w', 0): 0}
    """
    with self._lock:  # one instant: the columns and the order they are read in
        return dict(zip(self._order, self.overlap(tokens, namespace, lora_name=lora_name,
                                                  extra_keys=extra_keys).tolist()))

def overlap_report(self, tokens, namespace=None, *, lora_name=None, extra_keys=None):
    """``overlap_scores``, the degraded workers and the syncing ones
    among them, at one instant: an ``OverlapReport(scores, degraded,
    syncing)``.

    Parameters
    ----------
    tokens : sequence of int
        The request's tokens.
    namespace : int, str or None
        The namespace the pages were cached under (None: the default).
    lora_name : str or None
        vLLM's LoRA adapter name: only that adapter's pages match.
    extra_keys : list or None
        What vLLM folds into the request's first block (``[cache_salt]``).

    >>> import radix_soa as rs
    >>> ix = rs.RouterIndex(page_size=2, workers=[0, 1], strict=False)
    >>> ix.apply(1, [rs.BlockRemoved([5])])
    >>> ix.overlap_report([1, 2])
    OverlapReport(scores={0: 0, 1: 0}, degraded=frozenset({1}), syncing=frozenset())
    """
    with self._lock:
        return OverlapReport(self.overlap_scores(tokens, namespace, lora_name=lora_name,
                                                 extra_keys=extra_keys),
                             frozenset(self._status),
                             frozenset(w for w in self._syncing if w not in self._status))

def overlap_batch(self, batch, namespace=None, *, lora_name=None, extra_keys=None):
    """``overlap`` of every sequence of ``batch`` (anything ``rs.pack``
    takes), each under the same ``namespace``, ``lora_name`` and
    ``extra_keys``: an int64 array of requests x workers, scored in one
    kernel call without the GIL (the waiting queue in one pass).

    Parameters
    ----------
    batch : anything ``rs.pack`` takes
        The requests' tokens (a waiting queue).
    namespace : int, str or None
        The namespace the pages were cached under (None: the default).
    lora_name : str or None
        vLLM's LoRA adapter name: only that adapter's pages match.
    extra_keys : list or None
        What vLLM folds into the request's first block (``[cache_salt]``).
    """
    seed = self._query_seed(namespace, lora_name, extra_keys)
    batches = list(as_batches(batch))
    if self._none_hash is not None:  # hashed here, row by row, then read at one instant
        rows = [b.flat[b.offsets[i]:b.offsets[i + 1]] for b in batches
                for i in range(len(b))]
        keys = [self._page_keys(q, namespace) for q in rows]
        with self._lock:
            res = np.empty((len(rows), self._res_size(self._words)), np.int64)
            for i, q in enumerate(rows):
                router_kernels.rx_overlap(self._table, self._keys, self._masks, q, self._page, seed,
                              self._live, res[i], keys[i], self._stamps)
            return res[:, self._out]

    def run():  # registered: no writer changes the arrays until it returns
        words, out = self._words, self._out
        parts = []
        for b in batches:
            res = np.empty((len(b), self._res_size(words)), np.int64)
            router_kernels.rx_overlap_batch(self._table, self._keys, self._masks, b.flat, b.offsets,
                                self._page, seed, self._live, res, self._no_keys,
                                self._stamps)
            parts.append(res[:, out])
        if not parts:
            return np.zeros((0, len(self._cols)), np.int64)
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    return self._read_released(run)

def blocks_of(self, worker):
    """The block hashes ``worker`` holds, sorted (for audits and tests):
    as the worker named them (its engine's hashes, the low 64 bits of
    bytes ones) for pages keyed by their tokens."""
    worker = worker_id(worker)
    with self._lock:
        col = self._cols.get(worker)
        if col is None:
            raise KeyError(f"worker {worker!r} is not in the index")
        w, bit = self._bit(col)
        end = int(self._meta[router_kernels.X_END])
        held = (self._flags[:end] >= 0) & ((self._masks[:end, w] & bit) != 0)
        keys = self._keys[:end][held].tolist()
        own = self._ehash[:end][held].tolist() if self._ehash.shape[0] else keys
        hk, hv, _ = self._hmaps[col]
        used = hk != 0
        engine = {v: (0 if k == int(ZERO) else k)
                  for k, v in zip(hk[used].tolist(), hv[used].tolist())}
        return sorted(engine.get(k, d) for k, d in zip(keys, own))
