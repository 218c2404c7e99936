"""The router index's page keys from tokens, and each worker's handle map.

A page is keyed by the index's own chained hash of its tokens
(``page_hash``), whatever hash the engine that cached it uses: ``key[i] =
page_hash(fold(key[i - 1], extra[i]), page i)`` from the namespace's seed
(or the parent page's key), where ``extra[i]`` is the hash of the page's
extra keys (0: none; ``fold`` is then the identity). The engine's block hash
(its low 64 bits) is only a handle, used to resolve ``BlockRemoved`` and
``parent_block_hash``, kept where it costs least:

- per node, the engine hash of its first holder (``ehash``, with ``etable``
  to find a node by it: ``router``): every worker whose engines share a
  hash seed (vLLM's ``sha256_cbor``, or ``PYTHONHASHSEED`` set) names a page
  by that one hash and needs nothing more;
- per worker, an entry in its handle map for each page it names otherwise
  (engines of their own random seed: vLLM's default ``NONE_HASH``), the
  engine hash to the page's key;
- before any engine hash differs from a key (a radix_soa ``PrefixCache``'s
  own ``fast64`` events: the engine hash *is* the key) ``ehash`` and
  ``etable`` are empty and a hash stands for itself.

So a worker's hash ``e`` resolves to: its map's entry, else the node whose
``ehash`` is ``e``, else ``e`` itself (``hx_resolve``); a worker holding a
page has an entry for it exactly when its hash of the page is not the
page's default (``ehash``, or its key while ``ehash`` is empty:
``hx_note``). Every lookup compares whole 64-bit hashes: a false match
needs two different 64-bit hashes to be equal, the risk the keys take.

The map (``hk``, ``hv`` uint64, a power of two long or empty, load <= 3/4,
sized by the class): ``hk`` the engine hash (0 marks an empty slot; a hash
of 0 is stored as ``ZERO``), ``hv`` the key. The class counts the entries
(``hx_put_all``, ``hx_note`` and ``hx_del_all`` return how many they added
or dropped).

Call graph (callers after their callees): fold -> token_keys; _stored;
hx_slot -> hx_resolve (router's _home, _next, rx_find) -> hx_key, hx_keys;
hx_put -> hx_put_all, hx_rebuild; hx_del -> hx_del_all, _note_one ->
hx_note; hx_need, hx_note -> hx_note_room; token_keys, hx_*, rx_classify,
_add_one, rx_drop (router) -> rx_apply_events
"""

import numpy as np

from . import wire
from .chain import page_hash
from .config import kernel, kernel_inner
from .router import (C_OK, P_HELD, TICK, _add_one, _home, _next, _tick, rx_classify,
                     rx_drop, rx_find)
from .table import mix64

ZERO = np.uint64(0x9E3779B97F4A7C15)  # the stored form of an engine hash of 0


@kernel
def fold(h, x):
    """``h`` with extra-key hash ``x`` folded in (``x == 0``: ``h``)."""
    if x == 0:
        return h
    return mix64(h ^ mix64(x))


@kernel
def token_keys(tokens, ts, page, prev, extras, out):
    """The keys of the ``out.shape[0]`` pages of ``tokens[ts:]`` after a
    page of key ``prev`` (or from a namespace seed), ``extras`` per page
    (empty: none)."""
    has_x = extras.shape[0] > 0
    for i in range(out.shape[0]):
        if has_x:
            prev = fold(prev, extras[i])
        prev = page_hash(prev, tokens, ts + i * page, page)
        out[i] = prev


@kernel_inner
def _stored(e):
    return ZERO if e == 0 else e


@kernel_inner
def hx_slot(hk, e):
    """The slot of engine hash ``e`` (stored form), or of the empty slot
    where it would go."""
    mask = hk.shape[0] - 1
    i = np.int64(mix64(e) & np.uint64(mask))
    while True:
        k = hk[i]
        if k == e or k == 0:
            return i
        i = (i + 1) & mask


@kernel_inner
def hx_resolve(hk, hv, etable, ehash, table, keys, masks, word, bit, e):
    """``(key, had)`` of worker ``(word, bit)``'s engine hash ``e``: its
    map's entry (had 1), else the key of a node whose engine hash is ``e``
    or whose key is ``e`` (one the worker holds first: an engine hash equal
    to another page's key or engine hash names the worker's own page),
    else ``e``."""
    if hk.shape[0] > 0:
        s = _stored(e)
        i = hx_slot(hk, s)
        if hk[i] == s:
            return hv[i], 1
    if etable.shape[0] == 0:
        return e, 0
    first = -1
    nslots = etable.shape[0]
    i = _home(mix64(e), nslots)
    while etable[i] >= 0:
        v = etable[i]
        if ehash[v] == e:
            if (masks[v, word] & bit) != 0:
                return keys[v], 0
            if first < 0:
                first = v
        i = _next(i, nslots)
    v = rx_find(table, keys, e)
    if v >= 0 and ((masks[v, word] & bit) != 0 or first < 0):
        return e, 0
    return (keys[first] if first >= 0 else e), 0


