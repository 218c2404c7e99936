"""``RouterIndex``: which worker caches which pages, rebuilt from the
workers' KV events, and how many leading tokens of a request each holds.

What a cache-aware router (SGLang's gateway, NVIDIA Dynamo's KV router)
keeps: one node per page any worker caches, keyed by the page's chained
hash, with the set of workers holding it (a bitmask row, 64 workers a
word; more words as workers join). Built only from events
(``PrefixCache(events=True).take_events()``, or their dicts off the wire):
after a worker's events are applied in order, ``overlap(q)`` gives that
worker exactly its cache's ``match_length(q)``.

The package: ``core`` (the class, a table of contents), ``storage``,
``events``, ``wire`` (``apply_wire``), ``workers``, ``queries`` (its
feature modules) and ``rules``
(the per-decision routing rules the router service and the cluster study
share, and ``ClusterOptions``).
"""

from .core import MIN_BYTES, SEEDS_KEPT, OverlapReport, RouterIndex, worker_id
from .wire import WireApplied

__all__ = ["RouterIndex", "OverlapReport", "WireApplied", "worker_id", "SEEDS_KEPT",
           "MIN_BYTES"]
