"""NVIDIA Dynamo's router index (``dynamo._core.RadixTree``, from
``pip install --no-deps ai-dynamo-runtime==1.6.1``) fed the same KV events
as ``radix_soa.RouterIndex``, for ``bench.py router_dynamo``.

Dynamo keys a block by the worker's ``block_hash`` (here the event's chained
hash) and walks its tree by ``tokens_hash``, the hash of the block's tokens
alone: ``local_hashes`` computes one per page (a splitmix-style fold of the
page's tokens, vectorized), once, outside every timing. Its events are the
JSON bytes of ``{"event_id", "data": {"stored": {"parent_hash", "blocks":
[{"block_hash", "tokens_hash"}]}}}`` or ``{"removed": {"block_hashes"}}``,
and ``find_matches(local_hashes).scores`` is ``{(worker, dp_rank): blocks}``
(workers with a score of 0 left out).
"""

import json
import os
import subprocess
import sys
import tempfile
import pickle

import numpy as np

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def available():
    """``dynamo._core.RadixTree``, or None with the reason printed."""
    try:
        from dynamo._core import RadixTree
    except ImportError as exc:
        print(f"  (skipped: Dynamo's RadixTree does not import: {exc}; "
              "pip install --no-deps ai-dynamo-runtime==1.6.1)")
        return None
    return RadixTree


def local_hashes(tokens, page):
    """One uint64 per whole page of ``tokens``: its tokens' hash alone."""
    t = np.asarray(tokens, np.int64)
    n = t.shape[0] // page
    if n == 0:
        return []
    p = t[:n * page].reshape(n, page).view(np.uint64)
    with np.errstate(over="ignore"):
        h = np.full(n, 0x9E3779B97F4A7C15, np.uint64)
        for j in range(page):
            h = (h ^ p[:, j]) * np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(31)
    return h.tolist()


def to_dynamo(events, page):
    """``RouterIndex`` events (objects) as Dynamo's event dicts (before
    JSON), numbered from 0."""
    out = []
    for i, e in enumerate(events):
        kind = type(e).__name__
        if kind == "BlockStored":
            locs = local_hashes(e.token_ids, page)
            data = {"stored": {"parent_hash": e.parent_block_hash, "blocks": [
                {"block_hash": h, "tokens_hash": t} for h, t in zip(e.block_hashes, locs)]}}
        elif kind == "BlockRemoved":
            data = {"removed": {"block_hashes": list(e.block_hashes)}}
        else:
            data = "cleared"
        out.append({"event_id": i, "data": data})
    return out


def as_blocks(scores, workers):
    """Dynamo's scores as a list of blocks per worker (0 where absent)."""
    return [scores.get((w, 0), 0) for w in workers]


_RSS_SCRIPT = r"""
import ctypes, gc, json, os, pickle, sys
def rss():  # free heap memory handed back first (glibc), so what is left is live
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
side, path, page = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(path, "rb") as f:
    streams = pickle.load(f)
if side == "dynamo":
    from dynamo._core import RadixTree
    streams = [(w, [json.dumps(d).encode() for d in evs]) for w, evs in streams]
    warm = RadixTree()  # its first calls' setup outside the reading
    for b in streams[0][1][:50]:
        warm.apply_event(0, b)
    warm.find_matches([1, 2])
    gc.collect(); before = rss()
    t = RadixTree()
    for w, evs in streams:
        for b in evs:
            t.apply_event(w, b)
else:
    import radix_soa
    warm = radix_soa.RouterIndex(page_size=page)  # the kernels loaded outside the reading
    warm.apply(0, streams[0][1][:50])
    first = next(e for e in streams[0][1] if isinstance(e, radix_soa.BlockStored))
    warm.apply(1, [first])
    warm.apply(1, [radix_soa.BlockRemoved(first.block_hashes)])  # the removal's kernel too
    warm.overlap([1] * page)
    gc.collect(); before = rss()
    t = radix_soa.RouterIndex(page_size=page)
    for w, evs in streams:
        t.apply(w, evs)
gc.collect()
print(rss() - before)
"""


def rss_growth(side, streams, page):
    """Bytes the process's RSS grows by while ``side`` ("dynamo" or
    "radix_soa") applies ``streams`` ([(worker, events)], the events as
    Dynamo dicts or as objects) in a fresh process: the input is loaded
    (and, for Dynamo, turned into JSON bytes) and a throwaway index fed
    the first 50 events (so first-call setup, such as loading compiled
    kernels, is not counted) before the first reading. Each reading first
    hands free heap memory back to the system (``malloc_trim``), so the
    growth is what both indexes keep live, not the allocator's high water."""
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        pickle.dump(streams, f)
        path = f.name
    try:
        env = dict(os.environ, RUST_LOG="error")
        out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, side, path, str(page)],
                             capture_output=True, text=True, check=True, env=env)
        return int(out.stdout.strip().splitlines()[-1])
    finally:
        os.unlink(path)


def apply_all(tree, streams_json):
    """Dynamo: apply every worker's JSON events (bytes), one call each."""
    for w, evs in streams_json:
        for b in evs:
            tree.apply_event(w, b)


def dumps_all(streams):
    """Dynamo's events as the JSON bytes its ``apply_event`` takes."""
    return [(w, [json.dumps(d).encode() for d in evs]) for w, evs in streams]
