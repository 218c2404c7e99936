"""What every replay study shares: the trace a replay takes (``as_trace``),
the scoring window (``check_warmup``, ``scored_from``), list arguments,
read-only int64 views and per-namespace roots for the replay kernels, and
the loop that runs many replays on threads (``run_replays``). Used by the
single-cache replay (``replay``), the cluster replay (``cluster``) and the
Dask sweeps (``radix_soa.dask``)."""

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Optional, Sequence, TypeVar, Union

import numpy as np

from .._input.batch import as_batches, pack
from .._input.types import BatchLike
from .._input.validate import check_int
from .trace import Trace

__all__ = ["TraceLike", "SweepProgress", "as_trace", "check_warmup", "scored_from", "listed",
           "readonly_int64", "namespace_roots", "run_replays"]

# what the replays take: a Trace, or anything ``radix_soa.pack`` takes
TraceLike = Union[Trace, BatchLike]
# a sweep's progress report: called with the number of replays done
SweepProgress = Optional[Callable[[int], Any]]


def as_trace(trace: TraceLike) -> Trace:
    """A ``Trace`` as is; any batch input as a one-namespace token trace."""
    if isinstance(trace, Trace):
        return trace
    batches = as_batches(trace)
    if len(batches) != 1:
        batches = [pack([s for b in batches for s in b])]
    b = batches[0]
    n = len(b)
    flat = b.flat.astype(np.int64, copy=False)
    return Trace(name="sequences", flat=flat, offsets=b.offsets, timestamps=np.zeros(n),
                 input_tokens=b.lengths.astype(np.int64), output_tokens=np.zeros(n, np.int64),
                 namespace=np.zeros(n, np.int64), block_size=1)


def check_warmup(warmup: float) -> float:
    """``warmup`` as a float in [0, 1), or TypeError/ValueError naming it."""
    if isinstance(warmup, bool) or not isinstance(warmup, (int, float, np.integer, np.floating)):
        raise TypeError(f"warmup must be a number in [0, 1), got {type(warmup).__name__}")
    w = float(warmup)
    if not 0.0 <= w < 1.0:  # NaN fails too
        raise ValueError(f"warmup must be in [0, 1) (the share of requests that only warm "
                         f"the cache), got {warmup!r}")
    return w


def scored_from(n: int, warmup: float) -> int:
    """Index of the first scored request: the first ``floor(warmup * n)``
    arrivals only warm the cache (kvcache-simulator's rule).

    >>> scored_from(23608, 0.5), scored_from(59937, 0.5), scored_from(5, 0.0)
    (11804, 29968, 0)
    """
    return int(math.floor(warmup * n))


def listed(name, values):
    """``values`` as a non-empty list (one value stands for a list of it).

    >>> listed("workers", 8), listed("workers", (1, 2))
    ([8], [1, 2])
    """
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        values = [values]
    out = list(values)
    if not out:
        raise ValueError(f"{name} is empty")
    return out


def readonly_int64(a):
    """A read-only int64 view: the kernel sees one array type whatever the
    input's flags, so one compiled replay serves every input."""
    v = np.ascontiguousarray(a, dtype=np.int64).view()
    v.flags.writeable = False
    return v


def namespace_roots(store, namespace):
    """Root id per request: one root per distinct namespace."""
    uniq, inverse = np.unique(np.asarray(namespace, dtype=np.int64), return_inverse=True)
    ids = np.array([store.root] + [store.new_root(i) for i in range(1, len(uniq))], np.int64)
    return ids[inverse]


_Item = TypeVar("_Item")
_Result = TypeVar("_Result")


def run_replays(one: Callable[[_Item], _Result], items: Sequence[_Item], threads: Optional[int],
                progress: SweepProgress) -> List[_Result]:
    """``[one(item) for item in items]`` on ``threads`` threads (default:
    the CPU count, at most one per item; the replay kernels release the
    GIL), calling ``progress(done)`` after each; results in ``items``'
    order. The sweeps' shared loop."""
    if threads is None:
        threads = min(len(items), os.cpu_count() or 1)
    threads = check_int("threads", threads, minimum=1, maximum=1024)
    done = [0]

    def counted(item):
        r = one(item)
        done[0] += 1
        if progress is not None:
            progress(done[0])
        return r

    if threads <= 1:
        return [counted(item) for item in items]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(counted, items))
