"""``RouterIndex``'s events: ``apply`` and ``apply_snapshot`` (a worker's
``BlockStored``/``BlockRemoved``/``AllBlocksCleared``, strict or lenient,
``seq`` duplicates and gaps) and the undo log of a strict call. Bound as
methods by ``core.RouterIndex``.
"""

import numpy as np

from .._events.block_hash import key64
from .._events.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored, EventError,
                                 event_from_dict, extra_hash)
from .._input.validate import check_int
from .._kernels import router as router_kernels
from .._kernels import router_keys as hx
from .workers import worker_id

_BOOL = (bool, np.bool_)
_NO_EXTRAS = np.zeros(0, np.uint64)
MASK64 = (1 << 64) - 1
# the kinds of a strict call's undo steps: pages, the budget's count, the handle maps
_ADD, _DROP, _FORGOT, _HMAP, _HDEL, _HPUT = 0, 1, 2, 3, 4, 5
_EHOFF = 7  # undo: nodes no longer keep engine hashes (apply_wire's _SEG is 6)


def _parse(self, events):
    if isinstance(events, (dict, BlockStored, BlockRemoved, AllBlocksCleared)):
        events = [events]
    parsed = []
    for i, e in enumerate(events):
        try:
            e = event_from_dict(e)
        except EventError as exc:
            raise EventError(f"event {i}: {exc}") from None
        if isinstance(e, BlockStored) and e.block_size != self._page:
            raise EventError(f"event {i}: block_size {e.block_size} but this index has "
                             f"page_size {self._page}")
        parsed.append(e)
    return parsed

def apply(self, worker, events, *, strict=None, seq=None):
    """Apply ``events`` (``BlockStored``/``BlockRemoved``/
    ``AllBlocksCleared`` objects or their dicts) that ``worker`` emitted,
    oldest first; a new worker id joins the index (also with no
    events). ``strict`` (default: the index's): all or nothing,
    ``EventError`` on the first event that cannot apply, with every
    change undone (a new worker not registered); ``strict=False``: the
    worker becomes degraded instead and the events apply as far as they
    can (see the class). ``seq``: this call's number in the worker's
    stream (a duplicate is skipped, a gap is a problem).

    Parameters
    ----------
    worker : int, str or tuple
        The worker id (``worker_id``).
    events : iterable of events or dicts, or one event
        The worker's events, oldest first.
    strict : bool or None
        All or nothing (True), degrade instead (False), or the index's
        mode (None).
    seq : int or None
        This call's number in the worker's stream.

    >>> import radix_soa as rs
    >>> ix = rs.RouterIndex(page_size=2, strict=False)
    >>> ix.apply("w", [rs.BlockRemoved([7])], seq=0)   # a block it never held
    >>> ix.status("w"), ix.apply("w", [], seq=0), list(ix.degraded)
    ('degraded', None, ['w'])
    """
    worker = worker_id(worker)
    if strict is None:
        strict = self._strict
    elif not isinstance(strict, _BOOL):
        raise TypeError(f"strict must be a bool or None; got {type(strict).__name__}")
    if seq is not None:
        seq = check_int("seq", seq, minimum=0)
    parsed = self._parse(events)
    with self._writing:
        skip, gap = self._seq_check(worker, seq, strict)
        if skip:
            return  # a duplicate (or a batch older than one applied): skipped
        new = worker not in self._cols
        col = self._column(worker, True)
        if strict:
            self._apply_strict(worker, col, new, parsed)
        else:
            self._apply_lenient(worker, col, new, parsed, gap)
        if new:
            self._register(worker, col)
        if seq is not None:
            self._seq[worker] = seq
        self._fit()


def _seq_check(self, worker, seq, strict):
    """``(skip, gap)`` of a call numbered ``seq``: skip a duplicate (or a
    call older than one applied); a gap's problem (strict: raised)."""
    last = self._seq.get(worker)
    if seq is None or last is None:
        return False, None
    if seq <= last:
        return True, None
    if seq == last + 1:
        return False, None
    gap = f"seq {seq}: calls {last + 1}..{seq - 1} of worker {worker!r} never arrived"
    if strict:
        raise EventError(gap)
    return False, gap


