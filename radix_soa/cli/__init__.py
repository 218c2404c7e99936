"""The ``radix-soa`` command (also ``python -m radix_soa``).

``radix-soa study`` answers "how much prefill would a prefix cache of this
size save on this traffic, and what does the index cost?": it replays a
built-in seeded workload or a real trace against LRU prefix caches over a
range of capacities and prints the hit-rate table and the index's memory::

    $ radix-soa                                         # = radix-soa study: multi_turn workload
    $ radix-soa study --workload agent --points 6
    $ radix-soa study --trace conversation_trace.jsonl.gz --plot hits.png   # format detected
    $ radix-soa study --trace conv.jsonl --kv-bytes-per-token 160KiB \\
          --capacities 10GB,40GB,80GB                   # what does 40 GB of KV buy me?
    $ radix-soa study --trace conv.jsonl --warmup 0.5   # score like kvcache-simulator
    $ zcat conv.jsonl.gz | radix-soa study --trace - --csv > sweep.csv
    $ radix-soa study --json > study.json
    $ radix-soa study --trace conv.jsonl --workers 4,8 \\
          --router round_robin,cache_aware,kv_overlap    # N workers behind a router

``radix-soa build`` builds a tree from a built-in, seeded shared-prefix
workload and reports what it stored (given only build's own options, such as
``--sequences``, the subcommand may still be left out)::

    $ radix-soa build --sequences 2000

``radix-soa warmup`` compiles every kernel once (Numba caches them on disk);
``radix-soa traces`` lists the public traces the loaders read, and
``radix-soa traces get NAME --to DIR`` downloads one.

Exit status: 0 on success, 2 for bad usage or bad input (one line on stderr
starting with ``radix-soa: error:``), 1 if ``build`` finds a sequence missing.

Modules: ``parser`` (subcommands, entry point), ``args`` (argument types),
``study`` and ``cluster`` (the study, one cache or N workers), ``output``
and ``plots`` (what the study prints and draws), ``progress``, ``build``.
"""

from .parser import build_parser, main
from ..studies.study import default_capacities

__all__ = ["main", "build_parser", "default_capacities"]
