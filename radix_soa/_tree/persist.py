"""Saving trees as a directory of ``.npy`` files plus a JSON header, loading
them back (copied, or memory-mapped read-only), and pickling.

Layout of a saved tree::

    tree/
      header.json     format, version, class, dtype, flags, class state,
                      for each array its dtype, length and CRC-32, and
                      optionally an identity (what a saved part of a larger
                      whole says it is: a ``radix_soa.dask`` shard)
      tokens.npy      used part of the token buffer
      start.npy ...   used part of every other array

``save`` writes into a temporary sibling directory and renames it into
place, so a crash never leaves a half-written tree under the target name. It
refuses a target that exists and is not a saved tree (an empty directory
aside), restores the old tree if replacing it fails, and clears what earlier
crashed saves left beside the target (first putting back a tree a crash left
moved aside). The header carries its own CRC-32; ``load`` checks it, every
array's, and the whole structure (everything ``check_invariants`` checks),
so no edit that recomputed the checksums can make a kernel loop, read out
of range or answer wrongly.
"""

import json
import os
import shutil
import tempfile
import zlib

import numpy as np

from .invariants import check_tree, np_key_hash, np_tag
from .._kernels.layout import (ENTRY_NODE_MASK, M_HEAP_SIZE, META_SIZE, NODE_FIELDS,
                              SAVED_TRACK_FIELDS, TRACK_FIELDS, Tree)
from .results import InvariantError, TreeFormatError
from .storage import (MIN_NODES, MIN_TOKENS, SUPPORTED_DTYPES, TRACK_DTYPES, TreeStorage,
                       high_water_marks, token_dtype)

FORMAT = "radix_soa"
VERSION = 4
# counter slots per version: version 1 kept 16 (the statistics lived in the
# header state); versions 1 and 2 kept the child table as int32 node ids,
# version 3 as int64 entries ``parent << 32 | id``; version 4 as entries
# ``tag << 32 | id`` (the key hash's high bits, see ``_kernels.table``). The
# key hash and so every home slot is the same in all four: an older table
# gains its tags on load, slot for slot (``_tagged_entries``).
READABLE_VERSIONS = {1: 16, 2: META_SIZE, 3: META_SIZE, 4: META_SIZE}
HEADER = "header.json"
_ARRAY_NAMES = ({"tokens", "values", "term", "table", "meta"} | set(NODE_FIELDS)
                | set(SAVED_TRACK_FIELDS))
# arrays too large to checksum on a memory-mapped load (it must stay instant)
_BULK = ("tokens", "values")


