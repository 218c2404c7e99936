"""The router index (``RouterIndex``): one node per cached page of any
worker, keyed by the page's chained hash (``chain``), with the set of
workers holding it as a bitmask row (64 workers a word).

Arrays (allocated and grown by the class): ``keys`` uint64 per node (its
page hash; for a free node, the next free id), ``pkeys`` uint64 (the hash
of the page before it; empty when keyed by tokens: a key names its parent),
``flags`` int8 (-1 free, 0 a first page, 1 a page with a parent), ``masks``
int64 ``[node, word]`` (bit ``c % 64`` of word ``c // 64``: worker column
``c`` holds the page), ``table`` int32 open-addressing slots (a power of
two) keyed by the hash itself (already mixed), -1 empty, ``meta``
int64 (``X_*`` slots), ``ehash``/``etable`` (empty until an engine names
pages by hashes of its own: per node the engine hash of its first holder,
and slots as ``table``'s keyed by ``mix64`` of it; see ``router_keys``),
``stamps`` int64 (a budgeted index only, else empty): per node the tick a
query last walked it or a store last touched it, the clock in the last
element. Mutation kernels assume the class made room first (``X_LIVE`` +
the new nodes within the arrays, the tables under the load limit).

Call graph (callers after their callees): _home, _next -> _find_from -> rx_find,
_shift_delete -> _table_delete, _etable_delete; _etable_put -> rx_table_rebuild;
rx_classify (an event's pages: to add, held, unknown ...); _add_one ->
rx_add; rx_store (rx_classify, _add_one), rx_remove (rx_classify,
rx_drop): the common event in one call; rx_drop, rx_clear, rx_forget (the
byte budget); overlap_at
(page_hash, prefetch, the budget's stamps) -> rx_overlap, rx_overlap_batch
(RouterIndex)
"""

import numpy as np

from .chain import page_hash
from .config import kernel, kernel_helper, kernel_inner, kernel_nogil
from .prefetch import prefetch
from .table import mix64

X_END = 0    # high-water mark of node ids
X_FREE = 1   # first free node id, or -1
X_LIVE = 2   # live nodes
X_SIZE = 4
# the budget's clock advances a tick per query or stored run; page i of one
# is stamped i below it, so of pages a query (or a run) last touched the
# deepest go first and a page outlives what hangs under it
TICK = 1 << 16
GROUP = 16   # pages an overlap walk hashes and prefetches at a time
SEEN_ZERO = np.uint64(0x9E3779B97F4A7C15)  # a hash of 0 in rx_classify's scratch set

# what rx_classify gives each hash of an event
C_OK = 0         # stored: a page to add; removed: a page the worker holds
C_HELD = 1       # stored: held by the worker already (or earlier in the run)
C_MISMATCH = 2   # stored: known under another parent
C_ABSENT = 3     # removed: no worker holds it (never stored, or forgotten)
C_UNHELD = 4     # removed: other workers hold it, this one not
C_REPEAT = 5     # removed: earlier in the same event
P_HELD = 0       # a stored run's parent: held by the worker, or none
P_ABSENT = 1     # held by no worker (never stored, or forgotten)
P_OTHERS = 2     # held by other workers only


@kernel_helper
def _home(h, nslots):
    """The home slot of mixed hash ``h`` in ``nslots`` slots (a power of
    two: its low bits; a multiply-shift for any size cost overlap 4-10%)."""
    return np.int64(h & np.uint64(nslots - 1))


@kernel_helper
def _next(i, nslots):
    """The slot after ``i`` (linear probing, wrapping)."""
    return (i + 1) & (nslots - 1)


@kernel_inner
def rx_find(table, keys, h):
    """The live node of hash ``h``, or -1 (the table holds live nodes only)."""
    return _find_from(table, keys, h, _home(h, table.shape[0]))


@kernel_inner
def _find_from(table, keys, h, i):  # rx_find from slot i, the home of h
    nslots = table.shape[0]
    while True:
        v = table[i]
        if v < 0:
            return -1
        if keys[v] == h:
            return v
        i = _next(i, nslots)


