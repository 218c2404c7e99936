"""The KV events of ``PrefixCache`` (``events=True``): ``take_events``,
``snapshot_events`` and the helpers that read the cache's arrays for them
(a snapshot's runs, the room a call's log needs, ``drop_namespace`` with
events). The queue itself is ``radix_soa._events.event_log.EventLog``."""

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

import numpy as np

from .._events.block_hash import block_hashes, check_event_hash, none_hash
from .._events.event_log import log_size
from .._events.kv_events import BlockStored, namespace_seed
from .._kernels import prefix as prefix_kernels
from .._kernels import snapshot as snapshot_kernels
from .._kernels.layout import M_INFLIGHT, M_LOCKED_TOKENS, M_TOKENS

if TYPE_CHECKING:
    from .core import PrefixCache

__all__ = ["log_size", "begin_log_size", "drop_subtree", "snapshot"]


def take_events(self: "PrefixCache") -> List[Any]:
    """The KV events queued since the last call, oldest first, and the
    queue emptied: ``BlockStored`` for each new run of whole pages an
    insert (or ``checkpoint``/``finish``) cached, ``BlockRemoved`` for
    each run eviction, ``evict`` or ``drop_namespace`` removed, and
    ``AllBlocksCleared`` at ``reset``. Page hashes are chained from the
    namespace's seed (``radix_soa._kernels.chain``), so the same tokens
    in the same namespace hash alike on every cache; ``RouterIndex``
    rebuilds what each cache holds from them. A match (even one that
    splits a node) changes no pages and queues nothing. A loaded,
    unpickled or copied cache starts with events off. An exception
    during the call (``KeyboardInterrupt``, ``MemoryError``) loses no
    event: the next call returns them (``tests/test_faults.py``).

    >>> from radix_soa import PrefixCache
    >>> pc = PrefixCache(capacity=4, page_size=2, events=True)
    >>> _ = pc.insert([1, 2, 3, 4], values=[0, 0, 0, 0])
    >>> _ = pc.insert([5, 6, 7], values=[0, 0, 0])  # evicts [3, 4]
    >>> [type(e).__name__ for e in pc.take_events()]
    ['BlockStored', 'BlockRemoved', 'BlockStored']
    >>> pc.take_events()
    []
    """
    if self._events is None:
        raise ValueError("this cache queues no events; make it with events=True")
    out = None
    try:
        with self._writing:
            out = self._events.take()
        return out
    except BaseException:
        # an exception (KeyboardInterrupt, MemoryError) after the take
        # emptied the queue but before the events reached the caller:
        # they go back, first, for the next call
        if out is not None:
            with self._writing:
                self._events.hold(out)
        raise


def snapshot_events(self: "PrefixCache", event_hash: Optional[str] = None,
                    event_hash_seed: Union[str, bytes, None] = None) -> List[Any]:
    """Every whole page the cache holds now, as ``BlockStored`` events
    (one run per node, a parent's run before its children's) with the
    hashes ``take_events`` gives those pages: what a router applies
    (``RouterIndex.apply_snapshot``) to know this cache exactly again
    after a restart or a lost event. The event queue is left as it is;
    the snapshot already holds what the queued events do, so take
    (and drop) those first, then snapshot, then apply what comes after.

    A cache with ``events=True`` hashes as its events do (passing
    another ``event_hash`` is a ``ValueError``). Any other cache can
    snapshot too, its pages hashed with ``event_hash`` (``"fast64"`` by
    default; ``"sha256_cbor"`` with ``event_hash_seed``, the engines'
    ``PYTHONHASHSEED``).

    >>> from radix_soa import PrefixCache
    >>> pc = PrefixCache(page_size=2, values=False)
    >>> _ = pc.insert([1, 2, 3, 4, 5]); _ = pc.insert([1, 2, 7, 8])
    >>> [(len(e.block_hashes), e.parent_block_hash is None, e.token_ids)
    ...  for e in pc.snapshot_events()]
    [(1, True, [1, 2]), (1, False, [3, 4]), (1, False, [7, 8])]
    """
    if event_hash is not None:
        check_event_hash(event_hash)
    if self._events is not None:
        mine = "fast64" if self._events.seed is None else "sha256_cbor"
        if event_hash not in (None, mine):
            raise ValueError(f"event_hash: this cache's events use {mine!r}; got "
                             f"{event_hash!r}")
        if event_hash_seed is not None:
            raise ValueError("event_hash_seed: this cache's events have their seed already")
        seed = self._events.seed
    else:
        seed = none_hash(event_hash_seed) if event_hash == "sha256_cbor" else None
        if seed is None and event_hash_seed is not None:
            raise ValueError("event_hash_seed is for event_hash='sha256_cbor'")
    with self._lock:
        return snapshot(self, seed)


def snapshot(pc: "PrefixCache", seed):
    """``PrefixCache.snapshot_events``: every cached page of ``pc`` as
    ``BlockStored`` runs, one per node, parents first (call under the
    cache's lock). ``seed``: vLLM's ``NONE_HASH`` for ``sha256_cbor``
    hashes, None for ``fast64``."""
    s = pc._s
    keys = pc._ns_keys
    seeds = np.array([namespace_seed(k) for k in keys], np.uint64)
    page = pc._page
    nodes, ns, has_parent, parents, first, hashes = snapshot_kernels.snapshot_runs(s.arrays, seeds, page)
    tokens, start, length = s.tokens, s.start, s.length
    hashes = hashes.tolist()
    parents = parents.tolist()
    last: Dict[int, Any] = {}  # sha256_cbor: the 64-bit hash of a node's last page -> its 32-byte hash
    events = []
    for i, v in enumerate(nodes.tolist()):
        a = int(start[v])
        run = tokens[a:a + int(length[v])].tolist()
        key = keys[ns[i]] if 0 <= ns[i] < len(keys) else int(ns[i])
        block, parent = hashes[first[i]:first[i + 1]], parents[i] if has_parent[i] else None
        if seed is not None:
            vparent = last[parent] if parent is not None else None
            vblock = block_hashes(run, page, vparent, key, seed)
            last[block[-1]] = vblock[-1]
            block, parent = vblock, vparent
        events.append(BlockStored(block, parent, run, page,
                                  lora_id=key if type(key) is int and key != 0 else None,
                                  lora_name=key if isinstance(key, str) else None))
    return events


def begin_log_size(pc: "PrefixCache", capacity, need):
    """Room the log of a ``begin`` reserving ``need`` tokens needs (it
    evicts only with ``count_inflight`` under a capacity)."""
    if capacity < 0:
        return 8
    meta = pc._s.meta
    page = pc._page
    excess = max(0, int(meta[M_TOKENS] + meta[M_INFLIGHT]) - capacity)
    bound = min(-(-(need + excess) // page) * page, int(meta[M_TOKENS] - meta[M_LOCKED_TOKENS]))
    return 4 * (max(bound, 0) // page) + 8


def drop_subtree(pc: "PrefixCache", root, order, out, keep):
    """The kernel of ``drop_namespace`` with events (under the lock)."""
    s = pc._s
    total = int(s.length[order].astype(np.int64).sum())
    log = pc._events
    assert log is not None  # called with events on only
    ev = log.ev(s, pc._ns_keys, 3 * order.shape[0] + total // pc._page + 8)
    return prefix_kernels.drop_subtree(s.directory, s.like, root, order, pc._page, out, keep, ev)


