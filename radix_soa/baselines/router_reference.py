"""A pure-Python router index and page hash: the oracle ``RouterIndex`` and
the kernels' chained hash (``radix_soa._kernels.chain``) are tested against.

``ReferenceRouterIndex`` is a dict from page hash to ``[parent hash, set of
workers]``; ``page_hash`` / ``chain`` compute the hashes with Python ints.

>>> from radix_soa._events.kv_events import BlockStored
>>> h = chain([1, 2, 3, 4], 2)
>>> ix = ReferenceRouterIndex(2)
>>> ix.apply("w", [BlockStored(h, None, [1, 2, 3, 4], 2)])
>>> ix.overlap([1, 2, 3, 9])
[2]
"""

import copy

from .._events.kv_events import (AllBlocksCleared, BlockRemoved, EventError, event_from_dict,
                                namespace_seed)

M64 = (1 << 64) - 1
_M = (0x9FB21C651E98DF25, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)
_C = (0x9E3779B97F4A7C15, 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5, 0x94D049BB133111EB)


def mix64(x):
    """splitmix64's finalizer on a Python int in ``[0, 2**64)``."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    x ^= x >> 31
    return x


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def page_hash(h, tokens):
    """The hash of the page ``tokens`` after a page of hash ``h``:
    ``mix64(h ^ content)``, the content from four lanes (token j into lane
    ``j % 4``, those past the last multiple of 4 into lane 0; ``x =
    rotl((x ^ t) * m, 31)``) rotated apart and xored."""
    lanes = list(_C)
    full = len(tokens) - len(tokens) % 4
    for j, t in enumerate(tokens):
        lane = j % 4 if j < full else 0
        lanes[lane] = rotl(((lanes[lane] ^ (int(t) & M64)) * _M[lane]) & M64, 31)
    content = lanes[0] ^ rotl(lanes[1], 16) ^ rotl(lanes[2], 32) ^ rotl(lanes[3], 48)
    return mix64(h ^ content)


def chain(tokens, page, namespace=None):
    """The chained hashes of the whole pages of ``tokens``."""
    h = namespace_seed(namespace)
    out = []
    for i in range(len(tokens) // page):
        h = page_hash(h, tokens[i * page:(i + 1) * page])
        out.append(h)
    return out


class ReferenceRouterIndex:
    """``RouterIndex`` semantics on a dict: same checks, same worker order
    (the order workers were registered in), the same ``strict=False``
    repairs, ``seq`` rule and snapshots (no byte budget: a budgeted index
    must hold a subset of what this one holds)."""

    def __init__(self, page_size=16, workers=(), strict=True):
        self.page = page_size
        self.strict = strict
        self.blocks = {}  # hash -> [parent hash or None, set of workers]
        self.workers = list(workers)  # registered, oldest first
        self.problems = {}  # degraded worker -> its first problem
        self.seqs = {}

    def add_worker(self, worker):
        if worker not in self.workers:
            self.workers.append(worker)

    def __len__(self):
        return len(self.blocks)

    def status(self, worker):
        return "degraded" if worker in self.problems else "exact"

    def held(self, worker):
        return sorted(h for h, (_, ws) in self.blocks.items() if worker in ws)

    def apply(self, worker, events, strict=None, seq=None):
        strict = self.strict if strict is None else strict
        if isinstance(events, dict) or not isinstance(events, (list, tuple)):
            events = [events]
        events = [event_from_dict(e) for e in events]
        last = self.seqs.get(worker)
        if seq is not None and last is not None and seq <= last:
            return
        problem = self.problems.get(worker)
        if seq is not None and last is not None and seq != last + 1:
            if strict:
                raise EventError(f"seq {seq}: a gap")
            problem = problem or "gap"
        blocks = copy.deepcopy(self.blocks)  # all or nothing
        for i, e in enumerate(events):
            found = self._one(blocks, worker, i, e)
            if found is not None and strict:
                raise EventError(found)
            if isinstance(e, AllBlocksCleared):
                problem = None
            elif problem is None:
                problem = found
        self.blocks = blocks
        if not strict:
            if problem is None:
                self.problems.pop(worker, None)
            else:
                self.problems[worker] = problem
        self.add_worker(worker)
        if seq is not None:
            self.seqs[worker] = seq

    def apply_snapshot(self, worker, events, seq=None):
        saved = (copy.deepcopy(self.blocks), dict(self.seqs))
        try:
            self.apply(worker, [AllBlocksCleared()] + list(events), strict=True)
        except EventError:
            self.blocks, self.seqs = saved
            raise
        self.problems.pop(worker, None)
        self.seqs.pop(worker, None)
        if seq is not None:
            self.seqs[worker] = seq

    def _one(self, blocks, worker, i, e):
        """Apply ``e`` as far as it goes; the problem, or None."""
        if isinstance(e, AllBlocksCleared):
            for h in [h for h, (_, ws) in blocks.items() if worker in ws]:
                self._take(blocks, h, worker)
            return None
        if isinstance(e, BlockRemoved):
            problem = None
            for j, h in enumerate(e.block_hashes):
                if h not in blocks or worker not in blocks[h][1] or h in e.block_hashes[:j]:
                    problem = problem or f"event {i}: removed block {h} not held"
                else:
                    self._take(blocks, h, worker)
            return problem
        if e.block_size != self.page:
            raise EventError(f"event {i}: block_size {e.block_size}")
        problem = None
        parent = e.parent_block_hash
        if parent is not None and (parent not in blocks or worker not in blocks[parent][1]):
            problem = f"event {i}: parent not held"
        seen = set()
        for h in e.block_hashes:
            if h in seen or (h in blocks and worker in blocks[h][1]):
                problem = problem or f"event {i}: block {h} held"
            elif h in blocks and blocks[h][0] != parent:
                problem = problem or f"event {i}: block {h} mismatched"
            else:
                blocks.setdefault(h, [parent, set()])[1].add(worker)
            seen.add(h)
            parent = h
        return problem

    @staticmethod
    def _take(blocks, h, worker):
        blocks[h][1].discard(worker)
        if not blocks[h][1]:
            del blocks[h]

    def remove_worker(self, worker):
        self.apply(worker, [AllBlocksCleared()], strict=True)
        self.workers.remove(worker)
        self.problems.pop(worker, None)
        self.seqs.pop(worker, None)

    def overlap(self, tokens, namespace=None):
        hashes = chain(list(tokens), self.page, namespace)
        out = []
        for w in self.workers:
            n = 0
            while n < len(hashes) and hashes[n] in self.blocks and w in self.blocks[hashes[n]][1]:
                n += 1
            out.append(n * self.page)
        return out


def pages_of(events):
    """The pages of a stream of stored runs as ``{hash: (parent hash or
    None, page tokens, namespace)}`` (a snapshot compared page by page)."""
    out = {}
    for e in events:
        parent = e.parent_block_hash
        for j, h in enumerate(e.block_hashes):
            out[h] = (parent, tuple(e.token_ids[j * e.block_size:(j + 1) * e.block_size]),
                      e.namespace)
            parent = h
    return out
