"""The SGLang side of ``radix_soa.integrations.sglang``: SGLang 0.5.23's own
classes when SGLang is installed, stand-ins with the same names and the
fields the adapter reads when it is not, and the conversions at the
boundary (torch index tensors <-> NumPy int64, a ``RadixKey``'s tokens and
namespace, KV events).

With SGLang installed the adapter is an SGLang ``BasePrefixCache`` that
takes and returns SGLang's own objects (``RadixKey``, ``MatchPrefixParams``,
``MatchResult`` ...) and torch tensors. Without it, the same adapter runs on
the stand-ins below and NumPy arrays (torch tensors when torch alone is
installed), so its logic is tested in the project's own suite; an SGLang
scheduler always sees the first form. An SGLang that is installed but lacks
the 0.5.23 interface is an ``ImportError`` naming what is missing, never a
silent fall back to the stand-ins.

>>> from array import array
>>> tokens_of(RadixKey(array("q", [1, 2, 3]), limit=2)).tolist()
[1, 2]
>>> namespace_of(None, None) is None, namespace_of("lora-7", None)
(True, '["lora-7", null]')
"""

import dataclasses
import hashlib
import importlib
import importlib.util
import json
from array import array
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

__all__ = ["HAVE_SGLANG", "HAVE_TORCH", "BasePrefixCache", "RadixKey", "MatchPrefixParams",
           "InsertParams", "EvictParams", "MatchResult", "InsertResult", "EvictResult",
           "IncLockRefResult", "DecLockRefResult", "TreeLock", "tokens_of", "namespace_of",
           "as_int64", "host_array", "index_tensor", "match_result", "insert_result",
           "sglang_events", "EventHashes"]

#: SGLang (and torch) are looked up, not imported, to decide: an installed
#: SGLang that fails to import raises, it does not turn into the stand-ins.
HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
HAVE_TORCH = HAVE_SGLANG or importlib.util.find_spec("torch") is not None

#: What the adapter imports from SGLang, by module (SGLang 0.5.23's layout).
SGLANG_NAMES = {
    "sglang.srt.mem_cache.base_prefix_cache": (
        "BasePrefixCache", "MatchPrefixParams", "InsertParams", "EvictParams", "MatchResult",
        "InsertResult", "EvictResult", "IncLockRefResult", "DecLockRefResult", "TreeLock"),
    "sglang.srt.mem_cache.radix_cache": ("RadixKey",),
    "sglang.srt.disaggregation.kv_events": ("BlockStored", "BlockRemoved", "AllBlocksCleared",
                                            "StorageMedium"),
}


def load_sglang() -> Dict[str, Any]:
    """SGLang's classes the adapter uses, by name, or ``ImportError`` naming
    the first one this SGLang lacks (another version's layout)."""
    found = {}
    for module, names in SGLANG_NAMES.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is not None and not module.startswith(e.name):
                raise  # a dependency of SGLang is missing: say that, not "wrong version"
            raise ImportError(_wrong_version(f"module {module}")) from e
        for name in names:
            if not hasattr(mod, name):
                raise ImportError(_wrong_version(f"{module}.{name}"))
            found[name] = getattr(mod, name)
    return found


def _wrong_version(what):
    try:
        version = importlib.import_module("sglang").__version__
    except Exception:  # any failure to read it: the message still names what is missing
        version = "unknown"
    return (f"radix_soa.integrations.sglang is written for SGLang 0.5.23's prefix-cache "
            f"interface; the installed SGLang (version {version}) has no {what}")


# ------------------------------------------------------------------ stand-ins
class _RadixKey:
    """SGLang's ``RadixKey`` as the adapter reads it: ``token_ids`` (an
    ``array('q')``, a list or an int array), the namespace tags ``extra_key``
    and ``cache_salt``, a raw-token ``limit``; ``is_bigram`` keys (EAGLE) are
    refused by the adapter."""

    __slots__ = ("token_ids", "extra_key", "cache_salt", "is_bigram", "limit")

    def __init__(self, token_ids: Any, extra_key: Optional[str] = None, is_bigram: bool = False,
                 limit: Optional[int] = None, cache_salt: Optional[str] = None) -> None:
        self.token_ids = token_ids
        self.extra_key = extra_key
        self.cache_salt = cache_salt or None
        self.is_bigram = is_bigram
        self.limit = limit

    def __len__(self) -> int:
        n = len(self.token_ids)
        return n if self.limit is None else min(n, self.limit)


