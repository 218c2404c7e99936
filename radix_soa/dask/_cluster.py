"""Waiting on a cluster whose workers may die: every wait bounded, and no
task tied to a worker once it has been placed.

Why the ties are cut. A task submitted with ``workers=`` keeps that
restriction for good, ``allow_other_workers=True`` or not. If it must be
recomputed (its worker died and took its result along) at a moment when no
worker is running (both of two workers died, or the one left is
restarting), it goes to the scheduler's ``no-worker`` state, and a worker
that joins later is given it only if its address is one of the
restriction's; a nanny restarts a worker at a new address, so the task
waits forever, and so does every gather on it (dask/distributed#7346,
#8600). So a shard is placed with ``workers=`` once and ``place`` drops the
restriction as soon as the scheduler has chosen its worker; every other
task runs where its shard is because that is where its data is. Lost
shards are then recomputed from their lineage on any worker, and a task
whose workers keep dying raises ``distributed.KilledWorker`` after the
scheduler's ``allowed-failures``. ``gather`` bounds the rest: whatever is
not done within the timeout raises ``TimeoutError`` naming the parts still
missing.
"""

import math
import numbers
import time
from typing import Any, List, Sequence

DEFAULT_TIMEOUT = 600.0  # seconds one call may wait for its tasks
_STATUS_TIMEOUT = 10.0   # seconds to ask the scheduler why a call timed out
# a task's states before the scheduler picks a worker (None: not there yet)
_UNDECIDED = (None, "released", "waiting", "queued")


def check_timeout(timeout: Any) -> float:
    """``timeout`` as a float number of seconds (> 0, finite), or
    ``TypeError`` / ``ValueError`` naming it.

    >>> check_timeout(30)
    30.0
    """
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds; got {type(timeout).__name__} "
                        f"{timeout!r}")
    t = float(timeout)
    if not (t > 0 and math.isfinite(t)):
        raise ValueError(f"timeout must be a finite number of seconds > 0; got {timeout!r}")
    return t


def unpin(client, keys) -> None:
    """Drop the worker restrictions of the tasks ``keys``: a recomputation
    of them may run on any worker, a restarted one too."""
    if keys:
        client.sync(client.scheduler.set_restrictions, worker={key: None for key in keys})


def place(client, futures, deadline: float) -> None:
    """Unpin each of ``futures`` (tasks submitted with ``workers=``) as soon
    as the scheduler has decided where it runs (or found no worker for it:
    unpinned, a worker joining later takes it), polling until every one is
    or ``time.monotonic()`` passes ``deadline`` (``gather`` then says
    which)."""
    pinned = {f.key for f in futures}
    pause = 0.01
    while pinned and time.monotonic() < deadline:
        try:
            states = client.sync(client.scheduler.get_task_status, keys=sorted(pinned),
                                 callback_timeout=max(deadline - time.monotonic(), 0.001))
        except TimeoutError:
            return
        decided = [key for key, state in states.items() if state not in _UNDECIDED]
        unpin(client, decided)
        pinned.difference_update(decided)
        if pinned:
            time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(2 * pause, 0.5)


def _why(client, futures):
    """``(state of each future's task, running workers)`` as the scheduler
    says, ``("?", "?")`` where it cannot say (it may be gone itself)."""
    try:
        got = client.sync(client.scheduler.get_task_status, keys=[f.key for f in futures],
                          callback_timeout=_STATUS_TIMEOUT)
        states = [str(got.get(f.key)) for f in futures]
    except Exception:  # the timeout says enough
        states = ["?"] * len(futures)
    try:
        running = str(len(client.sync(client.scheduler.ncores_running,
                                      callback_timeout=_STATUS_TIMEOUT)))
    except Exception:
        running = "?"
    return states, running


def gather(client, futures: Sequence[Any], names: Sequence[str], timeout: float,
           what: str) -> List[Any]:
    """The results of ``futures``, in order, all within ``timeout`` seconds
    (one deadline for the lot). ``names[i]`` names the part ``futures[i]``
    computes (``"shard 3"``) and ``what`` the call (``"exists_batch"``),
    for the errors: a task's own exception (``KilledWorker`` included) is
    raised with a note naming its part; past the deadline, ``TimeoutError``
    names the parts not done and the state of their tasks."""
    deadline = time.monotonic() + timeout
    out = []
    for f, name in zip(futures, names):
        try:
            out.append(f.result(timeout=max(deadline - time.monotonic(), 0.001)))
        except TimeoutError:
            late = [(g, n) for g, n in zip(futures, names) if not g.done()] or [(f, name)]
            states, running = _why(client, [g for g, _ in late])
            parts = ", ".join(f"{n} (task {s})" for (_, n), s in zip(late, states))
            raise TimeoutError(f"{what}: {parts} not done after {timeout:g} s ({running} "
                               "workers running); pass a larger timeout if the cluster is "
                               "only slow") from None
        except Exception as exc:
            exc.add_note(f"radix_soa.dask: raised by {name} during {what}")
            raise
    return out
