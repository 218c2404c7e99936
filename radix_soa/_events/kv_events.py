"""KV cache events, in the shape vLLM publishes them
(``vllm/distributed/kv_events.py``): ``BlockStored``, ``BlockRemoved`` and
``AllBlocksCleared``, plain data on the wire through ``to_dict`` /
``event_from_dict``, and the namespace seed of the page hash chain.

A block is a page of ``block_size`` tokens; its hash is chained: it depends
on every token before it and on the namespace (see ``namespace_seed`` and
``radix_soa._kernels.chain``). Hashes are ints in ``[0, 2**64)``, or 32
bytes with ``event_hash="sha256_cbor"`` (vLLM's, ``radix_soa._events.block_hash``).

>>> e = BlockStored(block_hashes=[11, 12], parent_block_hash=None, token_ids=[1, 2, 3, 4],
...                 block_size=2)
>>> d = e.to_dict(); d["type"], d["block_hashes"]
('BlockStored', [11, 12])
>>> event_from_dict(d) == e
True
"""

import hashlib
import operator
from dataclasses import dataclass

__all__ = ["BlockStored", "BlockRemoved", "AllBlocksCleared", "EventError", "event_from_dict",
           "namespace_seed", "extra_hash"]

MAX_HASH = 2**64 - 1


class EventError(ValueError):
    """An event that cannot be applied (unknown block, out of order, another
    page size, malformed); nothing was changed."""


@dataclass(frozen=True)
class BlockStored:
    """A new run of whole pages cached: their chained hashes (root side
    first), the hash of the page before the run (None: the run starts the
    sequence), the run's tokens (``len(block_hashes) * block_size``), the
    LoRA id (an int namespace other than the default) and LoRA name (a str
    namespace), as vLLM's ``BlockStored``; ``extra_keys``, vLLM's per-block
    extra keys (None, or a list with one entry per block: None or a list of
    keys, such as the LoRA name, a cache salt on a first block, a
    multimodal input's ``(identifier, offset)``)."""
    block_hashes: list
    parent_block_hash: object
    token_ids: list
    block_size: int
    lora_id: object = None
    medium: object = None
    lora_name: object = None
    extra_keys: object = None

    def to_dict(self):
        d = {"type": "BlockStored", "block_hashes": list(self.block_hashes),
             "parent_block_hash": self.parent_block_hash, "token_ids": list(self.token_ids),
             "block_size": self.block_size, "lora_id": self.lora_id, "medium": self.medium,
             "lora_name": self.lora_name}
        if self.extra_keys is not None:
            d["extra_keys"] = self.extra_keys
        return d

    @property
    def namespace(self):
        """The ``PrefixCache`` namespace the pages were cached under."""
        return self.lora_name if self.lora_name is not None else (self.lora_id or 0)


@dataclass(frozen=True)
class BlockRemoved:
    """Cached pages removed (evicted, dropped with their namespace), by hash."""
    block_hashes: list
    medium: object = None

    def to_dict(self):
        return {"type": "BlockRemoved", "block_hashes": list(self.block_hashes),
                "medium": self.medium}


@dataclass(frozen=True)
class AllBlocksCleared:
    """Every page of the cache removed (``PrefixCache.reset``)."""

    def to_dict(self):
        return {"type": "AllBlocksCleared"}


_TYPES = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved,
          "AllBlocksCleared": AllBlocksCleared}


def _int_list(name, value):
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise EventError(f"{name} must be a list of ints; got {type(value).__name__}")
    out = []
    for h in value:
        try:
            if isinstance(h, bool):
                raise TypeError
            out.append(operator.index(h))
        except TypeError:
            raise EventError(f"{name} must hold ints; got {type(h).__name__}") from None
    return out


def _hash_list(name, value):
    """Hashes: ints in [0, 2**64) (the default page hash, or vLLM's int form)
    or non-empty bytes (``sha256_cbor``'s 32), one kind per list."""
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (bytes, bytearray)):
        out = []
        for h in value:
            if not isinstance(h, (bytes, bytearray)) or not h:
                raise EventError(f"{name} must hold all ints or all non-empty bytes; got "
                                 f"{type(h).__name__} {h!r}")
            out.append(bytes(h))
        return out
    out = _int_list(name, value)
    for h in out:
        if not 0 <= h <= MAX_HASH:
            raise EventError(f"{name}: hash {h} is outside [0, 2**64)")
    return out


