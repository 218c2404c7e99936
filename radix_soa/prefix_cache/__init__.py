"""``PrefixCache``: RadixAttention semantics on the struct-of-arrays tree.

The same arrays and kernels as ``RadixCache`` (``track=True`` adds lock
counts, eviction keys and a heap of evictable leaves), with the semantics of
SGLang's radix cache: per-token values (KV slot ids), locks that protect
in-flight paths, eviction of leaf tails under a capacity (LRU or another
policy), pages and namespaces.

One class, one room per feature: ``core`` (the class: constructor, sizes,
and the table of contents binding the methods), ``lookup`` (match, peek,
match_length and their batches), ``mutation`` (insert, evict,
drop_namespace, reset), ``handles`` (namespaces' roots, node handles,
lock/unlock, touch), ``requests`` (``Request``), ``lifecycle``
(begin/checkpoint/finish/abort), ``request_batch`` (``RequestBatch`` and
the batch results), ``batch_lifecycle`` (``begin_batch`` and the batch
transitions), ``events`` (KV events and the helpers that read the cache's
arrays for them), ``inspection`` (invariants, text) and ``persistence``
(the save/load hooks).
"""

from .._tree.results import CacheFullError, EvictResult, InsertResult, Match
from .core import PrefixCache
from .request_batch import BatchBegin, BatchFinished, RequestBatch
from .requests import Request

__all__ = ["PrefixCache", "CacheFullError", "InsertResult", "Match", "EvictResult", "Request",
           "RequestBatch", "BatchBegin", "BatchFinished"]