@kernel
def hx_key(hk, hv, etable, ehash, table, keys, masks, word, bit, e):
    """The key of a worker's engine hash ``e`` (``hx_resolve``)."""
    return hx_resolve(hk, hv, etable, ehash, table, keys, masks, word, bit, e)[0]


@kernel
def hx_keys(hk, hv, etable, ehash, table, keys, masks, word, bit, es, out, had):
    """``hx_resolve`` of each of ``es`` into ``out`` / ``had``."""
    for j in range(es.shape[0]):
        k, h = hx_resolve(hk, hv, etable, ehash, table, keys, masks, word, bit, es[j])
        out[j] = k
        had[j] = h


@kernel
def hx_note(table, keys, etable, ehash, hk, hv, es, ks):
    """A worker now holds the pages of keys ``ks`` under its engine hashes
    ``es``: an entry for each hash that is not its page's default (the
    node's ``ehash``, or its key while ``ehash`` is empty), any entry of the
    others dropped. The change in the number of entries; the class made
    room for ``es.shape[0]`` more."""
    n = 0
    for j in range(es.shape[0]):
        n += _note_one(hk, hv, ehash, rx_find(table, keys, ks[j]), es[j], ks[j])
    return n


@kernel
def hx_note_room(table, keys, etable, ehash, hk, hv, es, ks, count):
    """``hx_note`` when the map (``count`` entries) has room for what it
    adds: ``(change, 0)``; else nothing changed and ``(0, entries needed)``."""
    if 4 * (count + es.shape[0]) > 3 * hk.shape[0]:
        need = count + hx_need(table, keys, ehash, hk, hv, es, ks, False)
        if 4 * need > 3 * hk.shape[0]:
            return 0, need
    return hx_note(table, keys, etable, ehash, hk, hv, es, ks), 0


@kernel_inner
def hx_need(table, keys, ehash, hk, hv, es, ks, fresh):
    """The entries ``hx_note`` of ``es``/``ks`` would add (an upper bound:
    a page stored twice in ``ks`` counts twice); ``fresh``: before the
    pages are added (a page without a node yet takes its hash as its own)."""
    n = 0
    for j in range(es.shape[0]):
        v = rx_find(table, keys, ks[j])
        default = ks[j]
        if v >= 0 and ehash.shape[0] > 0:
            default = ehash[v]
        elif v < 0 and fresh and ehash.shape[0] > 0:
            default = es[j]  # a new node takes this hash as its own
        if es[j] != default:
            if hk.shape[0] == 0:
                n += 1
            else:
                s = _stored(es[j])
                if hk[hx_slot(hk, s)] != s:
                    n += 1
    return n


@kernel_inner
def _note_one(hk, hv, ehash, v, e, k):
    """``hx_note`` of one page (key ``k``, node ``v`` or -1)."""
    default = ehash[v] if ehash.shape[0] > 0 and v >= 0 else k
    if e == default:
        return -hx_del(hk, hv, e)
    return hx_put(hk, hv, e, k)


@kernel_inner
def hx_put(hk, hv, e, v):
    """Map engine hash ``e`` to key ``v``; 1 for an entry added, else 0
    (one replaced). The class made room first."""
    s = _stored(e)
    i = hx_slot(hk, s)
    hv[i] = v
    if hk[i] == 0:
        hk[i] = s
        return 1
    return 0


@kernel
def hx_put_all(hk, hv, es, vs):
    """``hx_put`` of each pair; the change in the number of entries."""
    n = 0
    for j in range(es.shape[0]):
        n += hx_put(hk, hv, es[j], vs[j])
    return n


@kernel_inner
def hx_del(hk, hv, e):
    """Drop the entry of engine hash ``e``, if any (backward-shift
    deletion); 1 if there was one."""
    if hk.shape[0] == 0:
        return 0
    s = _stored(e)
    i = hx_slot(hk, s)
    if hk[i] == 0:
        return 0
    mask = hk.shape[0] - 1
    j = i
    while True:
        j = (j + 1) & mask
        k = hk[j]
        if k == 0:
            break
        home = np.int64(mix64(k) & np.uint64(mask))
        if i <= j:
            movable = home <= i or home > j
        else:
            movable = home <= i and home > j
        if movable:
            hk[i] = k
            hv[i] = hv[j]
            i = j
    hk[i] = 0
    return 1


@kernel
def hx_del_all(hk, hv, es):
    """``hx_del`` of each of ``es``; how many entries it dropped."""
    n = 0
    for j in range(es.shape[0]):
        n += hx_del(hk, hv, es[j])
    return n