@dataclasses.dataclass
class _MatchPrefixParams:
    key: Any
    cow_mamba: bool = False
    req: Any = None


@dataclasses.dataclass
class _InsertParams:
    key: Any = None
    value: Any = None
    priority: int = 0
    inserted_len: int = 0


@dataclasses.dataclass
class _EvictParams:
    num_tokens: int = 0
    swa_num_tokens: int = 0
    mamba_num: int = 0


class _MatchResult(NamedTuple):
    device_prefix_len: int
    last_device_node: Any
    last_host_node: Any
    best_match_node: Any
    host_hit_length: int = 0
    swa_host_hit_length: int = 0
    swa_branching_seqlen: Optional[int] = None
    mamba_host_hit_length: int = 0
    mamba_branching_seqlen: Optional[int] = None
    cache_protected_len: Optional[int] = None


@dataclasses.dataclass
class _InsertResult:
    prefix_len: int
    total_len: int = 0
    last_device_node: Any = None


@dataclasses.dataclass
class _EvictResult:
    num_tokens_evicted: int = 0
    swa_num_tokens_evicted: int = 0
    mamba_num_evicted: int = 0


@dataclasses.dataclass
class _DecLockRefResult:
    delta: Optional[int] = None


@dataclasses.dataclass
class _IncLockRefResult:
    delta: Optional[int] = None

    def to_dec_params(self) -> None:
        return None


@dataclasses.dataclass
class _TreeLock:
    node: Any
    receipt: Any = None
    swa_released: bool = False


class _PlainBase:
    """What SGLang's ``BasePrefixCache`` gives the adapter besides the
    abstract methods: a lock is ``inc_lock_ref`` with a receipt, ``unlock``
    its release (``None``: no lock), the prefix indices of a request."""

    metrics_collector = None

    def lock(self, node: Any) -> Any:
        return _TreeLock(node, self.inc_lock_ref(node).to_dec_params())  # type: ignore[attr-defined]

    def unlock(self, lock: Any) -> None:
        if lock is not None:
            self.dec_lock_ref(lock.node, lock.receipt)  # type: ignore[attr-defined]

    def prefix_device_indices(self, req: Any) -> Any:
        return self.path_device_indices(req.last_node)[:req.prefix_len]  # type: ignore[attr-defined]

    def update_eviction_metrics(self, num_evicted: int, start_time: float) -> None:
        pass


_STAND_INS: Dict[str, Any] = {
    "BasePrefixCache": _PlainBase, "RadixKey": _RadixKey,
    "MatchPrefixParams": _MatchPrefixParams, "InsertParams": _InsertParams,
    "EvictParams": _EvictParams, "MatchResult": _MatchResult, "InsertResult": _InsertResult,
    "EvictResult": _EvictResult, "IncLockRefResult": _IncLockRefResult,
    "DecLockRefResult": _DecLockRefResult, "TreeLock": _TreeLock,
    "BlockStored": None, "BlockRemoved": None, "AllBlocksCleared": None, "StorageMedium": None,
}

_NAMES = load_sglang() if HAVE_SGLANG else _STAND_INS
BasePrefixCache: Any = _NAMES["BasePrefixCache"]
RadixKey: Any = _NAMES["RadixKey"]
MatchPrefixParams: Any = _NAMES["MatchPrefixParams"]
InsertParams: Any = _NAMES["InsertParams"]
EvictParams: Any = _NAMES["EvictParams"]
MatchResult: Any = _NAMES["MatchResult"]
InsertResult: Any = _NAMES["InsertResult"]
EvictResult: Any = _NAMES["EvictResult"]
IncLockRefResult: Any = _NAMES["IncLockRefResult"]
DecLockRefResult: Any = _NAMES["DecLockRefResult"]
TreeLock: Any = _NAMES["TreeLock"]

if HAVE_TORCH:
    import torch
    _Tensor: Any = torch.Tensor
    _TORCH_INT64: Any = torch.int64
else:
    torch = None
    _Tensor = _TORCH_INT64 = None


# ------------------------------------------------------------------ conversions
_EMPTY = np.empty(0, np.int64)
_INT64_MAX = (1 << 63) - 1


