"""``radix-soa warmup``: compile every kernel now (Numba keeps them in its
on-disk cache, so later processes start fast)."""

import time

from .. import _warmup


def warmup(args):
    t0 = time.perf_counter()
    trees = _warmup.warmup()
    replays = _warmup.warmup_replay()
    clusters = _warmup.warmup_cluster()
    print(f"kernels ready in {time.perf_counter() - t0:.1f} s ({trees} tree dtype, {replays} "
          f"replays, {clusters} cluster replays exercised); later runs load them from "
          "Numba's cache")
    return 0
