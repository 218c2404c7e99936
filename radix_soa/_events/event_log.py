"""The KV event queue of a ``PrefixCache(events=True)``, and the cache's
mutating calls in that mode.

Every call that adds or removes whole pages hands its kernel an event log
buffer (``_kernels.chain``) that the kernel appends to in the same call that
changes the tree; the buffer is queued *before* the kernel runs, so whatever
interrupts the Python around it, the queue holds exactly what the tree did. ``take_events`` decodes the queued logs into
``BlockStored`` / ``BlockRemoved`` objects, oldest first. With events off
the cache never builds any of this (``PrefixCache._events is None``: one
branch per call).

Taking is fault safe: ``take`` builds every event object before it changes
anything and then drains the queue in one attribute store, so an interrupt or ``MemoryError`` while it decodes leaves the queue as it
was; ``PrefixCache.take_events`` hands back to ``held`` (returned first by
the next call) the events of a take whose return an exception cut off.

The cache's calls pass ``ev`` (``EventLog.ev``, or None with events off)
to the same kernels; the tests check that a cache with events behaves
exactly as one without. What reads the cache's own arrays for its events
(a snapshot, the room a call's log needs, a dropped namespace) is the
prefix cache's (``radix_soa.prefix_cache.events``).
"""

import numpy as np

from .._tree import storage
from .block_hash import block_hashes
from .._kernels.chain import REC_REMOVED, REC_STORED
from .kv_events import AllBlocksCleared, BlockRemoved, BlockStored, namespace_seed



def log_size(tokens, page, items=1):
    """Room a log needs for calls inserting ``tokens`` whole-page tokens in
    ``items`` inserts (each evicting at most what it adds)."""
    return 2 * tokens + 4 * (tokens // page) + 8 * items + 8


class EventLog:
    """The pending events of one cache, oldest first: ``held`` (events taken
    but never handed over, see ``PrefixCache.take_events``), then ``queue``:
    int64 buffers the kernels append records to (each with the namespace
    key list its numbers refer to) and event objects (``AllBlocksCleared``).
    The last buffer is written until a call may not fit in what is left of
    it."""

    MIN_BUFFER = 1 << 15

    def __init__(self, page, seed=None):
        self.page = page
        # sha256_cbor: vLLM's NONE_HASH, and the 32-byte hash of every cached
        # page by its 64-bit chain hash (the kernels log the latter); None: fast64
        self.seed = seed
        self.sha = {}
        self.held = []
        self.queue = []
        self.active = None  # the buffer in use, last in the queue
        self.scratch = np.empty(64, np.int32)
        self.seeds = np.empty(0, np.uint64)
        self.seeded = None  # the namespace key list ``seeds`` was built from

    def ev(self, s, keys, size):
        """The ``ev`` tuple kernels take, with room for ``size`` more slots
        of records, for a cache whose storage is ``s`` and whose namespace
        keys (by number) are the list ``keys``. Call under the cache's lock,
        after the cache numbered the namespace."""
        if self.scratch.shape[0] < s.start.shape[0]:
            self.scratch = np.empty(s.start.shape[0], np.int32)
        if self.seeded is not keys or self.seeds.shape[0] != len(keys):
            self.seeds = np.array([namespace_seed(k) for k in keys], np.uint64)
            self.seeded = keys
        log = self.active
        if log is None or log[0] + size > log.shape[0] or self.queue[-1][1] is not keys:
            log = storage.allocate(max(self.MIN_BUFFER, 2 * size), np.int64)
            log[0] = 1
            self.queue.append((log, keys))  # queued before any kernel writes to it
            self.active = log
        return log, self.scratch, self.seeds

    def cleared(self):
        """A copy of this log with ``AllBlocksCleared`` queued (``reset``
        swaps it in with the fresh tree in one update)."""
        new = EventLog(self.page, self.seed)
        new.sha = self.sha  # the records queued before the clear still need it
        new.held = self.held
        new.queue = self.queue + [AllBlocksCleared()]
        return new

    def take(self):
        """Every pending event, oldest first, and the log emptied (call under
        the cache's lock). Nothing changes until every object is built; the
        drain is one C call, the last line."""
        out = list(self.held)
        sha = dict(self.sha) if self.seed is not None else None  # changed only by the drain
        for item in self.queue:
            if isinstance(item, tuple):
                out.extend(self._decode(*item, sha))
            else:
                if sha is not None:  # AllBlocksCleared
                    sha.clear()
                out.append(item)
        # the buffer in use is dropped, not emptied in place (that would be a
        # second step): the next call that logs starts a new one
        emptied = dict(self.__dict__, held=[], queue=[], active=None,
                       sha=self.sha if sha is None else sha)
        # the drain is one attribute store with the return on its line: no
        # interrupt falls between them (the tests' come at a line, a signal's
        # at a call or a line start)
        self.__dict__ = emptied; return out  # noqa: E702

    def hold(self, events):
        """Put back, first, the events of a take whose caller never got them
        (under the cache's lock)."""
        self.held = events + self.held

    def _decode(self, log, keys, sha):
        page = self.page
        end = int(log[0])
        w = 1
        events = []
        while w < end:
            kind, ns, k = int(log[w]), int(log[w + 1]), int(log[w + 2])
            if kind == REC_STORED:
                has_parent = int(log[w + 3])
                parent = int(log[w + 4:w + 5].view(np.uint64)[0]) if has_parent else None
                hashes = log[w + 5:w + 5 + k].view(np.uint64).tolist()
                w += 5 + k
                tokens = log[w:w + k * page].tolist()
                w += k * page
                key = keys[ns] if 0 <= ns < len(keys) else ns
                if sha is not None:  # the same pages' vLLM hashes, chained from the parent's
                    vparent = sha[parent] if has_parent else None
                    vhashes = block_hashes(tokens, page, vparent, key, self.seed)
                    sha.update(zip(hashes, vhashes))
                    hashes, parent = vhashes, vparent
                events.append(BlockStored(
                    hashes, parent, tokens, page,
                    lora_id=key if type(key) is int and key != 0 else None,
                    lora_name=key if isinstance(key, str) else None))
            elif kind == REC_REMOVED:
                hashes = log[w + 3:w + 3 + k].view(np.uint64).tolist()
                if sha is not None:
                    hashes = [sha.pop(h) for h in hashes]
                events.append(BlockRemoved(hashes))
                w += 3 + k
            else:  # pragma: no cover - a kernel wrote a record this code does not know
                raise AssertionError(f"event log record kind {kind} at {w}")
        return events
