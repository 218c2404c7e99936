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
