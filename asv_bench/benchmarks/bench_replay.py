"""Trace replay: one compiled call per replay; capacity sweeps; the
pure-Python replay with the same semantics for the ratio."""

import numpy as np

import radix_soa
from radix_soa.baselines.replay_reference import replay_reference

from .common import TRACES, mooncake_conversation, sequences


def _trace():
    tr = mooncake_conversation()
    if tr is None:  # the real traces are not on every machine
        tr = radix_soa.workloads.as_trace(sequences("multi_turn"), "multi_turn")
    return tr


class Replay:
    params = (("fcfs", "lpm", "dfs"), (False, True))
    param_names = ("schedule", "host_tier")
    timeout = 300

    def setup(self, schedule, host):
        radix_soa.warmup()
        self.trace = _trace()
        peak = radix_soa.replay(self.trace).peak_ids
        self.cap = peak // 8
        self.host = peak // 4 if host else None
        radix_soa.replay(self.trace, capacity=self.cap, schedule=schedule, host_capacity=self.host)

    def time_replay(self, schedule, host):
        radix_soa.replay(self.trace, capacity=self.cap, schedule=schedule, host_capacity=self.host)

    def track_hit_rate(self, schedule, host):
        r = radix_soa.replay(self.trace, capacity=self.cap, schedule=schedule,
                             host_capacity=self.host)
        return r.combined_hit_rate


class Sweep:
    params = ((1, 2),)
    param_names = ("threads",)
    timeout = 300

    def setup(self, threads):
        radix_soa.warmup()
        self.trace = _trace()
        peak = radix_soa.replay(self.trace).peak_ids
        self.caps = np.linspace(peak / 40, peak, 20).astype(int).tolist()

    def time_sweep_20_capacities(self, threads):
        radix_soa.sweep(self.trace, self.caps, threads=threads)


class ReferenceReplay:
    timeout = 600
    number = 1
    repeat = (1, 2, 120.0)

    def setup(self):
        self.trace = _trace()
        self.cap = radix_soa.replay(self.trace).peak_ids // 8

    def time_reference_replay_one_capacity(self):
        replay_reference(self.trace, capacity=self.cap)


class LoadTrace:
    """Loading the largest kv-cache-tester file (847,377 ids, 219 requests):
    the strict per-line validation's cost (it took 0.3-1 s on CI VMs)."""

    timeout = 120

    def setup(self):
        self.path = TRACES / "kv-cache-tester-claude-code" / "trace_0178.json"
        if not self.path.exists():  # the real traces are not on every machine
            raise NotImplementedError("no kv-cache-tester traces here")

    def time_load_kvcache_tester_largest_file(self):
        radix_soa.traces.load_kvcache_tester(self.path)