def _used_arrays(s):
    """The used part of every array of a storage, by name."""
    tree = s.tree  # one snapshot of the arrays
    tok, end = high_water_marks(tree.meta)
    out = {"tokens": tree.tokens[:tok], "values": tree.values[:tok], "term": tree.term[: (end + 7) // 8],
           "table": tree.table, "meta": tree.meta}
    for name in s.per_node_arrays:
        out[name] = getattr(tree, name)[:end]
    if s.track:
        del out["hkey"]
        out["heap"], out["hpos"] = _heap_by_stamp(tree, end)
    return out


def _heap_by_stamp(tree, end):
    """``(heap, hpos)`` of the used node ids with the heap ordered by
    ``stamp``, as a load expects: the arrays themselves when every entry's
    ``hkey`` is its ``stamp``, else new ones (the entries sorted by
    ``(stamp, id)``, a valid heap; eviction follows that order either way)."""
    size = int(tree.meta[M_HEAP_SIZE])
    heap, hpos = tree.heap[:end], tree.hpos[:end]
    ids = heap[:size].astype(np.int64)
    if np.array_equal(tree.hkey[ids], tree.stamp[ids]):
        return heap, hpos
    ids = ids[np.lexsort((ids, tree.stamp[ids]))]
    heap = np.zeros(end, heap.dtype)
    heap[:size] = ids
    hpos = np.full(end, -1, hpos.dtype)
    hpos[ids] = np.arange(size)
    return heap, hpos


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


def header_crc(header):
    """CRC-32 of a header without its own ``header_crc32``."""
    body = {k: v for k, v in header.items() if k != "header_crc32"}
    return zlib.crc32(json.dumps(body, sort_keys=True).encode()) & 0xFFFFFFFF


def is_saved_tree(path):
    """True if ``path`` is a directory holding a radix_soa header."""
    try:
        with open(os.path.join(path, HEADER)) as f:
            header = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(header, dict) and header.get("format") == FORMAT


def _leftovers(parent, base):
    """Directories earlier saves of ``base`` left in ``parent``: (tmp, old)."""
    tmp, old = [], []
    try:
        names = os.listdir(parent)
    except OSError:
        return tmp, old
    for name in names:
        full = os.path.join(parent, name)
        if name.startswith(f".{base}.tmp-") and os.path.isdir(full):
            tmp.append(full)
        elif name.startswith(f".{base}.old-") and os.path.isdir(full):
            old.append(full)
    return tmp, old


def _recover(path, parent, base):
    """Put back a tree a crashed replace left moved aside, then clear the
    leftovers of earlier saves."""
    tmp, old = _leftovers(parent, base)
    for d in old:
        moved = os.path.join(d, "tree")
        if not os.path.lexists(path) and is_saved_tree(moved):
            os.rename(moved, path)
    for d in tmp + old:
        shutil.rmtree(d, ignore_errors=True)


def save(obj, path, identity=None):
    """Write ``obj`` to directory ``path``; ``identity`` (a JSON object, or
    None) goes into the header, under its checksum (see ``TreeCache._save``)."""
    header, arrays = state_of(obj)
    if identity is not None:
        header["identity"] = identity
    header["header_crc32"] = header_crc(header)

    def fill(tmp):
        for name, arr in arrays.items():
            np.save(os.path.join(tmp, name + ".npy"), np.ascontiguousarray(arr))
        write_header(os.path.join(tmp, HEADER), header)

    write_atomically(path, fill)


def write_header(path, header):
    """``header`` as JSON at ``path``, flushed to the disk."""
    with open(path, "w") as f:
        json.dump(header, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def write_atomically(path, fill):
    """Make directory ``path`` what ``fill(tmp)`` writes into a fresh
    temporary sibling ``tmp``, or leave it as it was: a target that exists
    must be a saved radix_soa directory (or empty) and is replaced only
    once ``fill`` returned; on any failure the old one is put back."""
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path) or "."
    base = os.path.basename(path)
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"cannot save to {path}: no directory {parent}")
    _recover(path, parent, base)
    replacing = os.path.lexists(path)
    if replacing and not (os.path.isdir(path) and not os.path.islink(path)
                          and (is_saved_tree(path) or not os.listdir(path))):
        raise FileExistsError(f"{path} exists and is not a saved radix_soa tree; "
                              "refusing to replace it")
    tmp = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=parent)
    old = None
    try:
        fill(tmp)
        if replacing:
            old = tempfile.mkdtemp(prefix=f".{base}.old-", dir=parent)
            os.rename(path, os.path.join(old, "tree"))
        os.rename(tmp, path)
    except BaseException:
        if old is not None and not os.path.lexists(path):  # put the old tree back
            os.rename(os.path.join(old, "tree"), path)
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _fail(path, message):
    raise TreeFormatError(f"{path}: {message}")


def read_header(path, cls):
    header = read_checked_header(path)
    if header.get("class") != cls.__name__:
        _fail(path, f"holds a {header.get('class')}, not a {cls.__name__}")
    return _check_tree_header(path, header, cls)


def read_checked_header(path):
    """The header of directory ``path`` once its JSON, format, version and
    checksum are checked (``TreeFormatError`` otherwise; ``FileNotFoundError``
    when there is no directory)."""
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
    if header.get("version") not in READABLE_VERSIONS:
        _fail(path, f"format version {header.get('version')!r} is not supported (this is {VERSION})")
    if header["version"] >= 2 and header.get("header_crc32") != header_crc(header):
        _fail(path, f"{HEADER} is corrupted (checksum mismatch)")
    if "identity" in header and (header["version"] < 2 or not isinstance(header["identity"], dict)):
        _fail(path, f"{HEADER}: identity {header['identity']!r} is not a checksummed object")
    return header


