"""Seeded, cached datasets shared by the benchmarks and ``asv_bench/bench.py``."""

import functools
from pathlib import Path

import numpy as np

from radix_soa import workloads

WORKLOADS = ("shared_prefix", "long_shared_prefix")


@functools.lru_cache(maxsize=None)
def sequences(name):
    """The workload's sequences as int64 NumPy arrays."""
    if name == "shared_prefix":
        # 20,000 sequences: 50 system prompts of 800 tokens + tails of 20..400
        return tuple(workloads.shared_prefix(n_sequences=20_000, seed=0))
    if name == "long_shared_prefix":
        # the seed-constraint shape: up to 10^4 tokens, long shared trunks
        return tuple(workloads.long_shared_prefix(n_sequences=2_000, seed=0))
    if name == "multi_turn":
        return tuple(workloads.multi_turn(seed=0))
    raise KeyError(name)


@functools.lru_cache(maxsize=None)
def as_lists(name):
    return tuple(s.tolist() for s in sequences(name))


def inputs(name, kind):
    return sequences(name) if kind == "numpy" else as_lists(name)


@functools.lru_cache(maxsize=None)
def near_misses(name):
    """Queries that follow a stored sequence and then diverge: each stored
    sequence with its last token changed (the match stops one short)."""
    out = []
    for s in sequences(name):
        q = s.copy()
        q[-1] = -1 - q[-1]
        out.append(q)
    return tuple(out)


def build(impl, seqs):
    tree = make(impl)
    for s in seqs:
        tree.insert(s)
    return tree


def make(impl):
    if impl == "radix_soa":
        from radix_soa import RadixCache
        return RadixCache()
    if impl == "radix_soa_int32":
        from radix_soa import RadixCache
        return RadixCache(dtype=np.int32)
    if impl == "reference":
        from radix_soa.baselines.reference import ReferenceRadixTree
        return ReferenceRadixTree()
    raise KeyError(impl)


TRACES = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces"


@functools.lru_cache(maxsize=None)
def mooncake_conversation():
    """The Mooncake FAST'25 conversation trace, read in place, or None."""
    from radix_soa import traces

    path = TRACES / "mooncake-fast25" / "conversation_trace.jsonl"
    return traces.load_mooncake(path) if path.exists() else None


def short_corpus(n, n_prompts=1000, prompt_len=(20, 100), tail_len=(1, 45), vocab=32_000,
                 seed=0):
    """``n`` short sequences as a CSR pair ``(flat, offsets)`` (int64): each
    is one of ``n_prompts`` prompts of ``prompt_len`` tokens (inclusive
    range, drawn per prompt) and a random tail of ``tail_len`` tokens, about
    83 tokens in all. Built in chunks, so 10^7 sequences need no index
    array of their size."""
    rng = np.random.default_rng(seed)
    plens = rng.integers(prompt_len[0], prompt_len[1] + 1, n_prompts)
    poff = np.zeros(n_prompts + 1, np.int64)
    np.cumsum(plens, out=poff[1:])
    prompts = rng.integers(0, vocab, int(poff[-1]))
    which = rng.integers(0, n_prompts, n)
    tails = rng.integers(tail_len[0], tail_len[1] + 1, n)
    lengths = plens[which] + tails
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = rng.integers(0, vocab, int(offsets[-1]))
    chunk = 100_000
    for a in range(0, n, chunk):
        w = which[a:a + chunk]
        k = plens[w]
        dst = np.repeat(offsets[a:a + w.shape[0]] - np.concatenate([[0], np.cumsum(k)[:-1]]), k)
        src = np.repeat(poff[w] - np.concatenate([[0], np.cumsum(k)[:-1]]), k)
        pos = np.arange(int(k.sum()))
        flat[dst + pos] = prompts[src + pos]
    return flat, offsets


def take_csr(flat, offsets, idx):
    """Sequences ``idx`` of a CSR pair, in that order, as a new CSR pair."""
    lengths = offsets[idx + 1] - offsets[idx]
    out_off = np.zeros(idx.shape[0] + 1, np.int64)
    np.cumsum(lengths, out=out_off[1:])
    pos = np.repeat(offsets[idx] - out_off[:-1], lengths) + np.arange(int(out_off[-1]))
    return flat[pos], out_off


def copied_trace(trace, copies):
    """``trace`` run ``copies`` times back to back, each copy's ids offset
    past every id of the copies before it (so the copies share nothing, as
    ``copies`` times the users would), its timestamps after the last one."""
    from radix_soa.studies.traces import Trace

    if copies == 1:
        return trace
    span = int(trace.flat.max()) + 1 if trace.flat.size else 1
    n, m = len(trace), trace.flat.shape[0]
    shift = np.repeat(np.arange(copies, dtype=np.int64) * span, m)
    offsets = (trace.offsets[:-1][None, :] + (np.arange(copies) * m)[:, None]).ravel()
    t_span = float(trace.timestamps[-1] - trace.timestamps[0]) + 1.0 if n else 1.0
    return Trace(name=f"{trace.name} x{copies}", flat=np.tile(trace.flat, copies) + shift,
                 offsets=np.append(offsets, copies * m),
                 timestamps=(trace.timestamps[None, :] + (np.arange(copies) * t_span)[:, None]).ravel(),
                 input_tokens=np.tile(trace.input_tokens, copies),
                 output_tokens=np.tile(trace.output_tokens, copies),
                 namespace=np.tile(trace.namespace, copies), block_size=trace.block_size)
