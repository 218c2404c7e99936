"""``RouterIndex``'s storage: its arrays (one node per page, a bitmask
row of workers per node, the hash table), their growth, the byte budget
(``max_bytes``: what fits, and forgetting the least recently walked pages),
the worker columns, and the primitive page changes every event reduces to.
Bound as methods by ``core.RouterIndex``.
"""

import numpy as np

from .._kernels import router as router_kernels
from .._kernels import router_keys as hx

_NO_SLOTS = np.zeros(0, np.uint64)
MIN_BYTES = 4096  # the smallest max_bytes: room for a table and a few dozen pages
MIN_SLOTS = 128   # the smallest table


def _alloc(self, nodes, slots, old=None):
    """Fresh arrays of ``nodes`` nodes and ``slots`` table slots, holding
    the live nodes of ``old`` (compacted) and the tables rebuilt.
    ``pkeys`` only where pages are keyed by an engine's hash (keyed by
    tokens, a key names its parent already); ``ehash`` and ``etable``
    once an engine hash has differed from its page's key (``_ehash_on``)."""
    keys = np.zeros(nodes, np.uint64)
    pkeys = np.zeros(nodes if self._none_hash is not None else 0, np.uint64)
    ehash = np.zeros(nodes if self.__dict__.get("_eh_on") else 0, np.uint64)
    flags = np.full(nodes, -1, np.int8)
    masks = np.zeros((nodes, self._words), np.int64)
    stamps = np.zeros(0 if self._max_bytes is None else nodes + 1, np.int64)
    meta = np.zeros(router_kernels.X_SIZE, np.int64)
    meta[router_kernels.X_FREE] = -1
    end = 0 if old is None else int(old["meta"][router_kernels.X_END])
    if old is not None and self._max_bytes is None and end <= nodes:
        # unbudgeted: every id kept (free ones stay on the free list), no gather
        keys[:end], flags[:end] = old["keys"][:end], old["flags"][:end]
        if pkeys.shape[0]:
            pkeys[:end] = old["pkeys"][:end]
        if ehash.shape[0]:
            ehash[:end] = old["ehash"][:end] if old["ehash"].shape[0] else old["keys"][:end]
        masks[:end, :old["masks"].shape[1]] = old["masks"][:end]
        meta[:] = old["meta"]
    elif old is not None:  # the live nodes, renumbered 0.. (free ids dropped)
        ids = np.flatnonzero(old["flags"][:end] >= 0)
        n = ids.shape[0]
        keys[:n], flags[:n] = old["keys"][ids], old["flags"][ids]
        if pkeys.shape[0]:
            pkeys[:n] = old["pkeys"][ids]
        if ehash.shape[0]:
            ehash[:n] = old["ehash"][ids] if old["ehash"].shape[0] else old["keys"][ids]
        masks[:n, :old["masks"].shape[1]] = old["masks"][ids]
        if stamps.shape[0]:
            stamps[:n] = old["stamps"][ids]
            stamps[-1] = old["stamps"][-1]  # the clock
        meta[router_kernels.X_END] = meta[router_kernels.X_LIVE] = n
    table = np.full(slots, -1, np.int32)
    etable = np.full(slots if ehash.shape[0] else 0, -1, np.int32)
    router_kernels.rx_table_rebuild(table, keys, flags, int(meta[router_kernels.X_END]), etable,
                                    ehash)
    self.__dict__.update({"_keys": keys, "_pkeys": pkeys, "_flags": flags, "_masks": masks,
                          "_stamps": stamps, "_meta": meta, "_table": table,
                          "_ehash": ehash, "_etable": etable})


def _ehash_on(self):
    """Keep each node's engine hash from now on (the first time an engine
    names a page otherwise than by its key): every live node's is its key
    (no worker has an entry for it), and the table to find them by it."""
    if self._eh_on:
        return
    self._eh_on = True
    self._budget_words = None  # wider nodes: the budget's cache is stale
    if self._max_bytes is not None:
        cap = self._node_budget()
        live = int(self._meta[router_kernels.X_LIVE])
        if live > cap:
            self._forget(live - cap)
        self._alloc(min(self._keys.shape[0], cap), self._table.shape[0], self._arrays())
    else:
        self._alloc(self._keys.shape[0], self._table.shape[0], self._arrays())


