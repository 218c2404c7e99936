"""The pure-Python cluster replay: the same semantics as
``radix_soa.replay_cluster`` (its module docstring defines them), one
``ReferencePrefixCache`` per worker served by ``replay_reference``'s own
request step, and the routers written out plainly. It is the oracle the
tests compare the compiled cluster replay against.

>>> from radix_soa.studies import workloads
>>> seqs = workloads.shared_prefix(n_sequences=60, n_prompts=3, prompt_len=40)
>>> import radix_soa as rs
>>> ref = cluster_reference(seqs, workers=3, capacity=300, router="cache_aware")
>>> ref.assignments.tolist() == rs.replay_cluster(seqs, workers=3, capacity=300,
...                                                router="cache_aware").assignments.tolist()
True
"""

import heapq
import math

import numpy as np

from ..router_index.rules import (ClusterOptions, cache_aware_choice, kv_overlap_choice,
                                  least_loaded_choice, prefix_hash_choice, prefix_key,
                                  ring_points)
from .reference_prefix import ReferencePrefixCache
from .replay_reference import _requests, serve_request

ROUTERS = ("round_robin", "random", "least_loaded", "prefix_hash", "cache_aware", "kv_overlap")


def prefix_hash(seq, namespace, k):
    """Hash of the namespace and the first ``k`` ids, as a signed int."""
    return prefix_key(seq, namespace, k)


def ring(workers, vnodes):
    return ring_points(range(workers), vnodes)


class ReferenceCluster:
    """What ``cluster_reference`` measured: per request ``assignments``,
    ``hits``, ``rejected``, ``first_token``, ``finish``; per worker lists
    ``evicted_ids``, ``peak_ids``, ``final_ids``, ``busy_seconds``."""


