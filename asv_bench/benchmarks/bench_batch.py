"""Batch calls over CSR and Arrow input, beside the reference tree's loop
and the physical floor (reading every query token once)."""

import numpy as np

import radix_soa

from .common import build, make, sequences

WORKLOADS = ("shared_prefix", "multi_turn", "long_shared_prefix")


class BatchLookup:
    params = (WORKLOADS, ("serial", "parallel"))
    param_names = ("workload", "threads")
    repeat = (3, 10, 30.0)

    def setup(self, workload, threads):
        seqs = sequences(workload)
        self.batch = radix_soa.pack(seqs)
        self.csr = (self.batch.flat, self.batch.offsets)
        self.rc = radix_soa.RadixCache()
        self.rc.insert_batch(self.batch)
        self.parallel = threads == "parallel"
        self.rc.exists_batch(self.csr, parallel=self.parallel)
        self.rc.match_prefix_batch(self.csr, parallel=self.parallel)

    def time_exists_batch(self, workload, threads):
        self.rc.exists_batch(self.csr, parallel=self.parallel)

    def time_match_prefix_batch(self, workload, threads):
        self.rc.match_prefix_batch(self.csr, parallel=self.parallel)


class Floor:
    """np.array_equal of the flat query buffer with a copy: the cost of
    reading every query token once, the floor exists_batch is held to."""
    params = (WORKLOADS,)
    param_names = ("workload",)

    def setup(self, workload):
        self.flat = radix_soa.pack(sequences(workload)).flat
        self.copy = self.flat.copy()

    def time_array_equal(self, workload):
        np.array_equal(self.flat, self.copy)


class ReferenceLookupLoop:
    params = (WORKLOADS,)
    param_names = ("workload",)
    repeat = (1, 3, 60.0)
    number = 1

    def setup(self, workload):
        self.seqs = sequences(workload)
        self.ref = build("reference", self.seqs)

    def time_exists_loop(self, workload):
        ex = self.ref.exists
        for s in self.seqs:
            ex(s)


class BatchInsert:
    params = (WORKLOADS, ("radix_soa", "reference"))
    param_names = ("workload", "impl")
    number = 1
    repeat = (1, 5, 60.0)
    warmup_time = 0

    def setup(self, workload, impl):
        self.seqs = sequences(workload)
        self.batch = radix_soa.pack(self.seqs)
        radix_soa.warmup()
        self.tree = make(impl)

    def time_insert_into_empty_tree(self, workload, impl):
        if isinstance(self.tree, radix_soa.RadixCache):
            self.tree.insert_batch(self.batch)
        else:
            for s in self.seqs:
                self.tree.insert(s)


class ArrowInput:
    params = (("csr", "arrow_list", "arrow_large_list"),)
    param_names = ("input",)

    def setup(self, kind):
        import pyarrow as pa

        batch = radix_soa.pack(sequences("shared_prefix"))
        self.rc = radix_soa.RadixCache()
        self.rc.insert_batch(batch)
        if kind == "csr":
            self.data = (batch.flat, batch.offsets)
        elif kind == "arrow_list":
            self.data = pa.ListArray.from_arrays(pa.array(batch.offsets.astype(np.int32)),
                                                 pa.array(batch.flat))
        else:
            self.data = pa.LargeListArray.from_arrays(pa.array(batch.offsets), pa.array(batch.flat))
        self.rc.exists_batch(self.data, parallel=False)

    def time_exists_batch(self, kind):
        self.rc.exists_batch(self.data, parallel=False)