def _ehash_off(self):
    """Undo ``_ehash_on`` (a strict call refused): the nodes' engine hashes
    and their table dropped (any page the budget forgot to make room for
    them stays forgotten, as for any page a refused call made room for)."""
    if not self._eh_on:
        return
    self._eh_on = False
    self._budget_words = None
    self._alloc(self._keys.shape[0], self._table.shape[0], self._arrays())


def _arrays(self):
    return {"keys": self._keys, "pkeys": self._pkeys, "flags": self._flags,
            "masks": self._masks, "stamps": self._stamps, "meta": self._meta,
            "ehash": self._ehash}

def _node_bytes(self):
    """Bytes per node of the node arrays (keys, flags, masks; pkeys,
    ehash, stamps where there are)."""
    return (9 + 8 * self._words + (0 if self._max_bytes is None else 8)
            + (8 if self._none_hash is not None else 0) + (8 if self._eh_on else 0))


def _slot_bytes(self):
    """Bytes per slot of the tables (``table``, and ``etable`` beside it)."""
    return 8 if self._eh_on else 4

def _fixed_bytes(self):
    """The bytes beside the node arrays: meta, the columns' words, the
    handle maps (as they are now)."""
    return (8 * (router_kernels.X_SIZE + self._live.shape[0] + self._forgot.shape[0] + 1)
            + self._handle_bytes())

