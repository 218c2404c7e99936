"""A ``ShardedCache`` saved as one directory and loaded back, each shard by
a worker.

Layout::

    tree_dir/
      header.json     format, version, class "ShardedCache", head (k),
                      shards, sequences per shard, short sequences, CRC-32
      head/           the head tree (a saved RadixCache), written by the client
      shard-00000/    shard 0 (a saved RadixCache), written by its worker
      ...

The directory is written as a whole (``_persist.write_atomically``): the
workers save their shards into a temporary sibling of ``tree_dir``, the
client adds the head tree and the header, and only then is it renamed into
place, so a failure leaves the old directory (or none) as it was. The path
must be one the client and every worker see (a LocalCluster's disk, a shared
filesystem). Loading checks the header's checksum and every field, each shard
as ``RadixCache.load`` does, and that each shard holds the sequences the
header says.
"""

import os

import numpy as np

from .._tree.persist import (FORMAT, HEADER, VERSION, header_crc, is_saved_tree,
                        read_checked_header, write_atomically, write_header)
from .._tree.results import TreeFormatError
from ..radix_cache import RadixCache

CLASS = "ShardedCache"
HEAD = "head"


def shard_dir(path, j):
    """Where shard ``j`` of the directory ``path`` lives."""
    return os.path.join(path, f"shard-{j:05d}")


def _save_shard(rc, path):
    rc.save(path)
    return len(rc)


def load_shard(path, mmap):
    return RadixCache.load(path, mmap=mmap)


def save(sc, path):
    """``ShardedCache.save``: see the module docstring."""
    where = sc._where()

    def fill(tmp):
        saved = sc._gather([sc._submit(_save_shard, j, shard_dir(tmp, j), where=where)
                            for j in range(sc.shards)])
        for j, n in enumerate(saved):
            if n != sc._lengths[j]:
                raise RuntimeError(f"shard {j} saved {n} sequences; it holds {sc._lengths[j]}")
            if not is_saved_tree(shard_dir(tmp, j)):
                raise OSError(f"shard {j} was saved where this client cannot see it: "
                              f"{os.path.abspath(os.fspath(path))} must be on a filesystem "
                              "every worker and the client share")
        sc._head.save(os.path.join(tmp, HEAD))
        header = {"format": FORMAT, "version": VERSION, "class": CLASS, "head": sc.head,
                  "shards": sc.shards, "sequences": sc._lengths.tolist(),
                  "short_sequences": sc._n_short}
        header["header_crc32"] = header_crc(header)
        write_header(os.path.join(tmp, HEADER), header)

    write_atomically(path, fill)


def _fail(path, message):
    raise TreeFormatError(f"{path}: {message}")


def checked_header(path, mmap):
    """``(header, head tree)`` of the saved ``ShardedCache`` at ``path``:
    every field checked, and the head tree (loaded with ``mmap``) against
    them."""
    header = read_checked_header(path)
    if header.get("class") != CLASS:
        _fail(path, f"holds a {header.get('class')}, not a {CLASS}")
    if "header_crc32" not in header:
        _fail(path, f"{HEADER} has no checksum")
    k, n = header.get("head"), header.get("shards")
    for key, value in (("head", k), ("shards", n), ("short_sequences",
                                                   header.get("short_sequences"))):
        if type(value) is not int or value < (0 if key == "short_sequences" else 1):
            _fail(path, f"{HEADER}: {key} {value!r} is not valid")
    seqs = header.get("sequences")
    if (not isinstance(seqs, list) or len(seqs) != n
            or any(type(x) is not int or x < 0 for x in seqs)):
        _fail(path, f"{HEADER}: sequences must list {n} counts, one per shard")
    for j in range(n):
        if not os.path.isdir(shard_dir(path, j)):
            _fail(path, f"shard {j} is missing ({os.path.basename(shard_dir(path, j))})")
    head = RadixCache.load(os.path.join(path, HEAD), mmap=mmap)
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
