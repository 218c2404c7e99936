"""radix_soa: a radix-tree prefix cache over integer token sequences,
stored as NumPy struct-of-arrays and driven by Numba kernels.

>>> import radix_soa as rs
>>> rc = rs.RadixCache()
>>> rc.insert([1, 2, 3]); rc.exists([1, 2, 3])
True
True
"""

from ._invariants import InvariantError
from .batch import Batch, pack
from ._warmup import warmup
from .radix_cache import RadixCache
from .prefix_cache import CacheFullError, EvictResult, InsertResult, Match, PrefixCache
from . import schedule, traces, workloads
from .simulate import ReplayResult, SweepResult, replay, sweep
from .replay_reference import replay_reference
from .footprint import FootprintTable, compare_footprint
from ._persist import ReadOnlyTreeError, TreeFormatError

__all__ = ["RadixCache", "PrefixCache", "Batch", "pack", "CacheFullError", "InsertResult",
           "Match", "EvictResult", "InvariantError", "warmup", "replay", "sweep", "ReplayResult",
           "SweepResult", "replay_reference", "compare_footprint", "FootprintTable",
           "ReadOnlyTreeError", "TreeFormatError", "schedule", "traces", "workloads"]
__version__ = "0.1.0"