def cluster_reference(trace, workers=8, capacity=None, router="cache_aware", page_size=1,
                      eviction_policy="lru", *, options=None, **changes):
    """Replay like ``radix_soa.replay_cluster`` (FCFS, no warmup), with the
    same options: a ``ClusterOptions`` (``options``; ``changes`` names
    fields to change in it, as ``replay_cluster`` takes them); returns a
    ``ReferenceCluster``.

    Parameters
    ----------
    trace : Trace or sequences
        The requests, as ``replay_cluster`` takes them.
    workers : int
        How many workers (each a ``ReferencePrefixCache``).
    capacity : int or None
        Each worker's capacity in ids (None: unbounded).
    router : str
        One of ``ROUTERS``.
    page_size : int
        The workers' page size.
    eviction_policy : str
        The workers' eviction policy.
    options : ClusterOptions or None
        The router and time-model options (None: the defaults).
    **changes
        Fields of ``options`` to change.
    """
    o = ClusterOptions.of(options, **changes)
    seed, slots, prefill_rate, decode_rate = o.seed, o.slots, o.prefill_rate, o.decode_rate
    arrival_rate, load, prefix_pages, vnodes = o.arrival_rate, o.load, o.prefix_pages, o.vnodes
    cache_threshold, max_tree_size = o.cache_threshold, o.max_tree_size
    balance_abs_threshold, balance_rel_threshold = o.balance_abs_threshold, o.balance_rel_threshold
    eviction_interval, overlap_score_weight = o.eviction_interval, o.overlap_score_weight
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)}; got {router!r}")
    flat, offsets, ns, inputs, block = _requests(trace)
    offsets = np.asarray(offsets, dtype=np.int64).tolist()
    flat = np.asarray(flat, dtype=np.int64).tolist()
    ns = np.asarray(ns, dtype=np.int64).tolist()
    inputs = np.asarray(inputs, dtype=np.int64).tolist()
    n = len(offsets) - 1
    outputs = (np.asarray(trace.output_tokens, dtype=np.int64).tolist()
               if hasattr(trace, "output_tokens") else [0] * n)
    if arrival_rate is not None:
        times = [i / arrival_rate for i in range(n)]
    elif hasattr(trace, "timestamps"):
        times = np.asarray(trace.timestamps, dtype=np.float64).tolist()
    else:
        times = [0.0] * n
    seqs = [flat[offsets[i]:offsets[i + 1]] for i in range(n)]
    nw, page, block = workers, page_size, int(block)
    tpb = block * page
    caches = [ReferencePrefixCache(capacity=capacity, page_size=page, values=False,
                                   eviction_policy=eviction_policy) for _ in range(nw)]
    approx = [ReferencePrefixCache(values=False) for _ in range(nw)]
    tree_max = capacity if max_tree_size is None else max_tree_size
    rng = np.random.default_rng(seed).integers(0, nw, n).tolist()
    points = ring(nw, vnodes) if router == "prefix_hash" else []

    inserted, peak = [0] * nw, [0] * nw
    outstanding, out_tokens, active, queued = [0] * nw, [0] * nw, [0] * nw, [0] * nw
    processed, peak_out, busy = [0] * nw, [0] * nw, [0.0] * nw
    free = [[0.0] * slots for _ in range(nw)]
    events = []
    assign, hits, rejected = [0] * n, [0] * n, [False] * n
    first_token, finish = [0.0] * n, [0.0] * n
    clock = -math.inf
    next_evict = 0.0 if eviction_interval is None else eviction_interval

    def blocks(r):
        return (inputs[r] + outputs[r] + tpb - 1) // tpb

    def uncached(r):
        return inputs[r] - min(hits[r] * block, inputs[r])

    for i in range(n):
        clock = max(clock, times[i])
        t = clock
        while events and events[0][0] <= t:
            _, v = heapq.heappop(events)
            r, kind = divmod(v, 2)
            w = assign[r]
            if kind == 0:
                queued[w] -= uncached(r)
            else:
                outstanding[w] -= 1
                out_tokens[w] -= inputs[r] + outputs[r]
                active[w] -= blocks(r)
        q = seqs[i]
        qn = len(q) - len(q) % page
        if router == "round_robin":
            w = i % nw
        elif router == "random":
            w = rng[i]
        elif router == "least_loaded":
            w = least_loaded_choice(out_tokens if load == "tokens" else outstanding)
        elif router == "prefix_hash":
            w = prefix_hash_choice(prefix_hash(q, ns[i], prefix_pages * page), points)
        elif router == "cache_aware":
            if eviction_interval is not None and t >= next_evict:
                if tree_max is not None:
                    for tree in approx:
                        if tree.total_tokens > tree_max:
                            tree.evict(tree.total_tokens - tree_max)
                if eviction_interval == 0:
                    next_evict = t
                while next_evict <= t and eviction_interval > 0:
                    next_evict += eviction_interval
            lengths = [tree.match_length(q, namespace=ns[i]) for tree in approx]
            w, _ = cache_aware_choice(lengths, outstanding, processed, len(q), cache_threshold,
                                      balance_abs_threshold, balance_rel_threshold)
            approx[w].match(q, namespace=ns[i])
            approx[w].insert(q, namespace=ns[i])
        else:  # kv_overlap
            overlaps = [caches[u].match_length(q[:qn], namespace=ns[i]) * block for u in range(nw)]
            w = kv_overlap_choice(overlaps, queued, active, inputs[i], tpb, blocks(i),
                                  overlap_score_weight, rng[i])
        assign[i] = w
        hits[i], res = serve_request(caches[w], q, ns[i])
        if res is None:
            rejected[i] = True
        else:
            inserted[w] += qn - res.cached
            peak[w] = max(peak[w], caches[w].total_tokens)
        s = min(range(slots), key=lambda s: (free[w][s], s))
        begin = max(t, free[w][s])
        unc = uncached(i)
        ready = begin + unc / prefill_rate
        done = ready + outputs[i] / decode_rate
        free[w][s] = done
        busy[w] += done - begin
        first_token[i], finish[i] = ready, done
        heapq.heappush(events, (ready, 2 * i))
        heapq.heappush(events, (done, 2 * i + 1))
        queued[w] += unc
        outstanding[w] += 1
        out_tokens[w] += inputs[i] + outputs[i]
        active[w] += blocks(i)
        processed[w] += 1
        peak_out[w] = max(peak_out[w], outstanding[w])

    out = ReferenceCluster()
    out.assignments = np.array(assign, np.int64)
    out.hits = np.array(hits, np.int64)
    out.rejected = np.array(rejected, bool)
    out.first_token = np.array(first_token)
    out.finish = np.array(finish)
    out.final_ids = [c.total_tokens for c in caches]
    out.evicted_ids = [inserted[w] - caches[w].total_tokens for w in range(nw)]
    out.peak_ids = peak
    out.peak_outstanding = peak_out
    out.busy_seconds = busy
    return out