def _apply_strict(self, worker, col, new, parsed, first=0):
    """Apply ``parsed`` (numbered from ``first``) all or nothing: on any
    exception every change is undone (a new worker's column freed)."""
    undo = []
    try:
        for i, e in enumerate(parsed):
            self._apply_one(first + i, col, worker, e, undo)
    except BaseException:
        self._undo(undo)
        if new:
            self._col_ids[col] = None
        raise


def _engine_hashes_on(self, col):
    """Nodes keep their first holder's engine hash from now on if worker
    column ``col`` needed entries (its hashes are not the pages' keys):
    after an ``apply_wire``, whose kernel keeps entries until then."""
    if not self._eh_on and self._hmaps[col][2]:
        self._ehash_on()


def _apply_lenient(self, worker, col, new, parsed, gap):
    """Apply ``parsed`` as far as each event can, the worker degraded by
    the first problem (``gap``, or one an event had) since its last clear."""
    problem = self._status.get(worker, gap)
    try:
        for i, e in enumerate(parsed):
            found = self._apply_one(i, col, worker, e, None)
            if isinstance(e, AllBlocksCleared):
                problem = None
            elif problem is None:
                problem = found
    except BaseException:
        _interrupted(self, worker, col, new, len(parsed))
        raise
    _settle(self, worker, problem)


def _interrupted(self, worker, col, new, n):
    """A lenient apply of ``n`` events stopped by an exception: some
    applied, not all, so the worker is not exact (its new column kept)."""
    self._status[worker] = (f"an apply of {n} events was interrupted "
                            "(KeyboardInterrupt, MemoryError)")
    if new:
        self._register(worker, col)


def _settle(self, worker, problem):
    """A lenient apply's end: the worker exact, or degraded by ``problem``."""
    if problem is None:
        self._status.pop(worker, None)
    else:
        self._status[worker] = problem


def apply_snapshot(self, worker, events, *, seq=None):
    """Replace every page of ``worker`` by ``events``, stored runs parents
    first (``PrefixCache.snapshot_events()``: its cache now), and mark it
    exact. All or nothing: a snapshot whose events do not apply as a
    stream after a clear raises ``EventError`` and changes nothing.
    ``seq``: the worker's last call number the snapshot covers (later
    calls continue from it).

    >>> import radix_soa as rs
    >>> pc = rs.PrefixCache(page_size=2, events=True, values=False)
    >>> _ = pc.insert([1, 2, 3, 4]); _ = pc.take_events()     # lost on the way
    >>> ix = rs.RouterIndex(page_size=2, strict=False)
    >>> _ = pc.insert([1, 2, 3, 4, 5, 6]); ix.apply("w", pc.take_events())
    >>> ix.status("w"), ix.overlap([1, 2, 3, 4, 5, 6]).tolist()
    ('degraded', [0])
    >>> ix.apply_snapshot("w", pc.snapshot_events())
    >>> ix.status("w"), ix.overlap([1, 2, 3, 4, 5, 6]).tolist()
    ('exact', [6])
    """
    worker = worker_id(worker)
    if seq is not None:
        seq = check_int("seq", seq, minimum=0)
    parsed = [AllBlocksCleared()] + self._parse(events)
    with self._writing:
        new = worker not in self._cols
        col = self._column(worker, True)
        self._apply_strict(worker, col, new, parsed, first=-1)
        if new:
            self._register(worker, col)
        self._status.pop(worker, None)
        if seq is not None:
            self._seq[worker] = seq
        else:
            self._seq.pop(worker, None)
        self._fit()

