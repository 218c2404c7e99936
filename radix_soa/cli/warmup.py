"""``radix-soa warmup``: compile every kernel now (Numba keeps them in its
on-disk cache, so later processes start fast)."""

import time

from .. import _warmup


def warmup(args):
    t0 = time.perf_counter()
    what = {name: text for name, text, _ in _warmup.GROUPS}

    def progress(name, seconds):
        print(f"  {name:<16} {seconds:6.1f} s  {what[name]}", flush=True)

    jobs = getattr(args, "jobs", 1)
    print(f"compiling {len(_warmup.GROUPS)} kernel groups"
          + (f" in up to {jobs} processes" if jobs > 1 else ""), flush=True)
    groups = _warmup.warmup_groups(jobs=jobs, progress=progress)
    print(f"kernels ready in {time.perf_counter() - t0:.1f} s ({groups} groups: the tree, "
          "replays and cluster replays exercised); later runs load them from Numba's cache")
    return 0