def _check_tree_header(path, header, cls):
    try:
        dt = token_dtype(header["dtype"])
    except (KeyError, TypeError):
        _fail(path, f"unsupported token dtype {header.get('dtype')!r}")
    if dt not in SUPPORTED_DTYPES:
        _fail(path, f"unsupported token dtype {dt}")
    tracked = cls.__name__ == "PrefixCache"
    flags = {"track": tracked, "values": None, "page_size": None, "root": None}
    for key in flags:
        if key not in header:
            _fail(path, f"{HEADER} has no {key!r}")
    if header["track"] is not tracked or type(header["values"]) is not bool or (
            not tracked and header["values"]):
        _fail(path, f"{HEADER}: flags track={header['track']!r} values={header['values']!r} "
                    f"do not fit a {cls.__name__}")
    page = header["page_size"]
    if type(page) is not int or page < 1 or (not tracked and page != 1):
        _fail(path, f"{HEADER}: page_size {page!r} is not valid for a {cls.__name__}")
    if type(header["root"]) is not int:
        _fail(path, f"{HEADER}: root {header['root']!r} is not a node id")
    if not isinstance(header.get("state", {}), dict):
        _fail(path, f"{HEADER}: state is not an object")
    return header


def load_arrays(path, header, mmap):
    arrays = {}
    specs = header.get("arrays")
    if not isinstance(specs, dict):
        _fail(path, "header lists no arrays")
    for name, spec in specs.items():
        if name not in _ARRAY_NAMES or not isinstance(spec, dict):
            _fail(path, f"{HEADER} lists an unknown array {name!r}")
        fpath = os.path.join(path, name + ".npy")
        try:
            # copy-on-write ("c"), not "r": the kernels get writable arrays, the
            # same types as an in-memory tree's, so a memory-mapped tree runs the
            # kernels already compiled, not a read-only twin of each; the class
            # refuses every write (ReadOnlyTreeError), and the file is never
            # written whatever happens to the map
            arr = np.load(fpath, mmap_mode="c" if mmap else None, allow_pickle=False)
        except FileNotFoundError:
            _fail(path, f"missing {name}.npy")
        except (MemoryError, KeyboardInterrupt):
            raise
        except Exception as exc:  # numpy raises many kinds for a damaged .npy header
            _fail(path, f"{name}.npy is truncated or corrupted ({type(exc).__name__}: {exc})")
        if arr.ndim != 1 or arr.dtype.name != spec.get("dtype") or arr.shape[0] != spec.get("length"):
            _fail(path, f"{name}.npy holds {arr.dtype}[{arr.shape}], the header says "
                        f"{spec.get('dtype')}[{spec.get('length')}]")
        if not (mmap and name in _BULK) and _crc(arr) != spec.get("crc32"):
            _fail(path, f"{name}.npy is corrupted (checksum mismatch)")
        arrays[name] = np.asarray(arr) if mmap else arr
    return arrays