def _apply_one(self, i, col, worker, e, undo):
    """Apply event ``e`` (the ``i``-th of the call) for ``worker``:
    strict (``undo`` a list: raise on a problem, log the undo steps)
    or lenient (``undo`` None: return the problem, or None)."""
    w, bit = self._bit(col)
    if isinstance(e, AllBlocksCleared):
        self._clear(w, bit, undo)
        forgot = int(self._forgot[col])
        self._forgot[col] = 0
        old = self._hmaps[col]
        self._hmaps[col] = self._new_handles()
        if undo is not None:
            undo.append((_FORGOT, col, forgot))
            undo.append((_HMAP, col, old))
        return None
    stored = isinstance(e, BlockStored)
    has_parent = stored and e.parent_block_hash is not None
    if self._none_hash is not None:  # keyed by the engine's hash itself
        parent = np.uint64(key64(e.parent_block_hash) if has_parent else 0)
        hashes = self._keys_of(e.block_hashes)
        return self._apply_keys(i, col, worker, e, undo, hashes, parent, has_parent, hashes)
    # keyed by their tokens: the engine's hashes are handles
    handles = self._keys_of(e.block_hashes)
    hk, hv, _ = self._hmaps[col]
    n = handles.shape[0]
    if not stored:
        keys = np.empty(n, np.uint64)
        had = np.empty(n, np.int8)
        hx.hx_keys(hk, hv, self._etable, self._ehash, self._table, self._keys, self._masks, w,
                   bit, handles, keys, had)
        problem = self._apply_keys(i, col, worker, e, undo, keys, np.uint64(0), False, handles)
        self._handle_del(col, handles)
        if undo is not None:
            undo.append((_HPUT, col, handles[had == 1], keys[had == 1]))
        return problem
    if has_parent:
        parent = np.uint64(hx.hx_key(hk, hv, self._etable, self._ehash, self._table,
                                     self._keys, self._masks, w, bit,
                                     np.uint64(key64(e.parent_block_hash))))
    else:
        parent = self._seed(e.namespace)
    keys = np.empty(n, np.uint64)
    hx.token_keys(self._tokens_of(e), 0, self._page, parent, self._extras(e), keys)
    own = not self._eh_on and np.array_equal(handles, keys)  # every hash its page's key
    if not self._eh_on and not own:
        self._ehash_on()
        if undo is not None:
            undo.append((_EHOFF,))
    cut = []
    problem = self._apply_keys(i, col, worker, e, undo, keys, parent, has_parent, handles, cut)
    if own and not self._hmaps[col][2]:
        return problem  # no entries, none to drop
    if undo is not None:  # (pages new to the worker: it had no entry of these hashes,
        undo.append((_HDEL, col, handles))  # but for one engine naming two pages alike)
    if cut:  # no entries for the pages past the budget, never stored
        kept = ~np.isin(keys, cut[0])
        handles, keys = handles[kept], keys[kept]
    self._handle_note(col, handles, keys)
    return problem


