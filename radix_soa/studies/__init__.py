"""Studies on top of the caches: workload generators and trace loaders, the
compiled trace replay and capacity sweeps, scheduling policies, footprint
comparisons and the capacity study the command line prints.

Modules: ``sources`` (files, gzip/zstd, stdin), ``traces``, ``workloads``,
``replay`` (``replay``, ``sweep``), ``cluster`` (``replay_cluster``, ``sweep_cluster``: N
workers behind a router), ``report`` (the sweep table, its legend,
CSV, capacity units), ``schedule``, ``footprint``, ``study``. They import the product, never the
other way round.
"""
