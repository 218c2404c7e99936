"""The router's checkpoint: a ``RouterIndex`` and each worker's stream
position, saved as a directory through the project's save machinery
(``radix_soa._tree.persist``: written into a temporary sibling and renamed
into place, so a ``kill -9`` during a checkpoint leaves the previous one;
a header under its own CRC-32, every array under its CRC-32) and loaded
back only once every byte is checked::

    state/
      header.json   format, class "RouterCheckpoint", version, the index's
                    state (tagged JSON: ids may be ints, strs or tuples),
                    each array's dtype, shape and CRC-32, the positions
      <name>.npy    each array of the index (no pickle)

``snapshot(index)`` copies the index at one instant (under its lock: fast,
a copy of its arrays); ``save(path, state, positions)`` writes such a copy
(anywhere: a thread off the event loop); ``load(path)`` returns ``(index,
positions, info)`` or raises ``CheckpointError`` saying what is wrong.

>>> import tempfile, os, radix_soa as rs
>>> ix = rs.RouterIndex(page_size=2, workers=["a", ("b", 1)], strict=False)
>>> pc = rs.PrefixCache(page_size=2, events=True, values=False); _ = pc.insert([1, 2, 3, 4])
>>> ix.apply("a", pc.take_events())
>>> d = os.path.join(tempfile.mkdtemp(), "state")
>>> info = save(d, snapshot(ix), {"a": (7, b"payload")})
>>> back, positions, _ = load(d)
>>> back.overlap_scores([1, 2, 3, 4]), positions
({'a': 4, ('b', 1): 0}, {'a': (7, b'payload')})
"""

import base64
import json
import os
import time
import zlib

import numpy as np

from .._tree.persist import FORMAT, HEADER, header_crc, write_atomically, write_header
from ..router_index import RouterIndex, worker_id

__all__ = ["CheckpointError", "snapshot", "save", "load", "fetch"]

