"""A prefix cache SGLang's scheduler takes in place of its ``RadixCache``:
SGLang 0.5.23's ``BasePrefixCache`` interface over ``radix_soa.PrefixCache``,
whose per-token values are the KV slot indices.

Switch it on: SGLang 0.5.23 builds its tree cache through a registry
(``sglang.srt.mem_cache.registry``), and radix-soa's package registers the
backend ``"radix_soa"`` there through SGLang's plugin entry point
(``sglang.srt.plugins``), so with both installed::

    python -m sglang.launch_server --model-path ... --radix-cache-backend radix_soa

(``install()`` does the registration by hand, e.g. in a process that loads
no plugins.) Or construct it yourself, as SGLang constructs its own::

    cache = SGLangPrefixCache(cache_init_params)   # SGLang's CacheInitParams

Node handles: SGLang passes ``last_node`` objects around (``req.last_node``,
``MatchResult.last_device_node``, ``inc_lock_ref(node)``); here they are
``Node``s, small handles to a node of the ``PrefixCache``. A handle to a node
that was evicted since is refused (``ValueError``) where SGLang's tree
would act on a detached node.

Differences from SGLang's ``RadixCache`` (``docs/guide/sglang.md``):
``evict(n)`` frees exactly ``n`` tokens rounded up to whole pages, trimming
leaf tails (SGLang frees whole leaves, so it may free more); EAGLE's
bigram keys, host tiers (HiCache), sliding-window and Mamba state are not
supported. The KV events carry SGLang's own page hashes.

>>> cache = SGLangPrefixCache.create_simulated(page_size=1)
>>> key = RadixKey(array("q", [1, 2, 3, 4]))
>>> cache.insert(InsertParams(key=key, value=np.array([10, 11, 12, 13]))).prefix_len
0
>>> m = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 9]))))
>>> m.device_prefix_len, np.asarray(cache.path_device_indices(m.last_device_node)).tolist()
(2, [10, 11])
>>> lock = cache.lock(m.last_device_node)
>>> cache.evictable_size(), cache.protected_size(), cache.total_size()
(2, 2, 4)
>>> cache.evict(EvictParams(num_tokens=10)).num_tokens_evicted  # only the unlocked tail
2
>>> cache.unlock(lock)
"""

import time
from array import array
from typing import Any, Optional, Sequence, cast

import numpy as np

from .._input.validate import check_int
from ..prefix_cache import PrefixCache
from ._sglang_types import (HAVE_SGLANG, BasePrefixCache, DecLockRefResult, EventHashes,
                            EvictParams, EvictResult, IncLockRefResult, InsertParams,
                            InsertResult, MatchPrefixParams, MatchResult, RadixKey, as_int64,
                            host_array, index_tensor, insert_result, match_result,
                            namespace_of, sglang_events, tokens_of, torch)
from ._sglang_types import _MATCH_DEFAULTS, _Tensor, _tuple_new

__all__ = ["SGLangPrefixCache", "Node", "install", "make_cache", "BACKEND",
           "RadixKey", "MatchPrefixParams", "InsertParams", "EvictParams"]

#: The name ``install()`` registers: ``--radix-cache-backend radix_soa``.
BACKEND = "radix_soa"

_EMPTY = np.empty(0, np.int64)
_INT64 = np.dtype(np.int64)
_PRIORITY_MIN, _PRIORITY_MAX = -(1 << 21), (1 << 21) - 1  # PrefixCache's priority range


class Node:
    """A handle to a node of an ``SGLangPrefixCache``, where SGLang holds a
    ``TreeNode``: equal (and hashed) by the node it names. ``handle`` is the
    ``PrefixCache`` node handle; the matched KV indices ride along, so
    ``path_device_indices`` costs nothing after a match."""

    __slots__ = ("handle", "_indices", "_tokens", "_namespace")

    def __init__(self, handle: int, indices: Optional[np.ndarray] = None,
                 tokens: Any = None, namespace: Optional[str] = None) -> None:
        self.handle = handle
        self._indices = indices     # the path's KV indices (NumPy or a tensor), if known
        # else the path's tokens, to look them up: a copy, or (an insert's
        # key array('q'), its length then), which SGLang only ever extends
        self._tokens = tokens
        self._namespace = namespace

    def __eq__(self, other: object) -> bool:
        return type(other) is Node and other.handle == self.handle

    def __hash__(self) -> int:
        return hash(self.handle)

    def __repr__(self) -> str:
        return f"Node(handle={self.handle:#x})"