@kernel_inner
def _table_delete(table, keys, v):
    """Remove node ``v`` from the table (backward-shift deletion)."""
    _shift_delete(table, keys, v, False)


@kernel_inner
def _shift_delete(tab, hashes, v, mixed):
    """Remove node ``v`` from ``tab``, slots keyed by ``hashes`` (``mix64``
    of them if ``mixed``): backward-shift deletion, no tombstones."""
    nslots = tab.shape[0]
    i = _home(mix64(hashes[v]) if mixed else hashes[v], nslots)
    while tab[i] != v:
        i = _next(i, nslots)
    j = i
    while True:
        j = _next(j, nslots)
        c = tab[j]
        if c < 0:
            break
        home = _home(mix64(hashes[c]) if mixed else hashes[c], nslots)
        if i <= j:
            movable = home <= i or home > j
        else:
            movable = home <= i and home > j
        if movable:
            tab[i] = c
            i = j
    tab[i] = -1


@kernel
def rx_table_rebuild(table, keys, flags, end, etable, ehash):
    """Fill ``table`` and ``etable`` (all -1; if ``ehash`` is not empty)
    with every live node below ``end``."""
    nslots = table.shape[0]
    both = ehash.shape[0] > 0
    for v in range(end):
        if flags[v] >= 0:
            i = _home(keys[v], nslots)
            while table[i] >= 0:
                i = _next(i, nslots)
            table[i] = v
            if both:
                _etable_put(etable, ehash, v)

@kernel_inner
def _etable_put(etable, ehash, v):  # (the table is not full: load <= 3/4)
    nslots = etable.shape[0]
    j = _home(mix64(ehash[v]), nslots)
    while etable[j] >= 0:
        j = _next(j, nslots)
    etable[j] = v


@kernel_inner
def _etable_delete(etable, ehash, v):
    _shift_delete(etable, ehash, v, True)


@kernel_inner
def _held(masks, v, word, bit):
    return (masks[v, word] & bit) != 0


@kernel_inner
def _add_one(table, keys, pkeys, flags, masks, meta, etable, ehash, word, bit, h, before, hasp,
             e):
    """Give worker ``(word, bit)`` page ``h`` (after page ``before`` if
    ``hasp``; engine hash ``e``, kept when ``ehash`` is not empty), making
    its node if it is not there; the node."""
    v = rx_find(table, keys, h)
    if v < 0:
        v = meta[X_FREE]
        if v >= 0:
            meta[X_FREE] = np.int64(keys[v])
        else:
            v = meta[X_END]
            meta[X_END] = v + 1
        keys[v] = h
        if pkeys.shape[0] > 0:
            pkeys[v] = before
        flags[v] = hasp
        if ehash.shape[0] > 0:
            ehash[v] = e
            _etable_put(etable, ehash, v)
        for w in range(masks.shape[1]):
            masks[v, w] = 0
        nslots = table.shape[0]
        j = _home(h, nslots)
        while table[j] >= 0:
            j = _next(j, nslots)
        table[j] = v
        meta[X_LIVE] += 1
    masks[v, word] |= bit
    return v


@kernel_inner
def _tick(stamps):
    """The budget's clock, advanced a ``TICK`` (0 without a budget)."""
    if stamps.shape[0] == 0:
        return np.int64(0)
    clock = stamps[stamps.shape[0] - 1] + TICK
    stamps[stamps.shape[0] - 1] = clock
    return clock