def build_storage(path, header, arrays, mmap):
    """A ``TreeStorage`` over loaded arrays: views of the (copy-on-write)
    memory maps, marked read-only, or copies with headroom; validated before
    it is returned."""
    track = bool(header.get("track"))
    need = ["tokens", "values", "term", "table", "meta"] + list(NODE_FIELDS)
    if track:
        need += list(SAVED_TRACK_FIELDS)
    missing = [n for n in need if n not in arrays]
    if missing:
        _fail(path, f"missing arrays {missing}")
    meta = arrays["meta"]
    if meta.shape[0] != READABLE_VERSIONS[header["version"]] or meta.dtype != np.int64:
        _fail(path, "meta array has the wrong size")
    if meta.shape[0] < META_SIZE:  # an older version: more slots now, zero at first
        meta = np.concatenate([meta, np.zeros(META_SIZE - meta.shape[0], np.int64)])
    tok, end = high_water_marks(meta)
    if arrays["tokens"].shape[0] != tok or any(arrays[n].shape[0] != end for n in NODE_FIELDS):
        _fail(path, "array lengths disagree with the counters in meta")
    table = arrays["table"]
    if table.shape[0] < 16 or table.shape[0] & (table.shape[0] - 1):
        _fail(path, "child table size is not a power of two")
    if header["version"] < 4:
        table = arrays["table"] = _tagged_entries(path, header, table, arrays, tok, end)
    elif table.dtype != np.int64:
        _fail(path, "child table is not int64")
    dtype = token_dtype(header["dtype"])
    has_values = bool(header.get("values"))
    if arrays["tokens"].dtype != dtype:
        _fail(path, "token array dtype disagrees with the header")
    untracked = {name: np.zeros(0, TRACK_DTYPES[name]) for name in TRACK_FIELDS}
    if mmap:
        fields = {name: arrays[name] for name in need}
        fields["meta"] = meta if meta is not arrays["meta"] else np.array(meta)
        if not track:
            fields.update(untracked)
        else:  # read-only: the heap never moves, so its keys are the stamps themselves
            fields["hkey"] = fields["stamp"]
    else:
        tcap = max(MIN_TOKENS, tok + tok // 4)
        ncap = max(MIN_NODES, end + end // 4)
        fields = {"tokens": _padded(arrays["tokens"], tcap),
                  "values": _padded(arrays["values"], tcap if has_values else 0),
                  "term": _padded(arrays["term"], (ncap + 7) // 8),
                  "table": np.array(table), "meta": np.array(meta)}
        for name in NODE_FIELDS:
            fields[name] = _padded(arrays[name], ncap)
        for name in SAVED_TRACK_FIELDS:
            fields[name] = _padded(arrays[name], ncap) if track else untracked[name]
        fields["hkey"] = fields["stamp"].copy() if track else untracked["hkey"]
    s = TreeStorage.from_tree(Tree(**fields), dtype=dtype, values=has_values, track=track,
                              page_size=int(header.get("page_size", 1)),
                              root=int(header.get("root", 0)), readonly=mmap)
    try:  # the whole structure, as check_invariants checks it, before any kernel runs
        check_tree(s, full=True, canonical=not track)
    except InvariantError as exc:
        _fail(path, f"corrupted: {exc}")
    return s


def _tagged_entries(path, header, table, arrays, tok, end):
    """An older version's child table as this version's entries, ``tag <<
    32 | id``, each in its slot: node ids (int32, versions 1 and 2) or
    ``parent << 32 | id`` (int64, version 3, whose parent bits must be the
    node's). The ids are checked to name nodes with a parent and a first
    page inside the token buffer before any token is read; whatever else is
    wrong (a duplicate, a misplaced entry) ``check_tree`` refuses as in any
    table."""
    version = header["version"]
    want = np.int32 if version < 3 else np.int64
    if table.dtype != want:
        _fail(path, f"child table is not {np.dtype(want).name} (format version {version})")
    raw = table.astype(np.int64)
    filled = raw != -1 if version >= 3 else raw >= 0
    if version < 3 and np.any(raw[~filled] != -1):
        _fail(path, "corrupted: a table entry is not a node id")
    ids = raw[filled] & ENTRY_NODE_MASK if version >= 3 else raw[filled]
    if np.any(ids >= end):
        _fail(path, "corrupted: a table entry is not a node id")
    parents = arrays["parent"][ids].astype(np.int64)
    if np.any(parents < 0):
        _fail(path, "corrupted: a table entry names a root or a free node")
    if version >= 3 and not np.array_equal(raw[filled] >> 32, parents):
        _fail(path, "corrupted: a table entry's parent is not its node's parent")
    page = int(header.get("page_size", 1))
    starts = arrays["start"][ids].astype(np.int64)
    if np.any(arrays["length"][ids] < page) or np.any(starts < 0) or np.any(starts + page > tok):
        _fail(path, "corrupted: a table entry's first page lies outside the token buffer")
    pages = arrays["tokens"][starts[:, None] + np.arange(page)[None, :]]
    entries = np.full(raw.shape[0], -1, np.int64)
    entries[filled] = np_tag(np_key_hash(parents, pages)) | ids
    return entries


def _padded(arr, cap):
    out = np.zeros(cap, arr.dtype)
    out[: arr.shape[0]] = arr
    return out
