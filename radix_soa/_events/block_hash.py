"""vLLM's ``sha256_cbor`` chained block hash, the optional page hash of KV
events (``PrefixCache(events=True, event_hash="sha256_cbor")``,
``RouterIndex(event_hash="sha256_cbor")``).

vLLM (``vllm/v1/core/kv_cache_utils.py`` ``hash_block_tokens``,
``init_none_hash``; ``vllm/utils/hashing.py`` ``sha256_cbor``) hashes a full
block as ``sha256(cbor2.dumps((parent, tuple(token_ids), extra_keys),
canonical=True))``: ``parent`` the previous block's 32-byte hash, or
``NONE_HASH`` for a sequence's first block, which is ``sha256_cbor`` of the
``PYTHONHASHSEED`` string (vLLM draws it at random when that is unset: set
it, on the engines and here, for hashes to agree); ``extra_keys`` None or a
tuple: the LoRA's ``lora_int_id`` on every block, then the request's
``cache_salt`` (a str) on its first block only. A ``PrefixCache`` namespace
maps to them as follows (each namespace stays a chain of its own):

- ``0`` (the default): no extra keys (``None``);
- an int ``n != 0``: a LoRA, ``(n,)`` on every block (``BlockStored.lora_id``);
- a str ``s``: a cache salt, ``(s,)`` on the first block, ``None`` after
  (``BlockStored.lora_name`` carries it).

Which vLLM: the int LoRA key is vLLM's up to 0.11.0. From 0.11.1 (vLLM
PR #27211) a LoRA's extra key is its ``lora_name`` (a str, every block),
which no namespace here expresses yet, so LoRA block hashes match only the
older engines; namespace 0 and cache salts match both. vLLM drops an empty
salt; the namespace ``""`` here still hashes as the salt ``("",)``.

The CBOR is written here (canonical form of the few types that tuple holds:
None, bool, ints, bytes, str, tuples and lists); ``tests/test_events.py``
checks it byte for byte against ``cbor2``. A block hash is 32 bytes; an
index keys it by its low 64 bits, ``int.from_bytes(h, "big") & (2**64 - 1)``,
which is what vLLM publishes in its events with
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` (``key64``), so the int and the
bytes form of one block are the same key.

>>> seed = none_hash("0")
>>> hs = block_hashes([1, 2, 3, 4, 5], 2, None, 0, seed)  # two whole pages
>>> len(hs), len(hs[0]), hs[1] == block_hashes([3, 4], 2, hs[0], 0, seed)[0]
(2, 32, True)
"""

import functools
import hashlib
import operator
import os
import struct

__all__ = ["EVENT_HASHES", "cbor", "sha256_cbor", "none_hash", "block_hashes", "key64",
           "check_event_hash"]

EVENT_HASHES = ("fast64", "sha256_cbor")
MASK64 = (1 << 64) - 1


def _head(out, major, n):
    if n < 24:
        out.append(major << 5 | n)
    elif n < 1 << 8:
        out += bytes((major << 5 | 24, n))
    elif n < 1 << 16:
        out += struct.pack(">BH", major << 5 | 25, n)
    elif n < 1 << 32:
        out += struct.pack(">BI", major << 5 | 26, n)
    else:
        out += struct.pack(">BQ", major << 5 | 27, n)