@kernel
def rx_add(table, keys, pkeys, flags, masks, meta, etable, ehash, word, bit, hashes, parents,
           hasp, ehs, stamps):
    """Give worker ``(word, bit)`` the pages ``hashes`` (the page before
    each in ``parents``, ``hasp`` 1 if it has one, the engine hash of each
    in ``ehs``: used when ``ehash`` is not empty), making the nodes not
    there yet, and stamping them (``stamps`` not empty: see ``TICK``).
    Unchecked: ``rx_classify`` first."""
    clock = _tick(stamps)
    for i in range(hashes.shape[0]):
        v = _add_one(table, keys, pkeys, flags, masks, meta, etable, ehash, word, bit, hashes[i],
                     parents[i], hasp[i], ehs[i] if ehs.shape[0] > 0 else hashes[i])
        if stamps.shape[0] > 0:
            stamps[v] = clock - min(i, TICK - 1)


@kernel_inner
def _seen_add(seen, h):
    """Put ``h`` in the scratch set ``seen`` (open addressing, 0 empty);
    True if it was there already."""
    k = h if h != 0 else SEEN_ZERO
    mask = seen.shape[0] - 1
    i = np.int64(mix64(k) & np.uint64(mask))
    while True:
        v = seen[i]
        if v == k:
            return True
        if v == 0:
            seen[i] = k
            return False
        i = (i + 1) & mask


@kernel_inner
def _seen_clear(seen, hashes):
    """Empty ``seen`` of ``hashes`` again: the run of slots from each one's
    home to the first empty slot (it holds the hash, whatever was emptied
    before), so the cost follows the hashes, not the scratch's size."""
    mask = seen.shape[0] - 1
    for j in range(hashes.shape[0]):
        h = hashes[j]
        k = h if h != 0 else SEEN_ZERO
        i = np.int64(mix64(k) & np.uint64(mask))
        while seen[i] != 0:
            seen[i] = 0
            i = (i + 1) & mask


@kernel
def rx_classify(table, keys, pkeys, flags, masks, word, bit, hashes, parent, has_parent,
                stored, codes, seen):
    """A ``C_*`` code per hash of a stored run after ``parent``
    (``stored``) or of a removal, into ``codes``; returns, for a stored
    run, ``P_HELD`` if the worker holds its parent (or it has none),
    ``P_ABSENT`` if no worker holds the parent, ``P_OTHERS`` if others do
    but not this worker (for a removal, ``P_HELD``). ``seen``: an empty
    scratch set of at least twice the hashes (a power of two; left empty),
    finding a hash repeated in the event in O(1); empty for one hash."""
    n = hashes.shape[0]
    track = seen.shape[0] > 0
    for i in range(n):
        h = hashes[i]
        v = rx_find(table, keys, h)
        repeat = track and _seen_add(seen, h)
        if stored:
            hasp = has_parent or i > 0
            before = parent if i == 0 else hashes[i - 1]
            if repeat or (v >= 0 and _held(masks, v, word, bit)):
                codes[i] = C_HELD
            elif v >= 0 and ((flags[v] == 1) != hasp or (
                    hasp and pkeys.shape[0] > 0 and pkeys[v] != before)):
                codes[i] = C_MISMATCH
            else:
                codes[i] = C_OK
        elif repeat:
            codes[i] = C_REPEAT
        elif v < 0:
            codes[i] = C_ABSENT
        elif not _held(masks, v, word, bit):
            codes[i] = C_UNHELD
        else:
            codes[i] = C_OK
    if track:
        _seen_clear(seen, hashes)
    if not (stored and has_parent):
        return P_HELD
    p = rx_find(table, keys, parent)
    if p < 0:
        return P_ABSENT
    return P_HELD if _held(masks, p, word, bit) else P_OTHERS