def tokens_of(key: Any) -> np.ndarray:
    """The tokens of a ``RadixKey`` (its ``limit`` applied) as int64, a view
    of an ``array('q')`` (no copy). The view must not outlive the call that
    takes it: SGLang extends its token arrays in place, which a live view
    forbids (``BufferError``)."""
    t = key.token_ids
    if type(t) is array and t.typecode == "q":  # SGLang's form: ~0.4 µs
        q = np.frombuffer(t, np.int64) if len(t) else _EMPTY
    elif type(t) is array and t.itemsize == 8 and t.typecode == "l":
        q = np.frombuffer(t, np.int64) if len(t) else _EMPTY
    else:
        q = as_int64(t, "key.token_ids")
    if key.is_bigram:
        raise ValueError("key.is_bigram: EAGLE's bigram keys are not supported by radix_soa's "
                         "SGLang cache; run without EAGLE speculative decoding")
    limit = key.limit
    if limit is not None and limit < q.shape[0]:
        q = q[:max(limit, 0)]
    return q


def as_int64(x: Any, what: str = "value") -> np.ndarray:
    """``x`` (a torch tensor on any device, a NumPy array, a list) as a 1-D
    int64 NumPy array; a CPU tensor or array of int64 is not copied."""
    if (type(x) is _Tensor and x.dtype is _TORCH_INT64 and x.is_cpu and not x.requires_grad
            and x.dim() == 1):
        return x.numpy()  # SGLang's index tensors: a view, ~1.3 µs
    a = host_array(x)
    if a.ndim != 1:
        raise ValueError(f"{what} must be 1-D; got {a.ndim}-D")
    if a.dtype != np.int64:
        if a.size and a.dtype.kind not in "iu":
            raise TypeError(f"{what} must hold integers; got {a.dtype}")
        if a.dtype.kind == "u" and a.dtype.itemsize == 8 and a.size:
            top = int(a.max())
            if top > _INT64_MAX:  # astype would wrap it to a negative slot
                raise OverflowError(f"{what} holds {top}, above int64's largest value "
                                    f"{_INT64_MAX}")
        a = a.astype(np.int64)
    return a


def host_array(x: Any) -> np.ndarray:
    """A tensor's (or array's) data as a NumPy array in host memory: a view
    of a CPU tensor, a copy of a device one."""
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            x = x.cpu()
        return x.detach().numpy() if x.requires_grad else x.numpy()
    return np.asarray(x)


def index_tensor(values: np.ndarray, device: Any) -> Any:
    """int64 indices as SGLang takes them: a torch tensor on ``device``
    (``None``: the CPU, sharing the array's memory), or the NumPy array
    itself without torch."""
    if torch is None:
        return values
    if not values.flags.writeable:  # a shared read-only answer (an empty match)
        values = values.copy()
    t = torch.from_numpy(values)
    return t if device is None else t.to(device)


def match_result(length: int, node: Any) -> Any:
    """``MatchResult(length, node, node, node)``, the other fields their
    defaults, built as a tuple (a NamedTuple's keyword constructor costs
    ~1.5 µs with SGLang's 14 fields)."""
    return _tuple_new(MatchResult, (length, node, node, node) + _MATCH_DEFAULTS)


_tuple_new = tuple.__new__
_MATCH_DEFAULTS = tuple(MatchResult._field_defaults[f] for f in MatchResult._fields[4:])


