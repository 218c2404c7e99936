"""One-sequence-at-a-time calls of RadixCache beside the pure-Python
reference tree, on the shared-prefix and seed-constraint workloads."""


from .common import WORKLOADS, build, inputs, make, near_misses, sequences

IMPLS = ("radix_soa", "reference")
KINDS = ("numpy", "list")


class Insert:
    params = (WORKLOADS, IMPLS, KINDS)
    param_names = ("workload", "impl", "input")
    number = 1
    repeat = (1, 5, 30.0)
    warmup_time = 0

    def setup(self, workload, impl, kind):
        self.seqs = inputs(workload, kind)
        self.tree = make(impl)
        if impl == "radix_soa":
            import radix_soa
            radix_soa.warmup()

    def time_insert_all(self, workload, impl, kind):
        tree = self.tree
        for s in self.seqs:
            tree.insert(s)


class Lookup:
    params = (WORKLOADS, IMPLS, KINDS)
    param_names = ("workload", "impl", "input")
    repeat = (1, 5, 30.0)
    number = 1

    def setup(self, workload, impl, kind):
        self.seqs = inputs(workload, kind)
        misses = near_misses(workload)
        self.misses = misses if kind == "numpy" else tuple(m.tolist() for m in misses)
        self.tree = build(impl, sequences(workload))

    def time_exists_all(self, workload, impl, kind):
        ex = self.tree.exists
        for s in self.seqs:
            ex(s)

    def time_match_prefix_near_misses(self, workload, impl, kind):
        mp = self.tree.match_prefix
        for s in self.misses:
            mp(s)


class Footprint:
    params = (WORKLOADS, ("radix_soa", "radix_soa_int32"))
    param_names = ("workload", "impl")
    timeout = 300

    def setup(self, workload, impl):
        self.tree = build(impl, sequences(workload))

    def track_nodes(self, workload, impl):
        return self.tree.num_nodes

    def track_tokens_stored(self, workload, impl):
        return self.tree.num_tokens

    def track_used_bytes_per_stored_token(self, workload, impl):
        return self.tree.memory_report()["bytes_per_stored_token"]

    def track_used_bytes_per_node_beyond_tokens(self, workload, impl):
        return self.tree.memory_report()["bytes_per_node"]

    track_used_bytes_per_stored_token.unit = "bytes"
    track_used_bytes_per_node_beyond_tokens.unit = "bytes"


def timeraw_import_and_first_call():
    """Import plus the first insert/exists in a fresh process, with Numba's
    on-disk cache already warm (asv runs the setup code first)."""
    return """
import radix_soa
rc = radix_soa.RadixCache()
rc.insert([1, 2, 3])
rc.exists([1, 2, 3])
"""