@kernel
def rx_store(table, keys, pkeys, flags, masks, meta, etable, ehash, word, bit, hashes, ehs,
             parent, has_parent, stamps, codes, seen):
    """The common stored run in one call: ``rx_classify`` it and, when the
    worker holds its parent and every page is ``C_OK``, add it
    (``rx_add``; ``ehs`` their engine hashes, or empty: their keys; room
    made first). Returns ``(parent status, index of the
    first page not C_OK or -1)``; anything but ``(P_HELD, -1)`` changed
    nothing."""
    where = rx_classify(table, keys, pkeys, flags, masks, word, bit, hashes, parent, has_parent,
                        True, codes, seen)
    n = hashes.shape[0]
    for i in range(n):
        if codes[i] != C_OK:
            return where, i
    if where != P_HELD:
        return where, -1
    clock = _tick(stamps)
    before, hasp = parent, np.int8(1 if has_parent else 0)
    for i in range(n):
        v = _add_one(table, keys, pkeys, flags, masks, meta, etable, ehash, word, bit, hashes[i],
                     before, hasp, ehs[i] if ehs.shape[0] > 0 else hashes[i])
        if stamps.shape[0] > 0:
            stamps[v] = clock - min(i, TICK - 1)
        before, hasp = hashes[i], np.int8(1)
    return where, -1


@kernel
def rx_remove(table, keys, pkeys, flags, masks, meta, etable, ehash, word, bit, hashes, codes,
              parents, hasp, ehs, seen):
    """The common removal in one call: ``rx_classify`` it and, when the
    worker holds every page, take them (``rx_drop``, their parents to
    ``parents``/``hasp``, their engine hashes to ``ehs``). Returns the index of the first page not
    ``C_OK`` (nothing changed), or -1."""
    rx_classify(table, keys, pkeys, flags, masks, word, bit, hashes, np.uint64(0), False, False,
                codes, seen)
    for i in range(hashes.shape[0]):
        if codes[i] != C_OK:
            return i
    rx_drop(table, keys, pkeys, flags, masks, meta, etable, ehash, word, bit, hashes, parents,
            hasp, ehs)
    return -1


@kernel
def rx_forget(table, keys, flags, masks, meta, etable, ehash, victims, forgot):
    """Forget the live nodes ``victims`` for every worker (the budget),
    counting per worker column in ``forgot`` the pages it held."""
    for i in range(victims.shape[0]):
        v = victims[i]
        for w in range(masks.shape[1]):
            m = masks[v, w]
            if m != 0:
                for j in range(64):
                    if (m >> j) & 1:
                        forgot[w * 64 + j] += 1
                masks[v, w] = 0
        _release(table, keys, flags, masks, meta, etable, ehash, v)


@kernel_inner
def _release(table, keys, flags, masks, meta, etable, ehash, v):
    """Free node ``v`` if no worker holds it any more."""
    for w in range(masks.shape[1]):
        if masks[v, w] != 0:
            return
    _table_delete(table, keys, v)
    if ehash.shape[0] > 0:
        _etable_delete(etable, ehash, v)
    flags[v] = -1
    keys[v] = np.uint64(meta[X_FREE])
    meta[X_FREE] = v
    meta[X_LIVE] -= 1


@kernel
def rx_drop(table, keys, pkeys, flags, masks, meta, etable, ehash, word, bit, hashes, parents,
            hasp, ehs):
    """Take the pages ``hashes`` from worker ``(word, bit)`` (unchecked:
    ``rx_classify`` first), writing each one's parent to ``parents`` /
    ``hasp`` and its engine hash to ``ehs`` (to undo it with ``rx_add``)."""
    for i in range(hashes.shape[0]):
        v = rx_find(table, keys, hashes[i])
        parents[i] = pkeys[v] if pkeys.shape[0] > 0 else 0
        hasp[i] = flags[v]
        ehs[i] = ehash[v] if ehash.shape[0] > 0 else hashes[i]
        masks[v, word] &= ~bit
        _release(table, keys, flags, masks, meta, etable, ehash, v)


@kernel
def rx_clear(table, keys, pkeys, flags, masks, meta, etable, ehash, word, bit, out, parents,
             hasp, ehs):
    """Take every page from worker ``(word, bit)``, what it held to ``out``
    / ``parents`` / ``hasp`` / ``ehs`` (``X_LIVE`` long); how many."""
    n = 0
    for v in range(meta[X_END]):
        if flags[v] >= 0 and _held(masks, v, word, bit):
            out[n] = keys[v]
            parents[n] = pkeys[v] if pkeys.shape[0] > 0 else 0
            hasp[n] = flags[v]
            ehs[n] = ehash[v] if ehash.shape[0] > 0 else keys[v]
            n += 1
    for i in range(n):
        v = rx_find(table, keys, out[i])
        masks[v, word] &= ~bit
        _release(table, keys, flags, masks, meta, etable, ehash, v)
    return n