@kernel
def hx_rebuild(hk, hv, ok, ov):
    """Fill the empty map ``hk``/``hv`` with the entries of ``ok``/``ov``."""
    for j in range(ok.shape[0]):
        k = ok[j]
        if k != 0:
            i = hx_slot(hk, k)
            hk[i] = k
            hv[i] = ov[j]


@kernel
def rx_apply_events(table, keys, pkeys, flags, masks, meta, etable, ehash, word, bit, hk, hv,
                    seen, ev, hashes, tokens, extras, seeds, page, start, wanted, keys_out,
                    parents_out, hasp_out, ehs_out, had_out, codes, hcount, stamps, pend):
    """Apply events ``start..`` of a wire batch (``wire.read_batch``'s
    ``ev``, ``hashes``, ``tokens``; ``extras`` per page, ``seeds`` per
    event, ``wanted`` 0 to skip one) for worker ``(word, bit)`` while each
    applies as it is (a stored run under a parent the worker holds, every
    page new to it; a removal of pages it holds): pages keyed by their
    tokens, the handles kept (``hx_note``; ``hcount[0]`` the map's entries,
    kept; an entry the map has no room for is left to the class: the
    event's pages of them to ``pend`` and their number to ``hcount[1]``,
    and the kernel returns after that event), stored runs stamped (``stamps`` not empty: the budget). What
    each did goes to ``keys_out`` (its pages' keys), ``parents_out``,
    ``hasp_out``, ``ehs_out`` (a removal's pages' parents and engine
    hashes), ``had_out`` (1: the handle had an entry), so the class can
    undo it. Returns the first event that does not apply as it is
    (``AllBlocksCleared`` among them, and the first page whose engine hash
    is not its key while ``ehash`` is empty: the class applies those), or
    the number of events. The class made room for every stored page
    (nodes, table, handle map)."""
    n = ev.shape[0]
    for e in range(start, n):
        if wanted[e] == 0:
            continue
        kind = ev[e, wire.E_KIND]
        if kind == wire.K_CLEARED:
            return e
        h0, hn = ev[e, wire.E_H0], ev[e, wire.E_HN]
        eh = hashes[h0:h0 + hn]
        ks = keys_out[h0:h0 + hn]
        cs = codes[h0:h0 + hn]
        sc = seen if hn > 1 else seen[:0]
        if kind == wire.K_STORED:
            hasp = ev[e, wire.E_HASP] == 1
            if hasp:
                parent = hx_key(hk, hv, etable, ehash, table, keys, masks, word, bit,
                                np.uint64(ev[e, wire.E_PARENT]))
            else:
                parent = seeds[e]
            x = extras[h0:h0 + hn] if extras.shape[0] > 0 else extras
            token_keys(tokens, ev[e, wire.E_T0], page, parent, x, ks)
            if ehash.shape[0] == 0:
                for j in range(hn):
                    if eh[j] != ks[j]:
                        return e
            where = rx_classify(table, keys, pkeys, flags, masks, word, bit, ks, parent, hasp,
                                True, cs, sc)
            if where != P_HELD:
                return e
            for j in range(hn):
                if cs[j] != C_OK:
                    return e
            clock = _tick(stamps)
            pending = 0
            before, hp = parent, np.int8(1 if hasp else 0)
            for j in range(hn):
                v = _add_one(table, keys, pkeys, flags, masks, meta, etable, ehash, word, bit,
                             ks[j], before, hp, eh[j])
                if stamps.shape[0] > 0:
                    stamps[v] = clock - min(j, TICK - 1)
                before, hp = ks[j], np.int8(1)
                if eh[j] == (ehash[v] if ehash.shape[0] > 0 else ks[j]):
                    continue  # the page's default: no entry (a page new to the worker had none)
                if 4 * (hcount[0] + 1) > 3 * hk.shape[0]:  # no room: the class puts it
                    pend[pending] = j
                    pending += 1
                else:
                    hcount[0] += hx_put(hk, hv, eh[j], ks[j])
            if pending > 0:
                hcount[1] = pending
                return e + 1
        else:
            hx_keys(hk, hv, etable, ehash, table, keys, masks, word, bit, eh, ks,
                    had_out[h0:h0 + hn])
            rx_classify(table, keys, pkeys, flags, masks, word, bit, ks, np.uint64(0), False,
                        False, cs, sc)
            for j in range(hn):
                if cs[j] != C_OK:
                    return e
            rx_drop(table, keys, pkeys, flags, masks, meta, etable, ehash, word, bit, ks,
                    parents_out[h0:h0 + hn], hasp_out[h0:h0 + hn], ehs_out[h0:h0 + hn])
            hcount[0] -= hx_del_all(hk, hv, eh)
    return n
