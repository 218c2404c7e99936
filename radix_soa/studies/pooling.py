"""N local caches behind a router against one global pool of the same total
capacity, on the same trace: the comparison of the Mooncake paper (FAST'25,
Fig. 10: 10 prefill nodes of 3M tokens each; the global pool's hit rate is
x2.22 the local caches' on the conversation trace, x1.38 on tool&agent,
x2.36 on the synthetic one).

- *local*: ``replay_cluster(trace, workers=nodes, capacity=capacity_per_node,
  router=router)``: each node caches what it served, with its own LRU;
- *global*: ``replay(trace, capacity=nodes * capacity_per_node)``: one
  cache every request can hit (Mooncake's distributed KVCache pool, as one
  LRU over the pooled capacity).

Capacities are in the trace's id units: blocks of ``trace.block_size``
tokens on Mooncake's traces (512), so 3M tokens a node is ``3_000_000 //
512`` = 5,859 blocks (``capacity_per_node=None`` with ``tokens_per_node``
does that division). Hit rates are hit ids over all ids, after
``warmup`` (the share of requests, first in arrival order, not scored).

>>> import radix_soa as rs
>>> tr = rs.workloads.as_trace(rs.workloads.generate("multi_turn", n=200), "multi_turn")
>>> r = compare_pooling(tr, nodes=4, capacity_per_node=2_000, router="round_robin")
>>> r.global_hit_rate >= r.local_hit_rate, r.nodes, r.capacity_per_node
(True, 4, 2000)
>>> round(r.ratio, 6) == round(r.global_hit_rate / r.local_hit_rate, 6)
True
"""

from dataclasses import dataclass
from typing import Any, Dict, Optional

from .._input.validate import check_int
from .cluster import replay_cluster
from .replay import replay
from .trace import Trace

__all__ = ["PoolingResult", "compare_pooling", "MOONCAKE_FIG10"]

#: The global/local hit-rate ratios of the Mooncake paper's Fig. 10 (FAST'25,
#: 10 nodes x 3M tokens), by trace.
MOONCAKE_FIG10 = {"conversation": 2.22, "toolagent": 1.38, "synthetic": 2.36}


@dataclass(frozen=True)
class PoolingResult:
    """``compare_pooling``'s answer: both hit rates, their ratio, and the
    two replays' summaries (``local``: ``ClusterResult.summary()``,
    ``global_``: the single replay's scalars)."""
    trace: str
    nodes: int
    capacity_per_node: int
    router: str
    local_hit_rate: float
    global_hit_rate: float
    local: Dict[str, Any]
    global_: Dict[str, Any]

    @property
    def ratio(self) -> float:
        """Global over local hit rate (inf when the local caches hit nothing
        and the pool does)."""
        if self.local_hit_rate == 0:
            return float("inf") if self.global_hit_rate else 1.0
        return self.global_hit_rate / self.local_hit_rate


def compare_pooling(trace, nodes: int = 10, capacity_per_node: Optional[int] = None, *,
                    tokens_per_node: Optional[int] = None, router: str = "random",
                    warmup: float = 0.0, seed: int = 0, **cluster_options) -> PoolingResult:
    """Hit rate of ``nodes`` local caches of ``capacity_per_node`` ids each
    behind ``router`` (any of ``replay_cluster``'s; ``"random"`` by
    default, seeded: a router blind to the caches, as the paper's local
    setting) against one global cache of ``nodes * capacity_per_node``, on
    the same ``trace`` (a ``Trace`` or anything ``replay`` takes). Give the
    capacity in ids, or ``tokens_per_node`` (divided by the trace's
    ``block_size``, rounded down). ``cluster_options`` go to
    ``replay_cluster`` (its time model, router thresholds).
    """
    nodes = check_int("nodes", nodes, minimum=1)
    if (capacity_per_node is None) == (tokens_per_node is None):
        raise ValueError("give one of capacity_per_node (ids) and tokens_per_node")
    block = trace.block_size if isinstance(trace, Trace) else 1
    if capacity_per_node is None:
        capacity_per_node = check_int("tokens_per_node", tokens_per_node, minimum=1) // block
    capacity_per_node = check_int("capacity_per_node", capacity_per_node, minimum=1)
    local = replay_cluster(trace, workers=nodes, capacity=capacity_per_node, router=router,
                           warmup=warmup, seed=seed, **cluster_options)
    pooled = replay(trace, capacity=nodes * capacity_per_node, warmup=warmup)
    name = trace.name if isinstance(trace, Trace) else "sequences"
    g = {k: v for k, v in pooled.__dict__.items() if not hasattr(v, "shape")}
    g["hit_rate"] = pooled.hit_rate
    return PoolingResult(name, nodes, capacity_per_node, router, local.hit_rate,
                         pooled.hit_rate, local.summary(), g)
