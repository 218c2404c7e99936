"""A ``ShardedCache`` saved as one directory and loaded back, each shard by
a worker.

Layout::

    tree_dir/
      header.json     format, version, class "ShardedCache", save (this
                      save's random 128-bit id), head (k), shards, sequences
                      per shard, short sequences, CRC-32
      head/           the head tree (a saved RadixCache), written by the client
      shard-00000/    shard 0 (a saved RadixCache), written by its worker
      ...

Every part carries its identity inside its own checksummed header (the
``identity`` of a saved ``RadixCache``): the save's id, which part it is
(``"head"`` or the shard's index), the shard count and k. The directory is
written as a whole (``radix_soa._tree.persist.write_atomically``): the workers save their
shards into a temporary sibling of ``tree_dir``, the client adds the head
tree and the header, and only then is it renamed into place, so a failure
leaves the old directory (or none) as it was. The path must be one the
client and every worker see (a LocalCluster's disk, a shared filesystem).

Loading checks the header's checksum and every field; that the directory
holds exactly ``shards`` shard directories; each part as ``RadixCache.load``
does, and its identity against the header; that each shard holds the
sequences the header says; and the head tree against ``short_sequences``.
So an edited header (even with its checksum recomputed), swapped, copied,
missing or foreign parts raise ``TreeFormatError`` naming the part; so does
anything missing inside (only a missing ``tree_dir`` itself is a
``FileNotFoundError``, as for ``RadixCache.load``). A worker that reloads a
lost shard checks it the same way.
"""

import os
import re
import secrets
from typing import NoReturn

import numpy as np

from .._tree.persist import (FORMAT, HEADER, VERSION, header_crc, is_saved_tree,
                        read_checked_header, write_atomically, write_header)
from .._tree.results import TreeFormatError
from ..radix_cache import RadixCache

CLASS = "ShardedCache"
HEAD = "head"
_SAVE_ID = re.compile(r"[0-9a-f]{32}")


def shard_dir(path, j):
    """Where shard ``j`` of the directory ``path`` lives."""
    return os.path.join(path, f"shard-{j:05d}")


def identity(save_id, head, shards, part):
    """What part ``part`` (``HEAD`` or a shard's index) of save ``save_id``
    says it is, in its own header."""
    return {"class": CLASS, "save": save_id, "part": part, "shards": shards, "head": head}


def _label(part):
    return (f"the head tree ({HEAD}/)" if part == HEAD
            else f"shard {part} ({os.path.basename(shard_dir('', part))})")


def _fail(path, message) -> NoReturn:
    raise TreeFormatError(f"{path}: {message}")


def _load_part(top, part, mmap):
    """``(RadixCache, identity)`` of part ``part`` of the save at ``top``;
    a missing part is a ``TreeFormatError`` naming it."""
    where = os.path.join(top, HEAD) if part == HEAD else shard_dir(top, part)
    if not os.path.isdir(where):
        _fail(top, f"{_label(part)} is missing")
    try:
        return RadixCache._load(where, mmap)
    except FileNotFoundError as exc:  # removed while it was read
        _fail(top, f"{_label(part)} is incomplete ({exc})")


def _check_identity(top, part, found, want):
    label = _label(part)
    if not isinstance(found, dict) or found.get("class") != CLASS:
        _fail(top, f"{label} carries no {CLASS} identity: it was not saved as part of one "
                   "(or by a version before parts carried their identity; save it again)")
    for key, says in (("save", "belongs to another save"),
                      ("part", "is another part of the save"),
                      ("shards", "was saved with another shard count"),
                      ("head", "was saved with another head")):
        have = found.get(key)
        if type(have) is not type(want[key]) or have != want[key]:
            _fail(top, f"{label} {says}: its header says {key}={have!r}, {HEADER} says "
                       f"{want[key]!r}")


def _save_shard(rc, path, ident):
    rc._save(path, ident)
    return len(rc)


