"""radix_soa: a radix-tree prefix cache over integer token sequences,
stored as NumPy struct-of-arrays and driven by Numba kernels.

>>> import radix_soa as rs
>>> rc = rs.RadixCache()
>>> rc.insert([1, 2, 3]); rc.exists([1, 2, 3])
True
True

The product (``RadixCache``, ``PrefixCache``, ``RouterIndex``, batches, KV
events, persistence) is loaded by ``import radix_soa``. The studies
(``rs.traces``, ``rs.workloads``, ``rs.schedule``, ``rs.replay``,
``rs.sweep``, ``rs.replay_cluster``, ``rs.compare_pooling``, ``rs.compare_footprint`` ...) and the
baselines (``rs.replay_reference``, ``rs.cluster_reference``) load on first
use of their name: ``radix_soa.studies`` and ``radix_soa.baselines`` are the
packages behind them. ``docs/design.md`` lists the layers.
"""

import importlib
from typing import TYPE_CHECKING

from ._tree.results import (BatchMatch, CacheFullError, EvictResult, Finished, InsertResult,
                            InvariantError, Match, ReadOnlyTreeError, TreeFormatError)
from ._input.batch import Batch, csr, pack
from ._input.dedup import first_occurrence
from ._events.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored, EventError,
                                event_from_dict)
from .radix_cache import RadixCache
from .prefix_cache import BatchBegin, BatchFinished, PrefixCache, Request, RequestBatch
from .router_index import RouterIndex

__version__ = "0.2.0.dev0"

if TYPE_CHECKING:  # what the lazy names below are, for type checkers
    from ._warmup import warmup
    from .baselines.cluster_reference import cluster_reference
    from .baselines.replay_reference import replay_reference
    from .studies import schedule, traces, workloads
    from .studies.cluster import (ClusterOptions, ClusterResult, ClusterSweep, replay_cluster,
                                  sweep_cluster)
    from .studies.footprint import FootprintTable, compare_footprint
    from .studies.pooling import PoolingResult, compare_pooling
    from .studies.replay import ReplayResult, SweepResult, replay, sweep

# name -> (module, attribute; None: the module itself), imported on first use
_LAZY = {
    "traces": ("radix_soa.studies.traces", None),
    "workloads": ("radix_soa.studies.workloads", None),
    "schedule": ("radix_soa.studies.schedule", None),
    "replay": ("radix_soa.studies.replay", "replay"),
    "sweep": ("radix_soa.studies.replay", "sweep"),
    "ReplayResult": ("radix_soa.studies.replay", "ReplayResult"),
    "SweepResult": ("radix_soa.studies.replay", "SweepResult"),
    "replay_cluster": ("radix_soa.studies.cluster", "replay_cluster"),
    "ClusterOptions": ("radix_soa.studies.cluster", "ClusterOptions"),
    "sweep_cluster": ("radix_soa.studies.cluster", "sweep_cluster"),
    "ClusterResult": ("radix_soa.studies.cluster", "ClusterResult"),
    "ClusterSweep": ("radix_soa.studies.cluster", "ClusterSweep"),
    "compare_pooling": ("radix_soa.studies.pooling", "compare_pooling"),
    "PoolingResult": ("radix_soa.studies.pooling", "PoolingResult"),
    "compare_footprint": ("radix_soa.studies.footprint", "compare_footprint"),
    "FootprintTable": ("radix_soa.studies.footprint", "FootprintTable"),
    "replay_reference": ("radix_soa.baselines.replay_reference", "replay_reference"),
    "cluster_reference": ("radix_soa.baselines.cluster_reference", "cluster_reference"),
    "warmup": ("radix_soa._warmup", "warmup"),
}

__all__ = ["RadixCache", "PrefixCache", "RouterIndex", "Batch", "csr", "pack", "CacheFullError",
           "InsertResult", "Match", "BatchMatch", "EvictResult", "Finished", "Request",
           "RequestBatch", "BatchBegin", "BatchFinished",
           "InvariantError", "ReadOnlyTreeError", "TreeFormatError", "first_occurrence",
           "BlockStored", "BlockRemoved", "AllBlocksCleared", "EventError", "event_from_dict",
           *_LAZY]


def __getattr__(name):
    """The studies' and baselines' names, imported on first use (PEP 562)."""
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'radix_soa' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