def event_from_dict(d):
    """The event a ``to_dict`` gave (JSON or msgpack decoded), checked:
    ``EventError`` names what is wrong.

    >>> event_from_dict({"type": "BlockRemoved", "block_hashes": [5]})
    BlockRemoved(block_hashes=[5], medium=None)
    """
    if isinstance(d, (BlockStored, BlockRemoved, AllBlocksCleared)):
        return d
    if not isinstance(d, dict):
        raise EventError(f"an event is an event object or its dict; got {type(d).__name__}")
    kind = _TYPES.get(d.get("type")) if isinstance(d.get("type"), str) else None
    if kind is None:
        raise EventError(f"unknown event type {d.get('type')!r}; expected one of {sorted(_TYPES)}")
    if kind is AllBlocksCleared:
        return AllBlocksCleared()
    if "block_hashes" not in d:
        raise EventError(f"a {d['type']} event needs block_hashes")
    hashes = _hash_list("block_hashes", d["block_hashes"])
    if kind is BlockRemoved:
        return BlockRemoved(hashes, d.get("medium"))
    for key in ("parent_block_hash", "token_ids", "block_size"):
        if key not in d:
            raise EventError(f"a BlockStored event needs {key}")
    parent = d["parent_block_hash"]
    if parent is not None:
        parent = _hash_list("parent_block_hash", [parent])[0]
        if isinstance(parent, bytes) != isinstance(hashes[0] if hashes else parent, bytes):
            raise EventError("parent_block_hash and block_hashes must be both ints or both bytes")
    size = d["block_size"]
    if type(size) is not int or size < 1:
        raise EventError(f"block_size must be a positive int; got {size!r}")
    lora_id, lora_name = d.get("lora_id"), d.get("lora_name")
    if lora_id is not None and type(lora_id) is not int:
        raise EventError(f"lora_id must be None or an int; got {type(lora_id).__name__}")
    if lora_name is not None and not isinstance(lora_name, str):
        raise EventError(f"lora_name must be None or a str; got {type(lora_name).__name__}")
    tokens = _int_list("token_ids", d["token_ids"])
    if len(tokens) != len(hashes) * size:
        raise EventError(f"token_ids holds {len(tokens)} tokens for {len(hashes)} blocks of "
                         f"{size}")
    extra = d.get("extra_keys")
    if extra is not None:
        if not isinstance(extra, (list, tuple)) or len(extra) > len(hashes):
            raise EventError("extra_keys must be None or a list of at most one entry per block; "
                             f"got {type(extra).__name__}")
        try:
            for keys in extra:
                extra_hash(keys)
        except (TypeError, ValueError) as exc:
            raise EventError(f"extra_keys: {exc}") from None
        extra = list(extra)
    return BlockStored(hashes, parent, tokens, size, lora_id, d.get("medium"), lora_name, extra)


def _canonical(out, x, depth=0):
    if depth > 8:
        raise ValueError("extra keys nest too deep")
    if x is None:
        out += b"n"
    elif isinstance(x, bool):
        out += b"t" if x else b"f"
    elif isinstance(x, int):
        b = str(x).encode()
        out += b"i" + len(b).to_bytes(2, "little") + b
    elif isinstance(x, str):
        b = x.encode("utf-8", "surrogatepass")
        out += b"s" + len(b).to_bytes(4, "little") + b
    elif isinstance(x, (bytes, bytearray)):
        out += b"y" + len(x).to_bytes(4, "little") + bytes(x)
    elif isinstance(x, float):
        out += b"d" + repr(x).encode()
    elif isinstance(x, (list, tuple)):
        out += b"l" + len(x).to_bytes(4, "little")
        for v in x:
            _canonical(out, v, depth + 1)
    else:
        raise TypeError(f"an extra key is None, a bool, an int, a float, a str, bytes or a "
                        f"list of them; got {type(x).__name__}")


def extra_hash(keys, lora_name=None):
    """The 64-bit hash a router index folds into a page's key for its
    extra keys ``keys`` (None or a list/tuple; a list and a tuple of the
    same keys hash alike): 0 for none. A leading ``lora_name`` is left
    out (the page's namespace carries it already), so what remains is what
    a request adds, such as vLLM's cache salt on a first block.

    >>> extra_hash(None), extra_hash(["salt"]) == extra_hash(("lora-a", "salt"), "lora-a") != 0
    (0, True)
    """
    if keys is None:
        return 0
    if not isinstance(keys, (list, tuple)):
        raise TypeError(f"a block's extra keys are None or a list; got {type(keys).__name__}")
    if lora_name is not None and keys and keys[0] == lora_name:
        keys = keys[1:]
    if not keys:
        return 0
    out = bytearray()
    _canonical(out, list(keys))
    h = int.from_bytes(hashlib.blake2b(bytes(out), digest_size=8).digest(), "little")
    return h or 1


def namespace_seed(namespace):
    """The hash before a namespace's first page: the first 8 bytes
    (little-endian) of BLAKE2b of ``b"i" + str(int)`` for an int namespace
    (None is 0, the default) or ``b"s" + utf-8`` for a str. Stable across
    processes and machines (Python's ``hash`` of a str is not).

    >>> namespace_seed(None) == namespace_seed(0) != namespace_seed("0")
    True
    """
    if namespace is None:
        namespace = 0
    if isinstance(namespace, str):
        key = b"s" + namespace.encode("utf-8", "surrogatepass")
    else:
        try:
            key = b"i" + str(operator.index(namespace)).encode()
        except TypeError:
            raise TypeError("a namespace must be an int or a str; got "
                            f"{type(namespace).__name__}") from None
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