def _apply_keys(self, i, col, worker, e, undo, hashes, parent, has_parent, ehs, cut=None):
    """``_apply_one`` of a stored run or removal whose pages' keys are
    ``hashes`` (a stored run's after the page of key ``parent``), named by
    the worker ``ehs``; the keys of a run's tail past the budget, not
    stored, appended to ``cut`` (a list) if given."""
    w, bit = self._bit(col)
    n = hashes.shape[0]
    codes = np.empty(n, np.int8)
    stored = isinstance(e, BlockStored)
    cap = None if self._max_bytes is None else self._node_budget()
    # the common event in one kernel call: every page applies as it is
    if not stored:
        parents = np.empty(n, np.uint64)
        hasp = np.empty(n, np.int8)
        olds = np.empty(n, np.uint64)
        if router_kernels.rx_remove(self._table, self._keys, self._pkeys, self._flags,
                                    self._masks, self._meta, self._etable, self._ehash, w, bit,
                                    hashes, codes, parents, hasp, olds, self._seen_for(n)) < 0:
            if undo is not None:
                undo.append((_ADD, w, bit, hashes, parents, hasp, olds))
            return None
    elif cap is None or n <= cap:
        self._reserve(n)
        where, bad = router_kernels.rx_store(self._table, self._keys, self._pkeys, self._flags,
                                             self._masks, self._meta, self._etable, self._ehash,
                                             w, bit, hashes, ehs, parent, has_parent,
                                             self._stamps, codes, self._seen_for(n))
        if where == router_kernels.P_HELD and bad < 0:
            if undo is not None:
                undo.append((_DROP, w, bit, hashes))
            return None
    where = router_kernels.rx_classify(self._table, self._keys, self._pkeys, self._flags, self._masks,
                           w, bit, hashes, parent, has_parent, stored, codes, self._seen_for(n))
    forgot = int(self._forgot[col])
    if not stored:
        # a removal of a page the budget forgot: gone from the index, or
        # stored again since by other workers only
        unheld = (codes == router_kernels.C_ABSENT) | (codes == router_kernels.C_UNHELD)
        excused = min(int(np.count_nonzero(unheld)), forgot)
        problem = None
        bad = np.flatnonzero(codes == router_kernels.C_REPEAT)
        if excused < np.count_nonzero(unheld) or bad.shape[0]:
            at = int(np.flatnonzero(unheld | (codes == router_kernels.C_REPEAT))[0])
            problem = (f"event {i}: BlockRemoved of block {e.block_hashes[at]}, which worker "
                       f"{worker!r} does not hold")
            if undo is not None:
                raise EventError(problem)
        self._forgot[col] = forgot - excused
        held = hashes[codes == router_kernels.C_OK]
        parents = np.empty(held.shape[0], np.uint64)
        hasp = np.empty(held.shape[0], np.int8)
        olds = np.empty(held.shape[0], np.uint64)
        router_kernels.rx_drop(self._table, self._keys, self._pkeys, self._flags, self._masks,
                               self._meta, self._etable, self._ehash, w, bit, held, parents,
                               hasp, olds)
        if undo is not None:
            undo.append((_FORGOT, col, forgot))
            undo.append((_ADD, w, bit, held, parents, hasp, olds))
        return problem
    problem = None
    if where != router_kernels.P_HELD and forgot == 0:  # else: under a page the budget forgot?
        problem = (f"event {i}: BlockStored: its parent block {e.parent_block_hash} is not "
                   f"held by worker {worker!r} (an event missed or applied out of order)")
    else:
        bad = np.flatnonzero(codes != router_kernels.C_OK)
        if bad.shape[0]:
            at = int(bad[0])
            block = e.block_hashes[at]
            problem = (f"event {i}: BlockStored: " + (
                f"block {block} is held by worker {worker!r} already (an event applied "
                "twice?)" if codes[at] == router_kernels.C_HELD else
                f"block {block} is known with another parent block (another hash "
                "function or page size?)"))
    if problem is not None and undo is not None:
        raise EventError(problem)
    parents = np.empty(hashes.shape[0], np.uint64)
    hasp = np.ones(hashes.shape[0], np.int8)
    if hashes.shape[0]:
        parents[0] = parent
        parents[1:] = hashes[:-1]
        hasp[0] = 1 if has_parent else 0
    keep = codes == router_kernels.C_OK
    hashes, parents, hasp, ehs = hashes[keep], parents[keep], hasp[keep], ehs[keep]
    if cap is not None and hashes.shape[0] > cap:  # a run past the budget: its tail forgotten
        self._forgot[col] += hashes.shape[0] - cap
        self._forgotten += hashes.shape[0] - cap
        if cut is not None:
            cut.append(hashes[cap:])
        hashes, parents, hasp, ehs = hashes[:cap], parents[:cap], hasp[:cap], ehs[:cap]
    self._add(w, bit, hashes, parents, hasp, ehs)
    if undo is not None:
        undo.append((_FORGOT, col, forgot))
        undo.append((_DROP, w, bit, hashes))
    return problem

def _keys_of(self, block_hashes):
    """The 64-bit keys of an event's (checked) block hashes."""
    if not block_hashes or not isinstance(block_hashes[0], bytes):  # ints in [0, 2**64)
        return np.array(block_hashes, np.uint64)
    return np.array([key64(h) for h in block_hashes], np.uint64)


