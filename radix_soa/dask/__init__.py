"""A set of sequences sharded over a Dask cluster: ``build`` and ``ShardedCache``.

Optional: ``pip install radix-soa[dask]`` (``dask[distributed]``).

How it stays exact. Every sequence ``s`` of at least ``head`` (k) tokens is
stored whole on shard ``hash(s[:k]) % shards``. A head tree (one
``RadixCache`` on the client) holds ``s[:k]`` of every stored sequence, so
sequences shorter than k are stored whole in it (and on no shard). For a
query ``q``, with ``h`` the head tree's longest match of ``q``:

- if ``h < k``, no stored sequence shares k tokens with ``q``, so the global
  longest match is ``h`` and ``q`` is stored only if it is shorter than k and
  a head-tree sequence (its terminals shorter than k are exactly the short
  stored sequences);
- if ``h == k``, every stored sequence sharing ``q[:k]`` lives on shard
  ``hash(q[:k])``, which answers both questions alone.

So only queries whose first k tokens are a stored head travel, each to one
shard; results come back in input order. Costs: the head tree holds at most
k tokens per distinct head (up to n * k tokens when heads are all distinct,
kept on the client), and shards are skewed when many sequences share their
first k tokens (a common system prompt longer than k puts all of them on one
shard).

Workers may die: a lost shard is recomputed from its lineage on any worker
and the call goes on; a task whose workers keep dying raises
``distributed.KilledWorker``, and no call waits longer than its ``timeout``
(``TimeoutError`` naming the shards). A save's parts carry their identity
under their own checksums, and a load checks them all (``_store``).

Use (with a ``distributed.Client`` running; tests/test_dask.py and the
README run it on a LocalCluster)::

    import radix_soa.dask as rsd
    sc = rsd.build(dask_bag_or_column_or_lists, shards=8, head=16, timeout=600)
    sc.exists_batch(queries), sc.match_prefix_batch(queries), len(sc)
    sc.save("tree_dir/"); sc = rsd.load("tree_dir/", mmap=True)
    rsd.sweep(trace, capacities)         # one replay per task: rs.sweep's table
    rsd.sweep_many({"a": trace_a, "b": trace_b}, capacities, schedules=["fcfs", "lpm"])
"""

try:
    import dask
    import distributed
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError("radix_soa.dask needs dask.distributed: pip install radix-soa[dask] "
                      f"(or pip install 'dask[distributed]'); {exc}") from None
del dask, distributed  # imported only to say how to install them

from ._sharded import ShardedCache, build, load, shard_of
from ._sweep import sweep, sweep_many

__all__ = ["build", "ShardedCache", "shard_of", "load", "sweep", "sweep_many"]