@kernel
def rx_overlap(table, keys, masks, q, page, seed, live, res, hkeys, stamps):
    """``overlap_at`` of all of ``q``."""
    overlap_at(table, keys, masks, q, 0, q.shape[0], page, seed, live, res, hkeys, stamps)


@kernel_inner
def overlap_at(table, keys, masks, q, qs, qn, page, seed, live, res, hkeys, stamps):
    """Per worker column, the leading whole-page tokens of ``q[qs:qs+qn]`` it
    holds, into ``res`` (``65 * words + 2 * GROUP`` int64: the 64 columns of each
    word of ``live``, a word of scratch per word, the group's scratch). The
    keys: the chained ``page_hash`` from ``seed``, or ``hkeys`` if not empty
    (``sha256_cbor``, hashed by the caller). ``GROUP`` pages at a time: their
    hashes and home slots (prefetched), each slot's node (key and mask row
    prefetched), then the walk, so a large index's misses overlap. With
    ``stamps`` (not empty) the clock ticks and each page found is stamped
    (``TICK``). ``rx_overlap_batch`` runs beside other readers: two may race
    on a stamp or the clock, leaving a page a few ticks older, never an
    answer wrong."""
    words = masks.shape[1]
    stamped = stamps.shape[0] > 0
    clock = np.int64(0)
    if stamped:
        clock = stamps[stamps.shape[0] - 1] + TICK
        stamps[stamps.shape[0] - 1] = clock
    alive = res[64 * words:65 * words]
    group = res[65 * words:65 * words + GROUP]     # the group's page hashes (bits)
    found = res[65 * words + GROUP:65 * words + 2 * GROUP]  # and their nodes
    left = 0
    for w in range(words):
        alive[w] = live[w]
        left |= live[w]
    h = seed
    npages = qn // page
    given = hkeys.shape[0] > 0
    nslots = table.shape[0]
    i = 0
    while i < npages and left != 0:
        g = min(GROUP, npages - i)
        for j in range(g):
            h = hkeys[i + j] if given else page_hash(h, q, qs + (i + j) * page, page)
            group[j] = np.int64(h)
            found[j] = _home(h, nslots)
            prefetch(table, found[j])
        for j in range(g):
            c = table[found[j]]
            if c >= 0:
                prefetch(keys, c)
                prefetch(masks[c], 0)
        for j in range(g):
            found[j] = _find_from(table, keys, np.uint64(group[j]), found[j])
        for j in range(g):
            v = found[j]
            if v < 0:
                left = 0
                break
            if stamped:
                stamps[v] = clock - min(i, TICK - 1)
            left = 0
            for w in range(words):
                a = alive[w]
                if a != 0:
                    m = a & masks[v, w]
                    _set_bits(res, w, a & ~m, i * page)
                    alive[w] = m
                    left |= m
            if left == 0:
                break
            i += 1
    for w in range(words):
        _set_bits(res, w, alive[w], i * page)


@kernel_inner
def _set_bits(res, w, bits, value):
    if bits != 0:
        for j in range(64):
            if (bits >> j) & 1:
                res[w * 64 + j] = value


@kernel_nogil
def rx_overlap_batch(table, keys, masks, flat, offsets, page, seed, live, res, hkeys, stamps):
    """``overlap_at`` of every sequence of a CSR batch into row i of ``res``
    (``hkeys`` empty: the page hash)."""
    for i in range(offsets.shape[0] - 1):
        overlap_at(table, keys, masks, flat, offsets[i], offsets[i + 1] - offsets[i], page,
                   seed, live, res[i], hkeys, stamps)