def _node_budget(self):
    """The most nodes whose arrays (and a table at load <= 3/4) fit
    ``max_bytes`` (with this many mask words and these handle maps; cached)."""
    fixed = self._fixed_bytes()
    if self._budget_words == (self._words, fixed):
        return self._budget_nodes
    room = self._max_bytes - fixed
    per = self._node_bytes()
    tb = self._slot_bytes()
    best, slots = 0, MIN_SLOTS
    while tb * slots < room:
        best = max(best, min(3 * slots // 4, (room - tb * slots) // per))
        slots *= 2
    self._budget_words, self._budget_nodes = (self._words, fixed), best
    return best


def _slots_for(nodes):
    """The fewest table slots (a power of two) that hold ``nodes`` at load
    <= 3/4."""
    return max(MIN_SLOTS, 1 << (-(-4 * nodes // 3) - 1).bit_length())

def _reserve(self, new):
    """Room for ``new`` more nodes (and their table slots, load <= 3/4);
    with a budget, at most ``_node_budget()`` nodes, forgetting the
    least recently used pages to make room (``new`` is within it)."""
    meta = self._meta
    cap = None if self._max_bytes is None else self._node_budget()
    if cap is not None and int(meta[router_kernels.X_LIVE]) + new > cap:
        live = int(meta[router_kernels.X_LIVE])
        self._forget(live + new - cap + cap // 16)  # a sixteenth more: amortized
    live = int(meta[router_kernels.X_LIVE])
    nodes = self._keys.shape[0]
    ids = max(int(meta[router_kernels.X_END]), live + new)  # free ids are reused first
    if ids <= nodes and 4 * (live + new) <= 3 * self._table.shape[0] and (
            cap is None or nodes <= cap and self._memory_bytes() <= self._max_bytes):
        return
    # nodes grow by a quarter, the tables double
    size = max(nodes, ids, 64)
    if ids > nodes:
        size = max(ids, nodes + nodes // 4)
    slots = self._table.shape[0]
    if cap is None and 4 * (live + new) <= 3 * slots:
        _extend(self, size)  # the tables hold: node ids kept, nothing rebuilt
        return
    if 4 * (live + new) > 3 * slots:
        slots = max(2 * slots, _slots_for(live + new))
    if cap is not None:
        size = min(size, cap)  # the copy renumbers the live nodes: live + new <= cap
        slots = min(slots, _slots_for(cap))  # (fewer, when the handle maps grew)
    self._alloc(size, slots, self._arrays())


def _extend(self, nodes):
    """The node arrays ``nodes`` long (unbudgeted: no stamps), every id
    kept, so the tables stay as they are."""
    n = self._keys.shape[0]

    def grown(a, fill=0):
        out = np.full((nodes,) + a.shape[1:], fill, a.dtype)
        out[:n] = a
        return out

    self._keys, self._flags, self._masks = (grown(self._keys), grown(self._flags, -1),
                                            grown(self._masks))
    if self._pkeys.shape[0]:
        self._pkeys = grown(self._pkeys)
    if self._ehash.shape[0]:
        self._ehash = grown(self._ehash)


def _fit(self):
    """Under a budget, the index's bytes back within ``max_bytes`` after a
    handle map grew (fewer nodes fit beside it): forget and compact."""
    if self._max_bytes is None:
        return
    if self._memory_bytes() <= self._max_bytes:
        return
    self._reserve(0)

def _forget(self, n):
    """Forget the ``n`` live pages queries walked least recently, for
    every worker (the budget)."""
    end = int(self._meta[router_kernels.X_END])
    ids = np.flatnonzero(self._flags[:end] >= 0)
    n = min(n, ids.shape[0])
    if n <= 0:
        return
    if n < ids.shape[0]:
        ids = ids[np.argpartition(self._stamps[ids], n - 1)[:n]]
    gone = self._keys[ids]
    router_kernels.rx_forget(self._table, self._keys, self._flags, self._masks, self._meta,
                             self._etable, self._ehash, ids.astype(np.int64), self._forgot)
    self._forgotten += n
    for col, m in self._hmaps.items():  # the workers' handles of the pages forgotten
        if m[2]:
            used = m[0] != 0
            drop = used & np.isin(m[1], gone)
            if drop.any():
                self._hmaps[col] = _handles_of(m[0][used & ~drop], m[1][used & ~drop])

def _column(self, worker, create):
    """The column of ``worker`` (a checked id); with ``create``, a free
    column for a new one (taken by ``_register`` once its events applied)."""
    col = self._cols.get(worker)
    if col is not None or not create:
        return col
    col = next((c for c, w in enumerate(self._col_ids) if w is None), len(self._col_ids))
    if col == len(self._col_ids):
        self._col_ids.append(None)
    if col >= 64 * self._words:  # another word of bits per node
        self._words += 1
        self._live = np.concatenate([self._live, np.zeros(1, np.int64)])
        self._forgot = np.concatenate([self._forgot, np.zeros(64, np.int64)])
        nodes = self._keys.shape[0]
        if self._max_bytes is not None:  # wider rows: fewer of them fit
            cap = self._node_budget()
            if int(self._meta[router_kernels.X_LIVE]) > cap:
                self._forget(int(self._meta[router_kernels.X_LIVE]) - cap)
            nodes = min(nodes, cap)
        self._alloc(nodes, self._table.shape[0], self._arrays())
    self._hmaps[col] = self._new_handles()
    self._forgot[col] = 0  # a fresh column (its events may add to it before _register)
    return col

def _register(self, worker, col):
    self._cols[worker] = col
    self._col_ids[col] = worker
    self._order.append(worker)
    w, bit = self._bit(col)
    self._live[w] |= bit
    self._columns_changed()

def _bit(col):
    """``(word, bit)`` of column ``col``: the bit as an int64 (bit 63 negative)."""
    b = col % 64  # a Python int: Numba unboxes it faster than a NumPy scalar
    return col // 64, -(1 << 63) if b == 63 else 1 << b


def _columns_changed(self):
    keep = [self._cols[w] for w in self._order]
    n = len(keep)
    self._out = slice(0, n) if keep == list(range(n)) else np.array(keep, np.intp)


def memory_report(self):
    """The index's arrays in bytes: ``bytes`` (all of them, as
    allocated), ``bytes_per_page`` (that over the pages held),
    ``pages``, ``workers``, ``mask_words`` (64 workers a word),
    ``node_capacity``, ``table_slots``, ``max_bytes`` (None: unbounded),
    ``forgotten_pages`` (by the budget, since creation) and ``arrays``
    (bytes by array).

    >>> import radix_soa as rs
    >>> r = rs.RouterIndex(page_size=4, max_bytes=1 << 16).memory_report()
    >>> r["bytes"] <= r["max_bytes"], r["pages"], r["mask_words"]
    (True, 0, 1)
    """
    with self._lock:
        arrays = {"keys": self._keys, "pkeys": self._pkeys, "flags": self._flags,
                  "masks": self._masks, "stamps": self._stamps, "table": self._table,
                  "ehash": self._ehash, "etable": self._etable,
                  "meta": self._meta, "live": self._live, "forgot": self._forgot}
        sizes = {k: int(a.nbytes) for k, a in arrays.items()}
        sizes["handles"] = self._handle_bytes()
        total = sum(sizes.values())
        pages = int(self._meta[router_kernels.X_LIVE])
        return {"bytes": total, "bytes_per_page": total / pages if pages else 0.0,
                "pages": pages, "workers": len(self._order), "mask_words": self._words,
                "node_capacity": int(self._keys.shape[0]),
                "table_slots": int(self._table.shape[0]), "max_bytes": self._max_bytes,
                "forgotten_pages": self._forgotten, "arrays": sizes}


def _memory_bytes(self):
    """The bytes of every array ``memory_report`` counts (no lock taken)."""
    return (sum(int(a.nbytes) for a in (
        self._keys, self._pkeys, self._flags, self._masks, self._stamps, self._table,
        self._ehash, self._etable, self._meta, self._live, self._forgot))
        + self._handle_bytes())


def _handles_of(ks, vs):
    """A handle map holding the entries ``ks`` -> ``vs`` (stored forms)."""
    n = ks.shape[0]
    if n == 0:
        return [_NO_SLOTS, _NO_SLOTS, 0]
    size = 8
    while 4 * n > 3 * size:
        size *= 2
    nk, nv = np.zeros(size, np.uint64), np.zeros(size, np.uint64)
    hx.hx_rebuild(nk, nv, ks, vs)
    return [nk, nv, n]


def _new_handles(self):
    """An empty handle map (``router_keys``): ``[hk, hv, entries]``, no
    slots until a page needs an entry."""
    return [_NO_SLOTS, _NO_SLOTS, 0]


def _handle_room(self, col, new):
    """Column ``col``'s handle map with room for ``new`` more entries
    (load <= 3/4; it doubles from 8 slots)."""
    m = self._hmaps[col]
    hk, hv, n = m
    need = n + new
    if 4 * need <= 3 * hk.shape[0] or new == 0:
        return m
    size = max(8, hk.shape[0])
    while 4 * need > 3 * size:
        size *= 2
    nk, nv = np.zeros(size, np.uint64), np.zeros(size, np.uint64)
    hx.hx_rebuild(nk, nv, hk, hv)
    m[0], m[1] = nk, nv
    return m


def _handle_put(self, col, es, vs):
    """Give column ``col``'s handle map the pairs ``es`` -> ``vs``."""
    m = self._handle_room(col, es.shape[0])
    m[2] += hx.hx_put_all(m[0], m[1], es, vs)


def _handle_note(self, col, es, ks):
    """Column ``col`` now holds the pages of keys ``ks`` under engine
    hashes ``es`` (``hx_note``: entries only where a hash is not the
    page's default)."""
    m = self._hmaps[col]
    change, need = hx.hx_note_room(self._table, self._keys, self._etable, self._ehash, m[0],
                                   m[1], es, ks, m[2])
    if need:
        m = self._handle_room(col, need - m[2])
        change = hx.hx_note(self._table, self._keys, self._etable, self._ehash, m[0], m[1], es,
                            ks)
    m[2] += change


def _handle_del(self, col, es):
    """Drop the entries of ``es`` from column ``col``'s handle map."""
    m = self._hmaps[col]
    m[2] -= hx.hx_del_all(m[0], m[1], es)


def _handle_bytes(self):
    return sum(m[0].nbytes + m[1].nbytes for m in self._hmaps.values())
