"""Running a batch call over the batches of its input: one result per
sequence, the per-batch choice of Numba's threads, progress reports."""

import numpy as np

# Below this many query tokens a batch runs serially: starting Numba's
# thread pool costs more than the work (measured in asv_bench/bench.py batch).
PARALLEL_MIN_TOKENS = 1 << 18


def use_parallel(parallel, batches):
    """Resolve a ``parallel=`` argument for a call that runs one kernel per
    batch: True/False as given; None (the default) picks threads only when
    Numba has more than one thread (``NUMBA_NUM_THREADS``) and *every*
    batch is large enough to gain from them, since each batch starts the
    pool again (1,000 small chunks of an Arrow column would pay it 1,000
    times). ``run_batches`` decides batch by batch instead.

    >>> from radix_soa import pack
    >>> small = pack([[0, 0, 0, 0]])
    >>> large = pack([[0] * PARALLEL_MIN_TOKENS])
    >>> use_parallel(None, [small]), use_parallel(True, [small]), use_parallel(False, [large])
    (False, True, False)
    """
    if parallel is not None:
        return bool(parallel)
    return bool(batches) and _threads() > 1 and all(
        b.num_tokens >= PARALLEL_MIN_TOKENS for b in batches)


def _threads():
    import numba

    return numba.get_num_threads()


def map_batches(batches, dtype, fill, progress=False):
    """One result per sequence over several batches: ``fill(batch, out)``
    writes batch's results into ``out`` (zeros of ``dtype``); the parts are
    concatenated (one batch: its array as is). ``progress``: see
    ``progress_reporter`` (the batches are then cut into slices of about
    ``PROGRESS_STEP`` tokens, one report after each)."""
    report = progress_reporter(progress, sum(b.num_tokens for b in batches))
    parts = []
    for b in batches:
        out = np.zeros(len(b), dtype)
        if report is None:
            fill(b, out)
        else:
            for lo, hi in _slices(b):
                fill(b[lo:hi], out[lo:hi])
                report(b.offsets[hi] - b.offsets[lo])
        parts.append(out)
    if report is not None:
        report(None)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def run_batches(batches, dtype, parallel, serial, threaded, progress=False):
    """``map_batches`` for a read with a serial and a threaded kernel:
    ``threaded(batch, out)`` runs for the batches ``use_parallel(parallel,
    [batch])`` picks threads for, ``serial(batch, out)`` for the others, so
    the default never starts the thread pool for a small chunk."""
    if parallel is None and len(batches) > 1 and _threads() > 1:
        return map_batches(batches, dtype, lambda b, out: (
            threaded if b.num_tokens >= PARALLEL_MIN_TOKENS else serial)(b, out), progress)
    return map_batches(batches, dtype, threaded if use_parallel(parallel, batches) else serial,
                       progress)


PROGRESS_STEP = 1 << 22  # tokens between two progress reports


def progress_reporter(progress, total):
    """What a batch call's ``progress=`` asks for, as ``report(tokens)``
    (called with the tokens each slice covered, then once with None), or
    None: ``False``/None for nothing, ``True`` for a ``tqdm`` bar on stderr
    (the ``progress`` extra), or a callable ``progress(done, total)`` (in
    tokens) called after each slice.

    >>> seen = []
    >>> report = progress_reporter(lambda done, total: seen.append((done, total)), 10)
    >>> report(4); report(6); report(None); seen
    [(4, 10), (10, 10)]
    """
    if progress is None or progress is False:
        return None
    if progress is True:
        try:
            from tqdm import tqdm
        except ImportError:
            raise ImportError("progress=True needs tqdm: pip install 'radix-soa[progress]' "
                              "(or pass a callable progress(done, total))") from None
        bar = tqdm(total=int(total), unit="tok", unit_scale=True, leave=False)

        def report(tokens):
            if tokens is None:
                bar.close()
            else:
                bar.update(int(tokens))
        return report
    if not callable(progress):
        raise TypeError(f"progress must be True, False or a callable progress(done, total); "
                        f"got {type(progress).__name__}")
    done = [0]

    def call(tokens):
        if tokens is not None:
            done[0] += int(tokens)
            progress(done[0], int(total))
    return call


def _slices(b):
    """``(lo, hi)`` sequence ranges of ``b`` of about ``PROGRESS_STEP``
    tokens each (at least one sequence)."""
    n = len(b)
    if n == 0:
        return [(0, 0)]
    cuts = np.searchsorted(b.offsets, b.offsets[0] + np.arange(1, b.num_tokens // PROGRESS_STEP + 1)
                           * PROGRESS_STEP)
    bounds = np.unique(np.concatenate([[0], np.clip(cuts, 1, n), [n]]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