def _plain_defaults(cls: Any, given: Tuple[str, ...]
                    ) -> Optional[Tuple[Dict[str, Any], Tuple[Tuple[str, Any], ...]]]:
    """``(defaults, factories)`` of a dataclass's other fields when an
    instance can be made as ``object.__new__`` plus its ``__dict__`` (no
    ``__post_init__``, no slots, every other field a default or a default
    factory), or None."""
    if (not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__")
            or "__slots__" in cls.__dict__):
        return None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if set(given) - set(fields):
        return None
    defaults, factories = {}, []
    for name, f in fields.items():
        if name in given:
            continue
        if f.default is not dataclasses.MISSING:
            defaults[name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            factories.append((name, f.default_factory))
        else:
            return None
    return defaults, tuple(factories)


_INSERT_DEFAULTS = _plain_defaults(InsertResult, ("prefix_len", "last_device_node"))
_object_new = object.__new__


def insert_result(prefix_len: int, node: Any) -> Any:
    """``InsertResult(prefix_len=prefix_len, last_device_node=node)``, built
    without the dataclass's keyword constructor (~0.35 µs with SGLang's ten
    fields) when its fields allow."""
    if _INSERT_DEFAULTS is None:
        return InsertResult(prefix_len=prefix_len, last_device_node=node)
    defaults, factories = _INSERT_DEFAULTS
    r = _object_new(InsertResult)
    d = defaults.copy()
    d["prefix_len"] = prefix_len
    d["last_device_node"] = node
    for name, factory in factories:
        d[name] = factory()
    r.__dict__ = d
    return r


_NAMESPACES: Dict[Tuple[Any, Any], str] = {}  # namespace_of's answers so far (bounded)


def namespace_of(extra_key: Optional[str], cache_salt: Optional[str]) -> Optional[str]:
    """The ``PrefixCache`` namespace of SGLang's two namespace tags: ``None``
    (the default namespace) when both are ``None``, else one string per pair
    (so ``extra_key=""`` and ``None`` stay apart, as in SGLang)."""
    if extra_key is None and cache_salt is None:
        return None
    pair = (extra_key, cache_salt)
    ns = _NAMESPACES.get(pair)
    if ns is None:
        ns = json.dumps([extra_key, cache_salt])
        if len(_NAMESPACES) < 1 << 16:
            _NAMESPACES[pair] = ns
    return ns


def tags_of(namespace: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """``(extra_key, cache_salt)`` of a namespace ``namespace_of`` made."""
    if namespace is None:
        return None, None
    extra_key, cache_salt = json.loads(namespace)
    return extra_key, cache_salt


class EventHashes:
    """SGLang 0.5.23's page hashes for radix_soa's KV events: what its own
    ``RadixCache`` publishes for the same pages, so a router that indexes
    SGLang's events reads this cache's alike.

    SGLang hashes a page as SHA-256 of the previous page's 32-byte digest
    (none for a namespace's first page, or a digest of the request's
    ``cache_salt``) followed by the page's tokens as little-endian uint32
    (as uint64 after a ``0xff`` byte when one does not fit in uint32), and
    publishes the digest's first 8 bytes as a big-endian signed int64, mixed
    with a namespace seed (``namespaced_block_hash``) where the LoRA name
    table knows the ``extra_key`` (or, in Dynamo's format, for any
    namespace). radix_soa's events carry its own 64-bit chained page hashes;
    this keeps the SGLang digest of every cached page by that hash (as
    SGLang's nodes keep theirs), so a run's parent and a removed page are
    looked up, never recomputed.

    >>> h = EventHashes()
    >>> hashes, parent = h.stored([7, 8, 9, 10], 2, None, None, hashes=[71, 72])
    >>> len(hashes), parent is None, h.removed([72]) == hashes[1:]
    (2, True, True)
    """

    def __init__(self, lora_names: Any = None, dynamo_format: bool = False) -> None:
        self.lora_names = lora_names
        self.dynamo_format = bool(dynamo_format)
        # radix_soa page hash -> (SGLang's SHA-256 digest, the published int64)
        self._pages: Dict[int, Tuple[bytes, int]] = {}
        self._seeds: Dict[Optional[str], Tuple[Optional[str], Optional[str], Any, Any]] = {}

    def clear(self) -> None:
        """Every page removed (``AllBlocksCleared``)."""
        self._pages.clear()

    def tags(self, namespace: Optional[str]) -> Tuple[Optional[str], Optional[str], Any, Any]:
        """``(extra_key, cache_salt, lora_name, namespace seed)`` of a
        namespace ``namespace_of`` made: what SGLang's events carry for it."""
        got = self._seeds.get(namespace)
        if got is None:
            extra_key, cache_salt = tags_of(namespace)
            names = self.lora_names
            if self.dynamo_format:
                name = names.resolve(extra_key) if names is not None else None
                seed = _namespace_seed(extra_key, cache_salt)
            else:
                name = names.get(extra_key) if names is not None else None
                seed = _namespace_seed(extra_key if name is not None else None, None)
            got = (extra_key, cache_salt, name, seed)
            if len(self._seeds) < 1 << 16:
                self._seeds[namespace] = got
        return got

    def stored(self, tokens: list, block_size: int, parent: Optional[int],
               namespace: Optional[str], hashes: Optional[list] = None
               ) -> Tuple[List[int], Optional[int]]:
        """SGLang's published hashes of a run of pages, and of the page before
        it (``parent``: radix_soa's hash of that page, None for a first
        page); ``hashes``: radix_soa's hashes of the run's pages, to look
        them up by at their removal."""
        _, cache_salt, _, seed = self.tags(namespace)
        pages = self._pages
        if parent is None:
            prior = (b"" if cache_salt is None else
                     hashlib.sha256(b"sglang-cache-salt-v1\0" + cache_salt.encode()).digest())
            published_parent = None
        else:
            got = pages.get(parent)
            if got is None:
                raise RuntimeError(_MISSED)
            prior, published_parent = got
        out = []
        for i in range(0, len(tokens), block_size):
            prior = hashlib.sha256(prior + _page_bytes(tokens[i:i + block_size])).digest()
            h = int.from_bytes(prior[:8], "big", signed=True)
            if seed is not None:
                h = _namespaced(h, seed)
            out.append(h)
            if hashes is not None:
                pages[hashes[i // block_size]] = (prior, h)
        return out, published_parent

    def removed(self, hashes: list) -> List[int]:
        """SGLang's published hashes of removed pages (forgotten here)."""
        pages = self._pages
        try:
            return [pages.pop(h)[1] for h in hashes]
        except KeyError:
            raise RuntimeError(_MISSED) from None


_MISSED = ("a KV event names a page whose store event this cache's take_events never saw "
           "(were events taken from its prefix_cache directly?): SGLang's page hashes chain "
           "from every stored page")


_UINT32 = np.dtype("<u4")
_UINT64 = np.dtype("<u8")


def _page_bytes(tokens: list) -> bytes:
    """A page's tokens as SGLang's page hash reads them."""
    a = np.asarray(tokens, np.int64)
    if a.size and (a.min() < 0 or a.max() > 0xFFFFFFFF):
        # SGLang: uint64 after a 0xff byte (a negative token, which SGLang
        # refuses, is hashed as its two's complement here)
        return b"\xff" + a.astype(_UINT64).tobytes()
    return a.astype(_UINT32).tobytes()


def _namespace_seed(extra_key: Optional[str], cache_salt: Optional[str]) -> Optional[bytes]:
    """SGLang's KV event namespace seed of ``(extra_key, cache_salt)``
    (None for neither): each present part length-prefixed, so ("a", "bc")
    and ("ab", "c") differ."""
    if extra_key is None and cache_salt is None:
        return None
    d = hashlib.sha256(b"sglang-kv-event-namespace-v1")
    for part in (extra_key, cache_salt):
        if part is None:
            d.update(b"\x00")
        else:
            b = part.encode("utf-8")
            d.update(b"\x01" + len(b).to_bytes(8, "little") + b)
    return d.digest()


def _namespaced(h: int, seed: bytes) -> int:
    """A published page hash mixed with a namespace seed, as SGLang mixes it."""
    digest = hashlib.sha256(seed + h.to_bytes(8, "big", signed=True)).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def sglang_events(events: list, hashes: "EventHashes") -> list:
    """radix_soa's KV events as SGLang's own event objects, with SGLang's
    page hashes (``EventHashes``) and grouped as SGLang's event queue groups
    them (a run that continues the previous stored run of the same kind
    joins it; removals in a row join), or unchanged when SGLang is not
    installed."""
    if not HAVE_SGLANG:
        return events
    stored, removed, cleared = (_NAMES["BlockStored"], _NAMES["BlockRemoved"],
                                _NAMES["AllBlocksCleared"])
    gpu = _NAMES["StorageMedium"].GPU
    out: list = []
    for e in events:
        kind = type(e).__name__
        tail: Any = out[-1] if out else None
        if kind == "BlockStored":
            extra_key, cache_salt, name, _ = hashes.tags(e.lora_name)
            tokens = list(e.token_ids)
            block_hashes, parent = hashes.stored(tokens, e.block_size, e.parent_block_hash,
                                                 e.lora_name, e.block_hashes)
            if (type(tail) is stored and tail.block_hashes and parent is not None
                    and parent == tail.block_hashes[-1] and tail.block_size == e.block_size
                    and tail.cache_salt == cache_salt and tail.lora_name == name):
                tail.block_hashes.extend(block_hashes)
                tail.token_ids.extend(tokens)
                continue
            out.append(stored(block_hashes=block_hashes, parent_block_hash=parent,
                              token_ids=tokens, block_size=e.block_size, lora_id=None,
                              medium=gpu, cache_salt=cache_salt, lora_name=name))
        elif kind == "BlockRemoved":
            block_hashes = hashes.removed(e.block_hashes)
            if type(tail) is removed:
                tail.block_hashes.extend(block_hashes)
                continue
            out.append(removed(block_hashes=block_hashes, medium=gpu))
        else:
            hashes.clear()
            out.append(cleared())
    return out
