"""The slowest, most obviously correct model of a set of sequences.

It stores whole sequences in a Python set and answers every question by brute
force. The compressed-tree shape (nodes, tokens) is derived from the set of
distinct prefixes, without building any tree.
"""


class NaiveSequenceSet:
    def __init__(self):
        self.seqs = set()

    def insert(self, seq):
        t = tuple(int(x) for x in seq)
        if not t:
            raise ValueError("empty")
        new = t not in self.seqs
        self.seqs.add(t)
        return new

    def remove(self, seq):
        self.seqs.remove(tuple(int(x) for x in seq))

    def exists(self, seq):
        return tuple(int(x) for x in seq) in self.seqs

    def match_prefix(self, seq):
        q = tuple(int(x) for x in seq)
        best = 0
        for s in self.seqs:
            k = 0
            while k < min(len(s), len(q)) and s[k] == q[k]:
                k += 1
            best = max(best, k)
        return best

    def __len__(self):
        return len(self.seqs)

    def sorted(self):
        return sorted(self.seqs)

    def _prefixes(self):
        return {s[:i] for s in self.seqs for i in range(1, len(s) + 1)}

    @property
    def num_tokens(self):
        # every token of a compressed trie is the last token of exactly one
        # distinct non-empty prefix
        return len(self._prefixes())

    @property
    def num_nodes(self):
        # a node ends at a prefix that is stored or where paths branch
        prefixes = self._prefixes()
        branching = {}
        for p in prefixes:
            branching.setdefault(p[:-1], set()).add(p[-1])
        return sum(1 for p in prefixes if p in self.seqs or len(branching.get(p, ())) >= 2)


def splitmix_key_hash(p, token):
    """The child-table key hash of ``(p, token)`` from splitmix64's
    definition, in Python integers (not the kernels'): the table's tag is
    its high 32 bits."""
    m = (1 << 64) - 1

    def mix(x):
        x ^= x >> 30
        x = (x * 0xBF58476D1CE4E5B9) & m
        x ^= x >> 27
        x = (x * 0x94D049BB133111EB) & m
        return x ^ (x >> 31)

    return mix(mix((p + 0x9E3779B97F4A7C15) & m) ^ (token & m))