def _encode(out, x):
    if x is None:
        out.append(0xF6)
    elif x is True or x is False:
        out.append(0xF5 if x else 0xF4)
    elif isinstance(x, int):
        major, n = (0, x) if x >= 0 else (1, -1 - x)
        if n <= MASK64:
            _head(out, major, n)
        else:  # a bignum: tag 2 (or 3), its magnitude's big-endian bytes
            _head(out, 6, 2 + major)
            _encode(out, n.to_bytes((n.bit_length() + 7) // 8, "big"))
    elif isinstance(x, (bytes, bytearray)):
        _head(out, 2, len(x))
        out += x
    elif isinstance(x, str):
        b = x.encode("utf-8")
        _head(out, 3, len(b))
        out += b
    elif isinstance(x, (tuple, list)):
        _head(out, 4, len(x))
        for v in x:
            _encode(out, v)
    else:
        raise TypeError(f"cbor: cannot encode a {type(x).__name__}")


def cbor(x):
    """The canonical CBOR bytes of ``x`` (None, bool, int, bytes, str, and
    tuples or lists of them), as ``cbor2.dumps(x, canonical=True)``.

    >>> cbor((None, (1, 500), b"ab", "z")).hex()
    '84f682011901f4426162617a'
    """
    out = bytearray()
    _encode(out, x)
    return bytes(out)


def sha256_cbor(x):
    """vLLM's ``sha256_cbor``: SHA-256 of the canonical CBOR of ``x`` (32 bytes)."""
    return hashlib.sha256(cbor(x)).digest()


def none_hash(seed=None):
    """vLLM's ``NONE_HASH`` (the parent of a first block) for ``sha256_cbor``:
    ``sha256_cbor(seed)`` for the ``PYTHONHASHSEED`` string ``seed`` (None:
    this process's ``PYTHONHASHSEED``), or ``seed`` itself if it is 32 bytes
    (a ``NONE_HASH`` read off an engine).

    >>> none_hash("0") == sha256_cbor("0")
    True
    """
    if seed is None:
        seed = os.environ.get("PYTHONHASHSEED")
        if seed is None:
            raise ValueError("event_hash='sha256_cbor' needs event_hash_seed (the engines' "
                             "PYTHONHASHSEED) or PYTHONHASHSEED set: vLLM's NONE_HASH is random "
                             "without it")
    if isinstance(seed, (bytes, bytearray)):
        if len(seed) != 32:
            raise ValueError(f"event_hash_seed as bytes is a 32-byte NONE_HASH; got {len(seed)} "
                             "bytes")
        return bytes(seed)
    if not isinstance(seed, str):
        raise TypeError("event_hash_seed must be a str (PYTHONHASHSEED) or 32 bytes (NONE_HASH); "
                        f"got {type(seed).__name__}")
    return sha256_cbor(seed)


@functools.lru_cache(maxsize=1 << 20)  # past any vocabulary
def _int_cbor(n):
    """``cbor(n)`` of a token, cached (a vocabulary is small)."""
    return cbor(n)


def block_hashes(tokens, page, parent, namespace, seed):
    """The ``sha256_cbor`` hashes of the whole pages of ``tokens`` (ints),
    after the block ``parent`` (32 bytes; None: ``tokens`` start a sequence)
    in ``namespace``, with ``NONE_HASH`` ``seed``: ``sha256_cbor((parent,
    tuple(page_tokens), extra_keys))`` page after page, the CBOR of that
    tuple assembled from its parts (a 3-array, 32 bytes, an array of ints,
    the extra keys)."""
    lora = (namespace,) if type(namespace) is int and namespace != 0 else None
    first = (namespace,) if isinstance(namespace, str) else lora  # a salt, or the LoRA
    tail = cbor(lora)
    array = cbor([0] * page)[:-page]  # the head of an array of page items
    sha256 = hashlib.sha256
    out = []
    for i in range(len(tokens) // page):
        if parent is None:
            extra, parent = cbor(first), seed
        else:
            extra = tail
        parts = [b"\x83", cbor(parent), array]
        parts += map(_int_cbor, tokens[i * page:(i + 1) * page])
        parts.append(extra)
        parent = sha256(b"".join(parts)).digest()
        out.append(parent)
    return out


def key64(h):
    """The 64-bit key of a block hash: an int as is, bytes by their low 64
    bits big-endian (vLLM's int form of a block hash)."""
    if isinstance(h, (bytes, bytearray)):
        return int.from_bytes(h, "big") & MASK64
    return operator.index(h)


def check_event_hash(event_hash):
    if event_hash not in EVENT_HASHES:
        raise ValueError(f"event_hash must be one of {list(EVENT_HASHES)}; got {event_hash!r}")
    return event_hash
