"""The router index's page keys from tokens, and each worker's handle map.

A page is keyed by the index's own chained hash of its tokens
(``page_hash``), whatever hash the engine that cached it uses: ``key[i] =
page_hash(fold(key[i - 1], extra[i]), page i)`` from the namespace's seed
(or the parent page's key), where ``extra[i]`` is the hash of the page's
extra keys (0: none; ``fold`` is then the identity). The engine's block hash
is only a handle: per worker, an open-addressing map from the engine's hash
(its low 64 bits) to the page's key, used to resolve ``BlockRemoved`` and
``parent_block_hash``. A page whose engine hash *is* its key (a radix_soa
``PrefixCache``'s own ``fast64`` events) needs no entry: a hash the map
lacks stands for itself.

The map (``hk``, ``hv`` uint64, a power of two long or empty, load <= 3/4,
sized by the class): ``hk`` the engine hash (0 marks an empty slot; a hash
of 0 is stored as ``ZERO``), ``hv`` the key. The class counts the entries
(``hx_put_all`` and ``hx_del_all`` return how many they added or dropped).

Call graph (callers after their callees): fold -> token_keys; _stored;
hx_slot -> hx_key -> hx_keys; hx_put -> hx_put_all, hx_rebuild; hx_del ->
hx_del_all; token_keys, hx_*, rx_classify, _add_one, rx_drop (router) ->
rx_apply_events
"""

import numpy as np

from . import wire
from .chain import page_hash
from .config import kernel, kernel_inner
from .router import C_OK, P_HELD, _add_one, rx_classify, rx_drop
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


@kernel
def hx_key(hk, hv, e):
    """The key of engine hash ``e``: its entry's, or ``e`` itself."""
    if hk.shape[0] == 0:
        return e
    s = _stored(e)
    i = hx_slot(hk, s)
    return hv[i] if hk[i] == s else e


@kernel
def hx_keys(hk, hv, es, out, had):
    """``hx_key`` of each of ``es`` into ``out``; ``had[i]`` 1 if it had an entry."""
    if hk.shape[0] == 0:
        for j in range(es.shape[0]):
            out[j] = es[j]
            had[j] = 0
        return
    for j in range(es.shape[0]):
        s = _stored(es[j])
        i = hx_slot(hk, s)
        if hk[i] == s:
            out[j] = hv[i]
            had[j] = 1
        else:
            out[j] = es[j]
            had[j] = 0


@kernel_inner
def hx_put(hk, hv, e, v):
    """Map engine hash ``e`` to key ``v`` (none needed when equal: any
    entry of ``e`` is dropped); +1 for an entry added, -1 for one dropped,
    else 0. The class made room first (an empty map: only equal pairs)."""
    if e == v:
        return -hx_del(hk, hv, e)
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
def rx_apply_events(table, keys, pkeys, flags, masks, meta, word, bit, hk, hv, seen, ev,
                    hashes, tokens, extras, seeds, page, start, wanted, keys_out, parents_out,
                    hasp_out, had_out, codes, hcount):
    """Apply events ``start..`` of a wire batch (``wire.read_batch``'s
    ``ev``, ``hashes``, ``tokens``; ``extras`` per page, ``seeds`` per
    event, ``wanted`` 0 to skip one) for worker ``(word, bit)`` while each
    applies as it is (a stored run under a parent the worker holds, every
    page new to it; a removal of pages it holds): pages keyed by their
    tokens, the handle map ``hk``/``hv`` kept (``hcount[0]`` += its change).
    What each did goes to ``keys_out`` (its pages' keys), ``parents_out``,
    ``hasp_out`` (a removal's pages' parents), ``had_out`` (1: the handle
    had an entry), so the class can undo it. Returns the first event that
    does not apply as it is (``AllBlocksCleared`` among them: the class
    applies it), or the number of events. The class made room for every
    stored page (nodes, table, handle map)."""
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
                parent = hx_key(hk, hv, np.uint64(ev[e, wire.E_PARENT]))
            else:
                parent = seeds[e]
            x = extras[h0:h0 + hn] if extras.shape[0] > 0 else extras
            token_keys(tokens, ev[e, wire.E_T0], page, parent, x, ks)
            where = rx_classify(table, keys, pkeys, flags, masks, word, bit, ks, parent, hasp,
                                True, cs, sc)
            if where != P_HELD:
                return e
            for j in range(hn):
                if cs[j] != C_OK:
                    return e
            before, hp = parent, np.int8(1 if hasp else 0)
            for j in range(hn):
                _add_one(table, keys, pkeys, flags, masks, meta, word, bit, ks[j], before, hp)
                before, hp = ks[j], np.int8(1)
                if eh[j] != ks[j]:
                    hcount[0] += hx_put(hk, hv, eh[j], ks[j])
        else:
            hx_keys(hk, hv, eh, ks, had_out[h0:h0 + hn])
            rx_classify(table, keys, pkeys, flags, masks, word, bit, ks, np.uint64(0), False,
                        False, cs, sc)
            for j in range(hn):
                if cs[j] != C_OK:
                    return e
            rx_drop(table, keys, pkeys, flags, masks, meta, word, bit, ks,
                    parents_out[h0:h0 + hn], hasp_out[h0:h0 + hn])
            hcount[0] -= hx_del_all(hk, hv, eh)
    return n