class SGLangPrefixCache(BasePrefixCache):
    """SGLang's prefix-cache interface (``match_prefix``, ``insert``,
    ``checkpoint``, ``evict``, ``inc_lock_ref``/``dec_lock_ref``, the sizes,
    ``reset``, ``pretty_print``, ``take_events``) over a ``PrefixCache``.

    ``params``: SGLang's ``CacheInitParams`` (or any object with its fields:
    ``disable``, ``req_to_token_pool``, ``token_to_kv_pool_allocator``,
    ``page_size``, and optionally ``eviction_policy``,
    ``enable_kv_cache_events``, ``kv_event_lora_names``, ``enable_metrics``,
    ``is_eagle``). Evicted KV slots go to
    ``token_to_kv_pool_allocator.free_segment`` (``free`` if it has none),
    as SGLang's cache hands them; a request's duplicate slots too, in
    ``checkpoint``. Eviction policies: ``lru`` (default), ``lfu``, ``fifo``,
    ``filo``, ``mru``, ``priority``, ``slru``, scored as SGLang scores them.
    """

    def __init__(self, params: Any) -> None:
        if getattr(params, "is_eagle", False):
            raise ValueError("params.is_eagle: EAGLE's bigram keys are not supported by "
                             "radix_soa's SGLang cache; run without EAGLE speculative decoding")
        if getattr(params, "eviction_policy_config", None):
            raise ValueError("params.eviction_policy_config: radix_soa's policies take no "
                             "configuration")
        self.disable = bool(params.disable)
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size = params.page_size
        self.is_eagle = False
        self.eviction_policy = str(getattr(params, "eviction_policy", "lru") or "lru").lower()
        self.enable_kv_cache_events = (bool(getattr(params, "enable_kv_cache_events", False))
                                       and not self.disable)
        self._hashes = EventHashes(getattr(params, "kv_event_lora_names", None),
                                   getattr(params, "dynamo_kv_event_format", False))
        self.device = _device_of(self.token_to_kv_pool_allocator)
        # where index tensors go: None for the CPU (torch.from_numpy's own)
        self._to = None if self.device is None or self.device.type == "cpu" else self.device
        self._pc = PrefixCache(page_size=self.page_size, eviction_policy=self.eviction_policy,
                               events=self.enable_kv_cache_events)
        if getattr(params, "enable_metrics", False):
            self.init_metrics_collector()
        self.reset()

    @classmethod
    def create_simulated(cls, disable: bool = False, mock_allocator: Any = None,
                         page_size: int = 1, enable_kv_cache_events: bool = False,
                         eviction_policy: str = "lru") -> "SGLangPrefixCache":
        """A cache without memory pools, as SGLang's
        ``RadixCache.create_simulated`` (evicted slots go to
        ``mock_allocator`` if one is given)."""
        return cls(_Params(disable=disable, req_to_token_pool=None,
                           token_to_kv_pool_allocator=mock_allocator, page_size=page_size,
                           enable_kv_cache_events=enable_kv_cache_events,
                           eviction_policy=eviction_policy))

    @property
    def prefix_cache(self) -> PrefixCache:
        """The ``PrefixCache`` behind this cache (its values are KV slots)."""
        return self._pc

    # ------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        """Empty the cache (``AllBlocksCleared`` with events on, as SGLang);
        node handles taken before are void."""
        self._pc.reset()
        self.root_node = Node(self._pc.peek(_EMPTY).node, _EMPTY)
        self._empty_match = match_result(0, self.root_node)

    def match_prefix(self, params: Any) -> Any:
        """The longest cached prefix of ``params.key`` in whole pages (a
        node ending inside a stored run is split there, as SGLang does);
        ``last_device_node`` is its ``Node``, locked with
        ``inc_lock_ref``/``lock``; ``path_device_indices`` gives its indices."""
        key = params.key
        t = key.token_ids
        if (type(t) is array and t.typecode == "q" and key.limit is None
                and not key.is_bigram):  # SGLang's form, read inline (tokens_of's fast path)
            if len(t) < self.page_size or self.disable:
                return self._empty_match
            q = np.frombuffer(t, np.int64)
        else:
            q = tokens_of(key)
            if self.disable or q.shape[0] < self.page_size:
                return self._empty_match
        extra_key, cache_salt = key.extra_key, key.cache_salt
        length, handle, values = self._pc.match(
            q, None if extra_key is None and cache_salt is None
            else namespace_of(extra_key, cache_salt))
        node = Node(handle, values)
        return _tuple_new(MatchResult, (length, node, node, node) + _MATCH_DEFAULTS)

    def insert(self, params: Any) -> Any:
        """Cache ``params.key`` (whole pages) with the KV indices
        ``params.value`` (``None``: the token ids themselves, SGLang's test
        fallback). ``prefix_len``: the leading tokens cached before, which
        keep their indices (the caller frees its duplicates). The result's
        node reads the key's ``array('q')`` (no copy) when its indices are
        first asked: SGLang only ever appends to a request's tokens."""
        if self.disable:
            return InsertResult(prefix_len=0)
        key = params.key
        t = key.token_ids
        fast = type(t) is array and t.typecode == "q" and key.limit is None and not key.is_bigram
        if fast:  # SGLang's form, read inline (tokens_of's fast path)
            n = len(t)
            q = np.frombuffer(t, np.int64) if n else _EMPTY
        else:
            q = tokens_of(key)
            n = q.shape[0]
        if self.page_size != 1 and n % self.page_size:
            n -= n % self.page_size
            q = q[:n]
        value = params.value
        values = None
        if type(value) is _Tensor:  # SGLang's index tensors: a view, no copy
            try:  # .numpy() refuses what as_int64 handles (a device tensor, one with grad)
                values = value.numpy()
            except (RuntimeError, TypeError):
                pass
            # NumPy's checks after the fact cost half of torch's before it
            if values is not None and (values.dtype is not _INT64 or values.ndim != 1):
                values = None
        if values is None:
            values = q.copy() if value is None else as_int64(value, "params.value")
        if values.shape[0] != n:
            if values.shape[0] < n:
                raise ValueError(f"params.value has {values.shape[0]} indices for the key's "
                                 f"{n} tokens in whole pages")
            values = values[:n]
        extra_key, cache_salt = key.extra_key, key.cache_salt
        ns = (None if extra_key is None and cache_salt is None
              else namespace_of(extra_key, cache_salt))
        priority = params.priority
        cached, handle, _ = self._pc.insert(q, values, ns, _priority(priority) if priority else 0)
        path = (t, n) if fast or (type(t) is array and key.limit is None) else q.copy()
        return insert_result(cached, Node(handle, None, path, ns))

    def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        """Cache what ``req`` has computed so far, ``req.full_untruncated_fill_ids[:up_to]``
        with the KV slots of its row in ``req_to_token_pool``, as SGLang's
        ``RadixCache.checkpoint``: the slots of tokens cached first by
        another request are freed and the row points at the cached ones, the
        request's lock moves to the new node (``req.lock``, ``req.last_node``)
        and ``req.kv.cache_protected_len`` covers the cached whole pages."""
        if type(up_to) is not int or up_to < 0:
            up_to = check_int("up_to", up_to, minimum=0)
        if self.disable:
            return
        kv = req.kv
        q = tokens_of(_Tokens(req.full_untruncated_fill_ids[:up_to]))
        n = q.shape[0] - q.shape[0] % self.page_size
        floor = getattr(kv, "swa_evict_floor", 0)
        if floor > 0:  # never cache what a sliding window evicted
            n = min(n, -(-floor // self.page_size) * self.page_size)
        values = self._row_slots(kv.req_pool_idx, n)
        ns = namespace_of(req.extra_key, getattr(req, "cache_salt", None))
        # No second insert at the prompt's end as SGLang makes (to evict the
        # output before the prompt): eviction trims a leaf's tail first here.
        cached = self._pc.insert(q[:n], values, ns, _priority(req.priority)).cached
        kv.cache_inserted_len = max(kv.cache_inserted_len, n)
        protected = kv.cache_protected_len
        if cached > protected:  # this request's slots of tokens cached before
            self._free(values[protected:cached], protected)
        m = self._pc.match(q[:n], ns)
        if m.length != n:
            raise RuntimeError(f"checkpoint: {m.length} of the {n} tokens just inserted match")
        cached_slots = cast(np.ndarray, m.values)  # this cache keeps values
        self.req_to_token_pool.write((kv.req_pool_idx, slice(protected, n)),
                                     index_tensor(cached_slots[protected:], self._to))
        kv.cache_protected_len = n
        node = Node(m.node, m.values)
        self.unlock(req.lock)
        req.lock = self.lock(node)
        req.last_node = node

    def _row_slots(self, row: int, n: int) -> np.ndarray:
        """The first ``n`` KV slots of ``req_to_token_pool``'s row ``row``, as
        int64 (a copy: ``checkpoint`` rewrites the row). A CPU table is read
        through a NumPy view of it (a torch index costs ~10 µs a call)."""
        table = self.req_to_token_pool.req_to_token
        if table is not self._table:
            self._table = table
            self._table_view = _host_view(table)
        view = self._table_view
        slots = view[row, :n] if view is not None else host_array(table[row, :n])
        return slots.astype(np.int64)

    _table: Any = None  # the pool's table, and its NumPy view when on the CPU
    _table_view: Optional[np.ndarray] = None

    def cache_unfinished_req(self, req: Any, chunked: bool = False) -> None:
        """The pre-0.5.2x name of a chunked-prefill checkpoint: SGLang's own
        ``checkpoint_kv_cache(req, cache)`` (``checkpoint`` up to
        ``req.extend_end``, then ``req.prefix_len = req.extend_end``)."""
        _sglang_common().checkpoint_kv_cache(req, self)

    def cache_finished_req(self, req: Any, is_insert: bool = True) -> None:
        """The pre-0.5.2x name of a finished request's release: SGLang's own
        ``release_kv_cache(req, cache, checkpoint=is_insert)`` (cache the
        request, free its own slots and row, unlock)."""
        _sglang_common().release_kv_cache(req, self, checkpoint=is_insert)

    def evict(self, params: Any) -> Any:
        """Free ``params.num_tokens`` (rounded up to whole pages; fewer only
        if fewer are evictable) from the tails of the unlocked leaves the
        eviction policy scores lowest; their KV slots go to the allocator."""
        if self.disable:
            return EvictResult()
        start = time.perf_counter()
        e = self._pc.evict(params.num_tokens)
        if e.num_tokens:
            self._free(e.values, 0)
        self.update_eviction_metrics(e.num_tokens, start)
        return EvictResult(num_tokens_evicted=e.num_tokens)

    def _free(self, indices: Any, start_pos: int) -> None:
        """Hand KV slots (a row segment starting at ``start_pos``, or whole
        evicted pages) to the allocator, as SGLang's cache does."""
        allocator = self.token_to_kv_pool_allocator
        if allocator is None:  # a simulated cache without an allocator
            return
        if type(indices) is np.ndarray:
            indices = index_tensor(indices, self._to)
        free_segment = getattr(allocator, "free_segment", None)
        if free_segment is not None:
            free_segment(indices, start_pos=start_pos)
        else:
            allocator.free(indices)

    def inc_lock_ref(self, node: Any) -> Any:
        """Protect root..``node`` from eviction; ``delta``: minus the tokens
        it newly protected (as SGLang's)."""
        if self.disable:
            return IncLockRefResult(delta=0)
        return IncLockRefResult(delta=-self._pc.lock(_handle(node)))

    def dec_lock_ref(self, node: Any, params: Any = None) -> Any:
        """Release one ``inc_lock_ref`` of ``node``; ``delta``: the tokens
        it made evictable again. A node without a lock is a ``ValueError``."""
        if self.disable:
            return DecLockRefResult(delta=0)
        return DecLockRefResult(delta=self._pc.unlock(_handle(node)))

    # ------------------------------------------------------------ sizes, views
    def evictable_size(self) -> int:
        return 0 if self.disable else self._pc.evictable_tokens

    def protected_size(self) -> int:
        return 0 if self.disable else self._pc.locked_tokens

    def total_size(self) -> int:
        return 0 if self.disable else self._pc.total_tokens

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    def supports_fast_match_prefix(self) -> bool:
        """True: a match costs a few µs, so SGLang's scheduler may match
        every waiting request (``SchedulePolicy.calc_priority`` does past
        its 128-request LPM limit too, and skips its waiting-prefix refresh)."""
        return not self.disable

    def path_device_indices(self, node: Any) -> Any:
        """The KV indices of root..``node`` (int64, on the allocator's
        device); valid while the path is locked, as SGLang's."""
        if type(node) is not Node:
            _handle(node)  # raises
        indices = node._indices
        if type(indices) is np.ndarray and self._to is None and indices.flags.writeable:
            node._indices = indices = _from_numpy(indices)  # a match's: the common case
            return indices
        if indices is None:
            tokens = node._tokens
            if type(tokens) is tuple:  # an insert's key, read now (no view kept)
                t, n = tokens
                if len(t) < n:
                    raise ValueError(f"node: the token array of the insert that returned it "
                                     f"was cut from {n} to {len(t)} tokens since")
                tokens = np.array(t[:n], np.int64)
            node._indices = self._pc.peek(tokens, node._namespace).values
        indices = node._indices
        if type(indices) is np.ndarray:
            node._indices = indices = index_tensor(indices, self._to)
        return indices

    def all_values_flatten(self) -> Any:
        """Every cached KV index, in node order."""
        return index_tensor(self._pc.cached_values(), self._to)

    def touch_prefix(self, key: Any) -> None:
        """Refresh the recency of ``key``'s cached path (no split)."""
        q = tokens_of(key)
        if self.disable or q.shape[0] < self.page_size:
            return
        m = self._pc.peek(q, namespace_of(key.extra_key, getattr(key, "cache_salt", None)))
        if m.length:
            self._pc.touch(m.node)

    def dfs_weight_order(self, node_handles: Sequence[Any]) -> list:
        raise NotImplementedError("the dfs-weight schedule policy walks SGLang's TreeNode "
                                  "children, which radix_soa's cache does not expose; use "
                                  "--schedule-policy lpm (or fcfs) with --radix-cache-backend "
                                  f"{BACKEND}")

    def take_events(self) -> list:
        """The KV events since the last call: SGLang's ``BlockStored`` /
        ``BlockRemoved`` / ``AllBlocksCleared``, with the page hashes and the
        grouping SGLang's ``RadixCache`` publishes for the same pages."""
        if not self.enable_kv_cache_events:
            return []
        return sglang_events(self._pc.take_events(), self._hashes)

    def pretty_print(self) -> None:
        self._pc.pretty_print()
        print(f"#tokens: {self.total_size()}")

    def __repr__(self) -> str:
        return (f"SGLangPrefixCache(page_size={self.page_size}, tokens={self.total_size()}, "
                f"protected={self.protected_size()}, disable={self.disable})")


class _Params:
    """``CacheInitParams``' fields ``create_simulated`` fills."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class _Tokens:
    """A token array as ``tokens_of`` reads a key."""

    __slots__ = ("token_ids",)
    is_bigram = False
    limit = None

    def __init__(self, token_ids: Any) -> None:
        self.token_ids = token_ids


_from_numpy = torch.from_numpy if torch is not None else (lambda a: a)


def _handle(node: Any) -> int:
    if type(node) is not Node:
        raise TypeError(f"node must be a Node this cache returned; got {type(node).__name__}")
    return node.handle


def _priority(priority: Any) -> int:
    """A request's priority in the range ``PrefixCache`` keeps (clipped)."""
    if not priority:
        return 0
    return min(max(int(priority), _PRIORITY_MIN), _PRIORITY_MAX)


def _device_of(allocator: Any) -> Any:
    dev = getattr(allocator, "device", None) if allocator is not None else None
    if torch is None:
        return None
    return torch.device(dev) if isinstance(dev, (str, torch.device)) else torch.device("cpu")


def _host_view(table: Any) -> Optional[np.ndarray]:
    """A NumPy view of a 2-D table in host memory (a CPU tensor, an array),
    or None (a device tensor: read row by row)."""
    if isinstance(table, np.ndarray):
        return table
    if torch is not None and isinstance(table, torch.Tensor) and table.device.type == "cpu":
        return table.numpy()
    return None


def _sglang_common() -> Any:
    if not HAVE_SGLANG:
        raise ImportError("cache_finished_req / cache_unfinished_req run SGLang's own request "
                          "lifecycle (sglang.srt.mem_cache.common); install SGLang 0.5.23")
    import sglang.srt.mem_cache.common as common

    return common


# ------------------------------------------------------------------ switching it on
def make_cache(ctx: Any) -> SGLangPrefixCache:
    """SGLang's radix-cache factory: ``ctx`` is its ``TreeCacheBuildContext``.
    Refuses, at startup, what this cache does not support (hybrid
    sliding-window or Mamba models, the hierarchical cache)."""
    for flag, what in (("is_hybrid_swa", "sliding-window (hybrid SWA) models"),
                       ("is_hybrid_ssm", "Mamba (hybrid SSM) models"),
                       ("enable_hierarchical_cache", "the hierarchical cache (HiCache)")):
        if getattr(ctx, flag, False):
            raise NotImplementedError(f"--radix-cache-backend {BACKEND} does not support {what}")
    if _schedule_policy() == "dfs-weight":
        raise NotImplementedError(f"--radix-cache-backend {BACKEND} does not support "
                                  "--schedule-policy dfs-weight; use lpm or fcfs")
    cache = SGLangPrefixCache(ctx.params)
    _warm(cache.page_size, cache.eviction_policy)
    return cache


def _schedule_policy() -> Optional[str]:
    """The scheduler's ``--schedule-policy``, from SGLang's process config
    (None where none is published, as outside a scheduler process)."""
    try:
        from sglang.srt.runtime_context import get_schedule

        return get_schedule().schedule_policy
    except (ImportError, ValueError, AttributeError):
        return None


def _warm(page_size: int, policy: str) -> None:
    """Compile (or load from Numba's cache) what serving calls, before the
    first request pays for it."""
    pc = PrefixCache(page_size=page_size, eviction_policy=policy)
    q = np.arange(4 * page_size, dtype=np.int64)
    pc.insert(q, values=q)
    m = pc.match(q[:2 * page_size])
    pc.lock(m.node)
    pc.unlock(m.node)
    pc.touch(pc.peek(q).node)
    pc.evict(page_size)


def install(name: str = BACKEND) -> None:
    """Register this cache with SGLang's radix-cache registry under ``name``,
    so ``--radix-cache-backend radix_soa`` selects it (idempotent; SGLang's
    plugin loader calls it in every SGLang process when radix-soa is
    installed). ``RuntimeError`` if this SGLang has no such registry."""
    if not HAVE_SGLANG:
        raise ImportError("install() registers with SGLang's radix-cache registry; SGLang "
                          "is not installed (pip install --no-deps sglang==0.5.23: see "
                          "docs/guide/sglang.md)")
    import importlib

    registry = importlib.import_module("sglang.srt.mem_cache.registry")
    missing = [f for f in ("register_radix_cache_backend", "get_radix_cache_factory")
               if not hasattr(registry, f)]
    if missing:
        raise RuntimeError(f"this SGLang's sglang.srt.mem_cache.registry has no {missing[0]} "
                           "(SGLang 0.5.23 has); construct SGLangPrefixCache(params) yourself")
    present = registry.get_radix_cache_factory(name)
    if present is make_cache:
        return
    if present is not None:
        raise ValueError(f"name {name!r} is registered already, by another factory")
    registry.register_radix_cache_backend(name, make_cache)