CLASS = "RouterCheckpoint"
VERSION = 1
_KINDS = ("fast64", "sha256_cbor")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded (missing, damaged, foreign)."""


def snapshot(index):
    """A copy of ``index``'s state at one instant (its arrays copied): what
    ``save`` writes. Taken under the index's lock; it costs a copy of the
    arrays, not a write."""
    if not isinstance(index, RouterIndex):
        raise TypeError(f"index must be a RouterIndex; got {type(index).__name__}")
    return index.export_state()


# ---------------------------------------------------------------- tagged JSON
def _enc(v, arrays, name):
    if v is None or isinstance(v, (bool, str)):
        return v
    if type(v) is int:
        return v
    if type(v) is float:
        return {"float": repr(v)}
    if isinstance(v, np.ndarray):
        arrays[name] = v
        return {"array": name}
    if isinstance(v, np.generic):
        return {"scalar": v.dtype.str, "value": v.item() if v.dtype.kind != "f" else repr(v)}
    if isinstance(v, bytes):
        return {"bytes": base64.b64encode(v).decode()}
    if isinstance(v, tuple):
        return {"tuple": [_enc(x, arrays, f"{name}.{i}") for i, x in enumerate(v)]}
    if isinstance(v, list):
        return [_enc(x, arrays, f"{name}.{i}") for i, x in enumerate(v)]
    if isinstance(v, dict):
        return {"dict": [[_enc(k, arrays, f"{name}.k{i}"), _enc(x, arrays, f"{name}.{i}")]
                         for i, (k, x) in enumerate(v.items())]}
    if isinstance(v, slice):
        return {"slice": [v.start, v.stop, v.step]}
    raise TypeError(f"a checkpoint cannot hold {name} of type {type(v).__name__}")


def _dec(v, arrays, where):
    if v is None or isinstance(v, (bool, str, int)):
        return v
    if isinstance(v, list):
        return [_dec(x, arrays, where) for x in v]
    if not isinstance(v, dict) or len(v) not in (1, 2):
        raise CheckpointError(f"{where}: an unreadable value in {HEADER}")
    (tag, x), = list(v.items())[:1]
    try:
        if tag == "float" and isinstance(x, str):
            return float(x)
        if tag == "array" and x in arrays:
            return arrays[x]
        if tag == "scalar" and isinstance(x, str):
            dt = np.dtype(x)
            if dt.kind not in "biuf":
                raise ValueError(dt)
            return dt.type(v["value"])
        if tag == "bytes" and isinstance(x, str):
            return base64.b64decode(x, validate=True)
        if tag == "tuple" and isinstance(x, list):
            return tuple(_dec(y, arrays, where) for y in x)
        if tag == "dict" and isinstance(x, list):
            return {_dec(k, arrays, where): _dec(y, arrays, where) for k, y in x}
        if tag == "slice" and isinstance(x, list) and len(x) == 3 and all(
                y is None or type(y) is int for y in x):
            return slice(*x)
    except (TypeError, ValueError, KeyError, OverflowError) as exc:
        raise CheckpointError(f"{where}: an unreadable {tag} in {HEADER} ({exc})") from None
    raise CheckpointError(f"{where}: an unreadable value tagged {tag!r} in {HEADER}")


def _crc(arr):
    return zlib.crc32(np.ascontiguousarray(arr).view(np.uint8)) & 0xFFFFFFFF


# ---------------------------------------------------------------- save, load
def save(path, state, positions=None):
    """Write ``state`` (``snapshot(index)``) and ``positions`` (worker id ->
    ``(last seq applied, its payload bytes)``) to directory ``path``,
    replacing the checkpoint there only once the new one is whole.
    Returns ``{"bytes": ..., "seconds": ...}``."""
    t0 = time.perf_counter()
    arrays = {}
    enc_state = {k: _enc(v, arrays, k) for k, v in state.items()}
    pos = [[_enc(w, {}, "worker"), int(last), base64.b64encode(bytes(payload)).decode()]
           for w, (last, payload) in (positions or {}).items()]
    header = {"format": FORMAT, "class": CLASS, "version": VERSION, "saved_at": time.time(),
              "state": enc_state, "positions": pos,
              "arrays": {n: {"dtype": a.dtype.str, "shape": list(a.shape), "crc32": _crc(a)}
                         for n, a in arrays.items()}}
    files = {n: f"a{i}.npy" for i, n in enumerate(arrays)}
    header["files"] = files
    header["header_crc32"] = header_crc(header)

    def fill(tmp):
        for n, a in arrays.items():
            with open(os.path.join(tmp, files[n]), "wb") as f:
                np.save(f, np.ascontiguousarray(a), allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
        write_header(os.path.join(tmp, HEADER), header)

    write_atomically(path, fill)
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return {"bytes": size, "seconds": time.perf_counter() - t0}


def _fail(path, msg):
    raise CheckpointError(f"{path}: {msg}")


def load(path):
    """``(index, positions, info)`` from the checkpoint at ``path``;
    ``CheckpointError`` (``FileNotFoundError`` when there is none) if any
    byte does not check: its header's format, class, version and CRC-32,
    each array's file, dtype, shape and CRC-32, the index's state."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with open(os.path.join(path, HEADER), "rb") as f:
            header = json.loads(f.read())
    except FileNotFoundError:
        _fail(path, f"missing {HEADER}: not a checkpoint")
    except (ValueError, UnicodeDecodeError) as exc:
        _fail(path, f"{HEADER} is not valid JSON ({exc})")
    if not isinstance(header, dict) or header.get("format") != FORMAT or \
            header.get("class") != CLASS:
        _fail(path, "not a router checkpoint (foreign header)")
    if header.get("version") != VERSION:
        _fail(path, f"checkpoint version {header.get('version')!r} is not supported "
                    f"(this is {VERSION})")
    if header.get("header_crc32") != header_crc(header):
        _fail(path, f"{HEADER} is corrupted (checksum mismatch)")
    specs, files = header.get("arrays"), header.get("files")
    if not isinstance(specs, dict) or not isinstance(files, dict) or set(specs) != set(files):
        _fail(path, f"{HEADER} lists its arrays wrongly")
    arrays = {}
    for name, spec in specs.items():
        fname = files[name]
        if not isinstance(fname, str) or os.path.basename(fname) != fname or \
                not fname.endswith(".npy") or not isinstance(spec, dict):
            _fail(path, f"{HEADER} names an array file {fname!r}")
        try:
            arr = np.load(os.path.join(path, fname), allow_pickle=False)
        except FileNotFoundError:
            _fail(path, f"missing {fname}")
        except (MemoryError, KeyboardInterrupt):
            raise
        except Exception as exc:  # numpy raises many kinds for a damaged .npy
            _fail(path, f"{fname} is truncated or corrupted ({type(exc).__name__}: {exc})")
        if arr.dtype.str != spec.get("dtype") or list(arr.shape) != spec.get("shape"):
            _fail(path, f"{fname} holds {arr.dtype.str}{list(arr.shape)}, the header says "
                        f"{spec.get('dtype')}{spec.get('shape')}")
        if _crc(arr) != spec.get("crc32"):
            _fail(path, f"{fname} is corrupted (checksum mismatch)")
        arrays[name] = arr
    raw = header.get("state")
    if not isinstance(raw, dict):
        _fail(path, f"{HEADER} holds no index state")
    state = {k: _dec(v, arrays, f"{path}: state {k!r}") for k, v in raw.items()}
    index = _index_of(path, state)
    positions = {}
    pos = header.get("positions")
    if not isinstance(pos, list):
        _fail(path, f"{HEADER} holds no positions")
    for item in pos:
        try:
            w, last, payload = item
            w = worker_id(_dec(w, {}, path))
            if type(last) is not int or last < 0:
                raise ValueError(last)
            positions[w] = (last, base64.b64decode(payload, validate=True))
        except (TypeError, ValueError) as exc:
            _fail(path, f"{HEADER}: a stream position is unreadable ({exc})")
    return index, positions, {"saved_at": header.get("saved_at")}


