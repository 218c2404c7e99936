"""radix_soa: a radix-tree prefix cache over integer token sequences,
stored as NumPy struct-of-arrays and driven by Numba kernels.

>>> import radix_soa as rs
>>> rc = rs.RadixCache()
>>> rc.insert([1, 2, 3]); rc.exists([1, 2, 3])
True
True

The product (``RadixCache``, ``PrefixCache``, batches, persistence) is at the
top level; ``radix_soa.studies`` holds the workloads, traces, replay and
footprint studies (``rs.traces``, ``rs.workloads``, ``rs.replay``,
``rs.sweep``, ``rs.replay_cluster``, ``rs.sweep_cluster`` are kept here too), ``radix_soa.baselines`` the pure-Python and
array baselines.
"""

from ._results import (BatchMatch, CacheFullError, EvictResult, Finished, InsertResult,
                       InvariantError, Match, ReadOnlyTreeError, TreeFormatError)
from ._serving import Request
from .batch import Batch, csr, pack
from ._dedup import first_occurrence
from .radix_cache import RadixCache
from .prefix_cache import PrefixCache
from ._kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventError, event_from_dict
from .router_index import RouterIndex
from .studies import schedule, traces, workloads
from .studies.replay import ReplayResult, SweepResult, replay, sweep
from .studies.cluster import ClusterResult, ClusterSweep, replay_cluster, sweep_cluster
from .studies.footprint import FootprintTable, compare_footprint
from .baselines.replay_reference import replay_reference
from .baselines.cluster_reference import cluster_reference
from ._warmup import warmup

__all__ = ["RadixCache", "PrefixCache", "Batch", "csr", "pack", "CacheFullError", "InsertResult",
           "Match", "BatchMatch", "EvictResult", "Finished", "Request", "InvariantError", "warmup",
           "replay", "sweep", "ReplayResult", "SweepResult", "replay_reference",
           "replay_cluster", "sweep_cluster", "ClusterResult", "ClusterSweep", "cluster_reference",
           "compare_footprint", "FootprintTable", "ReadOnlyTreeError", "TreeFormatError",
           "schedule", "traces", "workloads", "first_occurrence", "RouterIndex", "BlockStored",
           "BlockRemoved", "AllBlocksCleared", "EventError", "event_from_dict"]
__version__ = "0.2.0.dev0"
