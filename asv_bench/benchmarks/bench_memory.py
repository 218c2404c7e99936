"""Footprint of the index and loading saved trees."""

import tempfile

import radix_soa

from .common import sequences


class Footprint:
    params = (("shared_prefix", "multi_turn", "long_shared_prefix"), ("int64", "int32"))
    param_names = ("workload", "dtype")

    def setup(self, workload, dtype):
        self.rc = radix_soa.RadixCache(dtype=dtype)
        self.rc.insert_batch(sequences(workload))
        self.rep = self.rc.memory_report()

    def track_used_bytes(self, workload, dtype):
        return self.rep["used_bytes"]

    def track_allocated_bytes(self, workload, dtype):
        return self.rep["total_bytes"]

    def track_allocated_over_used(self, workload, dtype):
        """What a batch build leaves allocated per used byte (slack)."""
        return self.rep["total_bytes"] / self.rep["used_bytes"]

    def track_compression_ratio(self, workload, dtype):
        return self.rep["compression_ratio"]

    track_used_bytes.unit = "bytes"
    track_allocated_bytes.unit = "bytes"


class MmapLoad:
    """A tree of ~10^7 stored tokens, saved once; loading it memory-mapped,
    its first exists_batch, and a full copy load for comparison."""
    timeout = 300
    number = 1
    repeat = (3, 10, 60.0)

    def setup_cache(self):
        radix_soa.warmup()
        seqs = radix_soa.workloads.shared_prefix(n_sequences=25_000, tail_len=(300, 500), seed=3)
        rc = radix_soa.RadixCache()
        rc.insert_batch(seqs)
        path = tempfile.mkdtemp(prefix="radix-soa-asv-") + "/tree"
        rc.save(path)
        return path

    def setup(self, path):
        radix_soa.warmup()
        self.batch = radix_soa.pack(radix_soa.workloads.shared_prefix(
            n_sequences=25_000, tail_len=(300, 500), seed=3))
        self.mm = radix_soa.RadixCache.load(path, mmap=True)

    def time_load_mmap(self, path):
        radix_soa.RadixCache.load(path, mmap=True)

    def time_load_copy(self, path):
        radix_soa.RadixCache.load(path)

    def time_first_exists_batch_after_mmap_load(self, path):
        radix_soa.RadixCache.load(path, mmap=True).exists_batch(self.batch, parallel=False)