def _index_of(path, state):
    """A ``RouterIndex`` from a decoded state (``RouterIndex.from_state``
    checks its fields before any kernel reads them)."""
    try:
        return RouterIndex.from_state(state)
    except (TypeError, ValueError) as exc:
        _fail(path, str(exc))


def fetch(url, path, *, timeout=60.0, max_bytes=8 << 30):
    """Download a peer router's ``GET /snapshot`` (``url`` is its base
    address, or the snapshot's) into the new directory ``path`` and check
    it loads; ``CheckpointError`` (or ``OSError`` for the network) says what
    went wrong. Only plain files with plain names are taken from the tar."""
    import tarfile
    import urllib.request
    if not url.rstrip("/").endswith("/snapshot"):
        url = url.rstrip("/") + "/snapshot"
    if not url.startswith(("http://", "https://")):
        raise CheckpointError(f"{url}: not an http(s) address")
    with urllib.request.urlopen(url, timeout=timeout) as r:
        if r.status != 200:
            raise CheckpointError(f"{url} answered {r.status}")
        body = r.read(max_bytes + 1)
    if len(body) > max_bytes:
        raise CheckpointError(f"{url}: the snapshot is larger than {max_bytes} bytes")
    os.makedirs(path)
    import io
    try:
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:") as tar:
            for m in tar.getmembers():
                if not m.isfile() or os.path.basename(m.name) != m.name or m.name in ("", ".",
                                                                                    ".."):
                    raise CheckpointError(f"{url}: the snapshot holds {m.name!r}, not a plain "
                                          "file")
                src = tar.extractfile(m)
                with open(os.path.join(path, m.name), "wb") as f:
                    f.write(src.read())
    except tarfile.TarError as exc:
        raise CheckpointError(f"{url}: the snapshot is not a tar ({exc})") from None
    load(path)  # checked whole before anyone uses it
    return path