def _seen_for(self, n):
    """``rx_classify``'s scratch set for ``n`` hashes: empty for one, else
    at least 2n slots (kept, all zero between calls; not part of the index's bytes)."""
    if n <= 1:
        return _NO_EXTRAS
    seen = self.__dict__.get("_seen")
    if seen is None or seen.shape[0] < 2 * n:
        seen = self.__dict__["_seen"] = np.zeros(1 << (2 * n - 1).bit_length(), np.uint64)
    return seen


def _tokens_of(self, e):
    """A stored run's tokens as int64 (checked ints already)."""
    try:
        return np.array(e.token_ids, np.int64)
    except OverflowError:  # past int64: hashed as their low 64 bits, as the cache does
        return np.array([t & MASK64 for t in e.token_ids], np.uint64).view(np.int64)


def _extras(self, e):
    """Per page of a stored run, the hash of its extra keys (its LoRA name,
    carried by the namespace already, left out), 0 for none; empty when no
    page has any."""
    ek = e.extra_keys
    if not ek:
        return _NO_EXTRAS
    out = np.zeros(len(e.block_hashes), np.uint64)
    for j, keys in enumerate(ek[:out.shape[0]]):
        out[j] = extra_hash(keys, e.lora_name)
    return out

def _undo(self, steps):
    """Undo a strict call's steps, last first. They are tuples, not
    closures: a call of many events keeps no objects the cyclic
    garbage collector would scan again and again."""
    for step in reversed(steps):
        kind = step[0]
        if kind == _ADD:
            self._add(*step[1:])
        elif kind == _DROP:
            self._drop_held(*step[1:])
        elif kind == _FORGOT:
            self._forgot[step[1]] = step[2]
        elif kind == _HMAP:
            self._hmaps[step[1]] = step[2]
        elif kind == _HDEL:
            self._handle_del(step[1], step[2])
        elif kind == _HPUT:
            self._handle_put(step[1], step[2], step[3])
        elif kind == _EHOFF:
            self._ehash_off()
        else:  # a run of events apply_wire's kernel applied
            self._undo_run(*step[1:])

def _add(self, w, bit, hashes, parents, hasp, ehs=_NO_EXTRAS):
    """Give worker ``(w, bit)`` the pages ``hashes`` (``rx_add``; ``ehs``
    their engine hashes, empty: their keys)."""
    self._reserve(hashes.shape[0])
    router_kernels.rx_add(self._table, self._keys, self._pkeys, self._flags, self._masks,
                          self._meta, self._etable, self._ehash, w, bit, hashes, parents, hasp,
                          ehs, self._stamps)

def _drop_held(self, w, bit, hashes):
    """Take from worker ``(w, bit)`` those of ``hashes`` it still holds
    (an undo: the budget may have forgotten some meanwhile)."""
    codes = np.empty(hashes.shape[0], np.int8)
    router_kernels.rx_classify(self._table, self._keys, self._pkeys, self._flags, self._masks, w, bit,
                   hashes, np.uint64(0), False, False, codes, self._seen_for(hashes.shape[0]))
    held = hashes[codes == router_kernels.C_OK]
    parents = np.empty(held.shape[0], np.uint64)
    hasp = np.empty(held.shape[0], np.int8)
    router_kernels.rx_drop(self._table, self._keys, self._pkeys, self._flags, self._masks,
                           self._meta, self._etable, self._ehash, w, bit, held, parents, hasp,
                           np.empty(held.shape[0], np.uint64))

def _clear(self, w, bit, undo=None):
    live = int(self._meta[router_kernels.X_LIVE])
    out = np.empty(live, np.uint64)
    parents = np.empty(live, np.uint64)
    hasp = np.empty(live, np.int8)
    olds = np.empty(live, np.uint64)
    n = router_kernels.rx_clear(self._table, self._keys, self._pkeys, self._flags, self._masks,
                                self._meta, self._etable, self._ehash, w, bit, out, parents, hasp,
                                olds)
    if undo is not None:
        undo.append((_ADD, w, bit, out[:n], parents[:n], hasp[:n], olds[:n]))