def load_shard(top, j, mmap, ident):
    """Shard ``j`` of the save at ``top`` (a worker's task, rerun when a
    lost shard is reloaded): ``TreeFormatError`` naming it unless it is
    there, intact, and the part ``ident`` says."""
    rc, found = _load_part(top, j, mmap)
    _check_identity(top, j, found, ident)
    return rc


def save(sc, path):
    """``ShardedCache.save``: see the module docstring."""
    save_id = secrets.token_hex(16)
    k, n = sc.head, sc.shards

    def fill(tmp):
        saved = sc._gather([sc._submit(_save_shard, j, shard_dir(tmp, j),
                                       identity(save_id, k, n, j)) for j in range(n)],
                           range(n), "save")
        for j, got in enumerate(saved):
            if got != sc._lengths[j]:
                raise RuntimeError(f"shard {j} saved {got} sequences; it holds "
                                   f"{sc._lengths[j]}")
            if not is_saved_tree(shard_dir(tmp, j)):
                raise OSError(f"shard {j} was saved where this client cannot see it: "
                              f"{os.path.abspath(os.fspath(path))} must be on a filesystem "
                              "every worker and the client share")
        sc._head._save(os.path.join(tmp, HEAD), identity(save_id, k, n, HEAD))
        header = {"format": FORMAT, "version": VERSION, "class": CLASS, "save": save_id,
                  "head": k, "shards": n, "sequences": sc._lengths.tolist(),
                  "short_sequences": sc._n_short}
        header["header_crc32"] = header_crc(header)
        write_header(os.path.join(tmp, HEADER), header)

    write_atomically(path, fill)


def checked_header(path, mmap):
    """``(header, head tree)`` of the saved ``ShardedCache`` at ``path``:
    every field checked, the shard directories counted, and the head tree
    (loaded with ``mmap``) against them."""
    header = read_checked_header(path)
    if header.get("class") != CLASS:
        _fail(path, f"holds a {header.get('class')}, not a {CLASS}")
    if "header_crc32" not in header:
        _fail(path, f"{HEADER} has no checksum")
    save_id = header.get("save")
    if not isinstance(save_id, str) or not _SAVE_ID.fullmatch(save_id):
        _fail(path, f"{HEADER} has no save id (saved by a version before parts carried "
                    "their identity; build and save it again)")
    k, n = header.get("head"), header.get("shards")
    for key, value in (("head", k), ("shards", n), ("short_sequences",
                                                   header.get("short_sequences"))):
        if type(value) is not int or value < (0 if key == "short_sequences" else 1):
            _fail(path, f"{HEADER}: {key} {value!r} is not valid")
    seqs = header.get("sequences")
    if (not isinstance(seqs, list) or len(seqs) != n
            or any(type(x) is not int or x < 0 for x in seqs)):
        _fail(path, f"{HEADER}: sequences must list {n} counts, one per shard")
    names = {os.path.basename(shard_dir(path, j)) for j in range(n)}
    extra = sorted(name for name in os.listdir(path)
                   if name.startswith("shard-") and name not in names)
    if extra:
        _fail(path, f"holds {extra[0]} beyond its {n} shards ({HEADER} says shards={n})")
    for j in range(n):
        if not os.path.isdir(shard_dir(path, j)):
            _fail(path, f"{_label(j)} is missing")
    head, found = _load_part(path, HEAD, mmap)
    _check_identity(path, HEAD, found, identity(save_id, k, n, HEAD))
    lengths = np.diff(head.to_csr()[1])
    if lengths.size and int(lengths.max()) > k:
        _fail(path, f"the head tree holds a sequence longer than head={k}")
    if int((lengths < k).sum()) != header["short_sequences"]:
        _fail(path, "the head tree's short sequences do not match the header")
    return header, head


def check_counts(path, header, counts):
    """``TreeFormatError`` unless each loaded shard holds the sequences the
    header says."""
    for j, (have, said) in enumerate(zip(counts, header["sequences"])):
        if have != said:
            _fail(path, f"shard {j} holds {have} sequences; {HEADER} says {said}")
