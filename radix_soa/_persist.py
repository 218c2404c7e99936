"""Saving trees as a directory of ``.npy`` files plus a JSON header, loading
them back (copied, or memory-mapped read-only), and pickling.

Layout of a saved tree::

    tree/
      header.json     format, version, class, dtype, flags, class state,
                      and for each array its dtype, length and CRC-32
      tokens.npy      used part of the token buffer
      start.npy ...   used part of every other array

``save`` writes into a temporary sibling directory and renames it into
place, so a crash never leaves a half-written tree under the target name.
"""

import json
import os
import shutil
import tempfile
import zlib

import numpy as np

from . import _kernels as K
from ._invariants import check_tree
from ._storage import (SUPPORTED_DTYPES, TRACK_DTYPES, TreeStorage, _MIN_NODES, _MIN_TOKENS,
                       token_dtype)

FORMAT = "radix_soa"
VERSION = 1
HEADER = "header.json"
# arrays too large to checksum on a memory-mapped load (it must stay instant)
_BULK = ("tokens", "values")


class TreeFormatError(ValueError):
    """A saved tree is truncated, corrupted, foreign or of another version."""


class ReadOnlyTreeError(RuntimeError):
    """A memory-mapped tree was asked to change."""


def _used_arrays(s):
    """The used part of every array of a storage, by name."""
    tok = int(s.meta[K.M_TOK_USED])
    end = s.node_end
    out = {"tokens": s.tokens[:tok], "values": s.values[:tok] if s.has_values else s.values[:0],
           "term": s.term[: (end + 7) // 8], "table": s.table, "meta": s.meta}
    for name in s.per_node_arrays:
        out[name] = getattr(s, name)[:end]
    return out


def _crc(arr):
    return zlib.crc32(np.ascontiguousarray(arr).view(np.uint8)) & 0xFFFFFFFF


def state_of(obj):
    """(header dict, arrays dict) describing a cache completely."""
    s = obj._s
    arrays = _used_arrays(s)
    header = {
        "format": FORMAT,
        "version": VERSION,
        "class": type(obj).__name__,
        "dtype": s.dtype.name,
        "page_size": s.page_size,
        "values": s.has_values,
        "track": s.track,
        "root": s.root,
        "state": obj._extra_state(),
        "arrays": {name: {"dtype": a.dtype.name, "length": int(a.shape[0]), "crc32": _crc(a)}
                   for name, a in arrays.items()},
    }
    return header, arrays


def save(obj, path):
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path) or "."
    header, arrays = state_of(obj)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    try:
        for name, arr in arrays.items():
            np.save(os.path.join(tmp, name + ".npy"), np.ascontiguousarray(arr))
        with open(os.path.join(tmp, HEADER), "w") as f:
            json.dump(header, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(path):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.old-", dir=parent)
            os.rename(path, os.path.join(old, "tree"))
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fail(path, message):
    raise TreeFormatError(f"{path}: {message}")


def read_header(path, cls):
    hpath = os.path.join(path, HEADER)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no saved tree at {path}")
    try:
        with open(hpath) as f:
            header = json.load(f)
    except FileNotFoundError:
        _fail(path, f"missing {HEADER}: not a saved radix_soa tree")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        _fail(path, f"{HEADER} is not valid JSON ({exc})")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        _fail(path, "not a saved radix_soa tree (foreign header)")
    if header.get("version") != VERSION:
        _fail(path, f"format version {header.get('version')!r} is not supported (this is {VERSION})")
    if header.get("class") != cls.__name__:
        _fail(path, f"holds a {header.get('class')}, not a {cls.__name__}")
    try:
        dt = token_dtype(header["dtype"])
    except (KeyError, TypeError):
        _fail(path, f"unsupported token dtype {header.get('dtype')!r}")
    if dt not in SUPPORTED_DTYPES:
        _fail(path, f"unsupported token dtype {dt}")
    return header


def load_arrays(path, header, mmap):
    arrays = {}
    specs = header.get("arrays")
    if not isinstance(specs, dict):
        _fail(path, "header lists no arrays")
    for name, spec in specs.items():
        fpath = os.path.join(path, name + ".npy")
        try:
            arr = np.load(fpath, mmap_mode="r" if mmap else None, allow_pickle=False)
        except FileNotFoundError:
            _fail(path, f"missing {name}.npy")
        except (ValueError, OSError, EOFError) as exc:
            _fail(path, f"{name}.npy is truncated or corrupted ({exc})")
        if arr.ndim != 1 or arr.dtype.name != spec.get("dtype") or arr.shape[0] != spec.get("length"):
            _fail(path, f"{name}.npy holds {arr.dtype}[{arr.shape}], the header says "
                        f"{spec.get('dtype')}[{spec.get('length')}]")
        if not (mmap and name in _BULK) and _crc(arr) != spec.get("crc32"):
            _fail(path, f"{name}.npy is corrupted (checksum mismatch)")
        arrays[name] = np.asarray(arr) if mmap else arr
    return arrays


def build_storage(path, header, arrays, mmap):
    """A ``TreeStorage`` over loaded arrays: views of the memory maps
    (read-only) or copies with headroom; validated before it is returned."""
    need = ["tokens", "values", "term", "table", "meta"] + list(TreeStorage.NODE_ARRAYS)
    if header.get("track"):
        need += list(TreeStorage.TRACK_ARRAYS)
    missing = [n for n in need if n not in arrays]
    if missing:
        _fail(path, f"missing arrays {missing}")
    meta = arrays["meta"]
    if meta.shape[0] != K.META_SIZE or meta.dtype != np.int64:
        _fail(path, "meta array has the wrong size")
    tok, end = int(meta[K.M_TOK_USED]), int(meta[K.M_NODE_END])
    if arrays["tokens"].shape[0] != tok or any(arrays[n].shape[0] != end for n in TreeStorage.NODE_ARRAYS):
        _fail(path, "array lengths disagree with the counters in meta")
    table = arrays["table"]
    if table.shape[0] < 16 or table.shape[0] & (table.shape[0] - 1):
        _fail(path, "child table size is not a power of two")
    s = TreeStorage.__new__(TreeStorage)
    s.dtype = token_dtype(header["dtype"])
    s.has_values = bool(header.get("values"))
    s.track = bool(header.get("track"))
    s.page_size = int(header.get("page_size", 1))
    s.root = int(header.get("root", 0))
    s.readonly = bool(mmap)
    if arrays["tokens"].dtype != s.dtype:
        _fail(path, "token array dtype disagrees with the header")
    if mmap:
        for name, arr in arrays.items():
            setattr(s, name, arr)
        if not s.track:
            for name in TreeStorage.TRACK_ARRAYS:
                setattr(s, name, np.zeros(0, TRACK_DTYPES[name]))
    else:
        tcap = max(_MIN_TOKENS, tok + tok // 4)
        ncap = max(_MIN_NODES, end + end // 4)
        s.tokens = _padded(arrays["tokens"], tcap)
        s.values = _padded(arrays["values"], tcap if s.has_values else 0)
        for name in TreeStorage.NODE_ARRAYS:
            setattr(s, name, _padded(arrays[name], ncap))
        for name in TreeStorage.TRACK_ARRAYS:
            setattr(s, name, _padded(arrays[name], ncap) if s.track else np.zeros(0, TRACK_DTYPES[name]))
        s.term = _padded(arrays["term"], (ncap + 7) // 8)
        s.table = np.array(table)
        s.meta = np.array(meta)
    _check_ranges(path, s)
    s._pack()
    try:
        check_tree(s, full=False)
    except AssertionError as exc:
        _fail(path, f"inconsistent tree ({exc})")
    return s


def _padded(arr, cap):
    out = np.zeros(cap, arr.dtype)
    out[: arr.shape[0]] = arr
    return out


def _check_ranges(path, s):
    """Every index the kernels follow stays inside its array, so even a
    tree corrupted past its checksums cannot make a kernel read out of
    bounds."""
    meta = s.meta
    tok, end = int(meta[K.M_TOK_USED]), int(meta[K.M_NODE_END])
    length = s.length[:end]
    start = s.start[:end]
    parent = s.parent[:end]
    live = length > 0
    ok = (np.all(length >= -1)
          and np.all((start[live] >= 0) & (start[live] + length[live] <= tok))
          and np.all((parent >= -2) & (parent < end))
          and np.all(parent[live] >= 0)
          and s.term.shape[0] >= (end + 7) // 8)
    table = s.table
    ok = ok and bool(np.all((table >= -1) & (table < end)))
    ok = ok and 0 <= int(meta[K.M_NODES]) <= table.shape[0] and 0 <= s.root < end
    if s.track:
        hsize = int(meta[K.M_HEAP_SIZE])
        ok = ok and 0 <= hsize <= end and bool(np.all((s.heap[:hsize] >= 0) & (s.heap[:hsize] < end)))
        ok = ok and bool(np.all(s.hpos[:end] < max(hsize, 1)))
    if not ok:
        _fail(path, "corrupted: an index points outside its array")
