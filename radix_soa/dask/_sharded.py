"""The sharded set itself: routing by a hash of the head, the worker-side
tasks, ``ShardedCache`` and ``build`` (see ``radix_soa.dask``)."""

import os
import pickle
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Union, overload

import dask
import distributed
import numpy as np

from .._input.types import BatchLike
from .._input.validate import check_int, check_length
from .._input.batch import Batch, pack
from ..radix_cache import RadixCache
from . import _cluster, _store

if TYPE_CHECKING:
    import dask.array
    import dask.bag
    import dask.dataframe

    # the dask collections of sequences the queries may be (answered as dask arrays)
    DaskSequences = Union[dask.bag.Bag, dask.dataframe.Series]

__all__ = ["build", "load", "ShardedCache", "shard_of"]

_INT64 = np.dtype(np.int64)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


# ---------------------------------------------------------------- routing (NumPy)

def _mix(x):
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def shard_of(batch: Batch, head: int, shards: int) -> np.ndarray:
    """Shard of every sequence of ``batch`` (a ``Batch``) by a hash of its
    first ``head`` tokens; -1 for sequences shorter than ``head`` (they live
    in the head tree). Deterministic across processes and machines.

    >>> from radix_soa import pack
    >>> s = shard_of(pack([[1, 2, 3], [1, 2, 4], [1]]), 2, 4)
    >>> bool(s[0] == s[1]), int(s[2])
    (True, -1)
    """
    off = batch.offsets[:-1]
    lengths = batch.lengths
    out = np.full(len(batch), -1, np.int64)
    long_ = np.flatnonzero(lengths >= head)
    if long_.size:
        flat = batch.flat
        starts = off[long_]
        with np.errstate(over="ignore"):
            h = np.full(long_.size, _GOLD, np.uint64)
            for j in range(head):
                h = _mix(h ^ flat[starts + j].astype(np.int64).view(np.uint64) + _GOLD)
        out[long_] = (h % np.uint64(shards)).astype(np.int64)
    return out


def _take(batch, idx):
    """Sequences ``idx`` of ``batch`` as ``(flat, offsets)`` NumPy arrays."""
    lengths = batch.lengths[idx]
    offsets = np.zeros(idx.shape[0] + 1, _INT64)
    np.cumsum(lengths, out=offsets[1:])
    if idx.shape[0] == 0:
        return np.empty(0, batch.flat.dtype), offsets
    starts = batch.offsets[idx]
    pos = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=_INT64)
    return batch.flat[pos], offsets


def _heads(batch, head):
    """Every sequence cut to its first ``head`` tokens, as a ``Batch``."""
    lengths = np.minimum(batch.lengths, head)
    idx = np.arange(len(batch))
    offsets = np.zeros(len(batch) + 1, _INT64)
    np.cumsum(lengths, out=offsets[1:])
    starts = batch.offsets[idx]
    pos = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=_INT64)
    return Batch(batch.flat[pos], offsets)


def _validate_for_insert(batch):
    lengths = batch.lengths
    if np.any(lengths == 0):
        raise ValueError(f"cannot insert an empty sequence (sequence "
                         f"{int(np.flatnonzero(lengths == 0)[0])} of seqs)")
    if len(batch):
        check_length(int(lengths.max()), "a sequence of seqs")


# ---------------------------------------------------------------- worker side

def _partition_batch(part):
    """A partition of a dask collection (a list of sequences, a pandas
    Series of lists/arrays, or anything ``pack`` takes) as one ``Batch``."""
    if type(part).__module__.startswith("pandas"):
        if getattr(part, "ndim", 1) == 2:
            if part.shape[1] != 1:
                raise TypeError("build takes one column of sequences; got a dataframe with "
                                f"{part.shape[1]} columns")
            part = part.iloc[:, 0]
        if str(part.dtype).startswith(("string", "str")):
            raise TypeError("build takes a column of token lists; got a column of strings "
                            "(dask.dataframe turns object columns into strings unless "
                            "dask.config 'dataframe.convert-string' is False; a Parquet "
                            "list<int> column is read as lists)")
        arr = part.array
        if type(arr).__name__ == "ArrowExtensionArray":
            import pyarrow as pa

            return pack(pa.chunked_array([pa.array(arr)]))
        part = list(part)
    return pack(part)


def _split(part, head, shards):
    """One partition cut into per-shard pieces plus its distinct heads."""
    b = _partition_batch(part)
    _validate_for_insert(b)
    sid = shard_of(b, head, shards)
    order = np.argsort(sid, kind="stable")
    bounds = np.searchsorted(sid[order], np.arange(shards + 1))
    pieces = [_take(b, order[bounds[j]:bounds[j + 1]]) for j in range(shards)]
    hs = RadixCache()
    hs.insert_batch(_heads(b, head))
    return pieces, hs.to_csr()


def _piece(split, j):
    return split[0][j]


def _heads_of(split):
    return split[1]


def _build_shard(*pieces):
    rc = RadixCache()
    for flat, offsets in pieces:
        if offsets.shape[0] > 1:
            rc.insert_batch((flat, offsets))
    return rc


def _insert_copy(rc, flat, offsets):
    """A copy of shard ``rc`` with the piece inserted, and the new-flags.
    Copy-on-write: the old shard stays as it was, so a failed ``insert_batch``
    elsewhere leaves every shard unchanged, and a recomputation from lineage
    is exact."""
    new = pickle.loads(pickle.dumps(rc, protocol=5))
    flags = new.insert_batch((flat, offsets))
    return new, flags


def _first(pair):
    return pair[0]


def _second(pair):
    return pair[1]


def _lookup(rc, flat, offsets, what):
    if what == "exists":
        return rc.exists_batch((flat, offsets), parallel=False)
    return rc.match_prefix_batch((flat, offsets), parallel=False)


def _memory(rc):
    return rc.memory_report()


# ---------------------------------------------------------------- client side

def _client(client):
    if client is not None:
        return client
    try:
        return distributed.get_client()
    except ValueError:
        raise ValueError("no dask client: pass client= or create a distributed.Client() "
                         "first") from None


def _workers(client, shards):
    """The worker each shard is placed on: round-robin over the cluster
    (None each while it has no worker: the scheduler places them when
    workers come)."""
    workers = sorted(client.scheduler_info()["workers"])
    return [[workers[j % len(workers)]] if workers else None for j in range(shards)]


def _near(workers):
    """Keyword arguments placing a shard's first task on ``workers``
    without requiring them (if they die, it runs elsewhere); ``place``
    drops the restriction once the scheduler has placed it (see
    ``_cluster``)."""
    if not workers:
        return {}
    return {"workers": list(workers), "allow_other_workers": True}


def _placed(client, futures, timeout, what):
    """The length of each shard of ``futures`` once placed and unpinned
    (see ``_cluster``), all within ``timeout`` seconds: from now on a lost
    shard is recomputed on any worker."""
    deadline = time.monotonic() + timeout
    _cluster.place(client, futures, deadline)
    lengths = _cluster.gather(client, [client.submit(len, f, pure=False) for f in futures],
                              [f"shard {j}" for j in range(len(futures))],
                              max(deadline - time.monotonic(), 0.001), what)
    return np.array(lengths, np.int64)


def _is_dask_collection(obj):
    return dask.is_dask_collection(obj)


_SUMMED = ("total_bytes", "used_bytes", "slack_bytes", "tokens_inserted", "tokens_stored",
           "dead_tokens", "nodes")


class ShardedCache:
    """A set of int64 token sequences split over Dask workers; see the module
    docstring for how answers stay exact. Made by ``build``.

    Each shard is a ``RadixCache`` held by a future on one worker (never
    pulled to the client); queries are partitioned by shard on the client
    with NumPy, each shard answers its part in one task on the worker that
    holds it, and results are put back in input order. Calls are not meant
    to run concurrently from several client threads.

    Workers may die: a lost shard is recomputed from its lineage (the
    build's input pieces, the saved directory it was loaded from, plus the
    inserts since) on any worker, and the call goes on. A task whose workers
    keep dying raises ``distributed.KilledWorker`` (after the scheduler's
    ``allowed-failures``); a shard that cannot be recomputed raises the
    error of its recomputation (a reloaded shard whose directory is gone or
    changed: ``TreeFormatError``); and no call waits longer than
    ``timeout`` seconds for its tasks (``TimeoutError`` naming the shards
    not done). Every error names the shard; a failed call changes nothing.
    """

    def __init__(self, client, head, shards, futures, lengths, head_tree, n_short,
                 timeout=_cluster.DEFAULT_TIMEOUT):
        self._client = client
        self._timeout = _cluster.check_timeout(timeout)
        self._k = head
        self._n = shards
        self._shards = futures
        self._lengths = lengths
        self._head = head_tree
        self._n_short = n_short

    @property
    def head(self) -> int:
        """k: the number of leading tokens that picks a sequence's shard."""
        return self._k

    @property
    def shards(self) -> int:
        """How many shards (``RadixCache``s on the workers)."""
        return self._n

    @property
    def timeout(self) -> float:
        """Seconds a call waits for its tasks before it raises
        ``TimeoutError`` naming the shards not done (settable; 600 unless
        ``build`` / ``load`` were given another)."""
        return self._timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._timeout = _cluster.check_timeout(value)

    @property
    def shard_lengths(self) -> np.ndarray:
        """Distinct sequences stored per shard (int64 array; copies)."""
        return self._lengths.copy()

    def __len__(self) -> int:
        return int(self._lengths.sum()) + self._n_short

    def __repr__(self) -> str:
        return f"ShardedCache({len(self)} sequences, shards={self._n}, head={self._k})"

    # ------------------------------------------------------------ placement
    def _where(self):
        """Workers holding each shard now (empty while it is recomputed)."""
        who = self._client.who_has(self._shards)
        return [sorted(who.get(f.key, ())) for f in self._shards]

    def _submit(self, fn, j, *args):
        """``fn(shard j, *args)`` as a task: the scheduler runs it where the
        shard is (no restriction that could outlive that worker)."""
        return self._client.submit(fn, self._shards[j], *args, pure=False)

    def _gather(self, futures: List[Any], shards: Iterable[int], what: str) -> List[Any]:
        """The results of ``futures`` (``futures[i]`` a task of shard
        ``shards[i]``) within ``timeout``; errors name the shard."""
        return _cluster.gather(self._client, futures, [f"shard {j}" for j in shards],
                               self._timeout, what)

    # ------------------------------------------------------------ queries
    def _route(self, queries):
        b = pack(queries)
        h = self._head.match_prefix_batch(b, parallel=False)
        far = np.flatnonzero(h == self._k)
        sid = shard_of(b, self._k, self._n)
        return b, h, far, sid[far]

    def _ask(self, b, far, sid, what, out):
        if far.size == 0:
            return out
        order = np.argsort(sid, kind="stable")
        bounds = np.searchsorted(sid[order], np.arange(self._n + 1))
        jobs = []
        for j in range(self._n):
            idx = far[order[bounds[j]:bounds[j + 1]]]
            if idx.size:
                flat, offsets = _take(b, idx)
                jobs.append((j, idx, self._submit(_lookup, j, flat, offsets, what)))
        results = self._gather([f for *_, f in jobs], [j for j, *_ in jobs],
                               "exists_batch" if what == "exists" else "match_prefix_batch")
        for (_, idx, _), res in zip(jobs, results):
            if res.shape[0] != idx.shape[0]:  # a shard answered for the wrong part
                raise RuntimeError(f"a shard returned {res.shape[0]} answers for "
                                   f"{idx.shape[0]} queries")
            out[idx] = res
        return out

    def _per_partition(self, queries, answer):
        """``answer(batch)`` of each partition of a dask collection, as a
        dask array chunked like the partitions. The partitions are computed
        on the workers and answered one at a time (the client holds one
        partition of queries, and every answer: 1 or 8 bytes per query)."""
        import dask.array as da

        if not hasattr(queries, "to_delayed"):
            raise TypeError(f"queries: a dask bag or dataframe column; got "
                            f"{type(queries).__name__}")
        parts = list(np.ravel(np.asarray(queries.to_delayed(), dtype=object)))
        outs = []
        for i, f in enumerate(self._client.compute(parts)):
            part, = _cluster.gather(self._client, [f], [f"partition {i}"], self._timeout,
                                    "computing the queries")
            outs.append(answer(_partition_batch(part)))
            f.release()
        flat = np.concatenate(outs) if outs else np.empty(0, np.int64)
        return da.from_array(flat, chunks=(tuple(o.shape[0] for o in outs),))

    @overload
    def exists_batch(self, queries: "DaskSequences") -> "dask.array.Array": ...
    @overload
    def exists_batch(self, queries: BatchLike) -> np.ndarray: ...

    def exists_batch(self, queries: Any) -> Any:
        """``exists`` for every query, as a bool array, exactly as one
        ``RadixCache`` holding every sequence would answer.

        ``queries``: anything ``RadixCache.exists_batch`` takes, or a dask
        bag / dataframe column of sequences (then a dask array, chunked like
        its partitions, computed already).
        """
        if _is_dask_collection(queries):
            return self._per_partition(queries, self.exists_batch)
        b, h, far, sid = self._route(queries)
        out = np.zeros(len(b), np.bool_)
        short = np.flatnonzero(b.lengths < self._k)
        if short.size:
            out[short] = self._head.exists_batch(Batch(*_take(b, short)), parallel=False)
        return self._ask(b, far, sid, "exists", out)

    @overload
    def match_prefix_batch(self, queries: "DaskSequences") -> "dask.array.Array": ...
    @overload
    def match_prefix_batch(self, queries: BatchLike) -> np.ndarray: ...

    def match_prefix_batch(self, queries: Any) -> Any:
        """Longest stored prefix of every query (int64 array), exactly as one
        ``RadixCache`` holding every sequence would answer (``queries`` as
        for ``exists_batch``)."""
        if _is_dask_collection(queries):
            return self._per_partition(queries, self.match_prefix_batch)
        b, h, far, sid = self._route(queries)
        return self._ask(b, far, sid, "match", h.astype(np.int64, copy=True))

    match_length_batch = match_prefix_batch  # RadixCache's and PrefixCache's name for it

    # ------------------------------------------------------------ updates
    def insert_batch(self, seqs: BatchLike) -> np.ndarray:
        """Insert sequences; returns a bool array, True where a sequence was
        not stored before (the first of duplicates within the batch).

        All-or-nothing: everything is validated on the client first; each
        touched shard is then copied and extended on its worker, and the new
        shards replace the old ones (and the head tree is extended) only
        after every shard succeeded. A worker dying mid-insert makes Dask
        rerun the task (recomputing the shard from its lineage: each new
        shard is the old one plus its piece); if that fails too
        (``distributed.KilledWorker`` after ``allowed-failures``, or
        ``TimeoutError`` past ``timeout``), the error propagates and the
        cache is unchanged.
        """
        if _is_dask_collection(seqs):
            raise TypeError("insert_batch takes sequences in memory; dask collections are not "
                            "supported yet (use build)")
        b = pack(seqs)
        _validate_for_insert(b)
        sid = shard_of(b, self._k, self._n)
        new = np.zeros(len(b), np.bool_)
        order = np.argsort(sid, kind="stable")
        bounds = np.searchsorted(sid[order], np.arange(-1, self._n + 1))
        jobs = []
        for j in range(self._n):
            idx = order[bounds[j + 1]:bounds[j + 2]]
            if idx.size:
                flat, offsets = _take(b, idx)
                pair = self._submit(_insert_copy, j, flat, offsets)
                shard = self._client.submit(_first, pair, pure=False)
                flags = self._client.submit(_second, pair, pure=False)
                jobs.append((j, idx, shard, flags))
        results = self._gather([f for *_, f in jobs], [j for j, *_ in jobs], "insert_batch")
        # every shard succeeded: now the head tree (its own insert is
        # all-or-nothing), then swap everything in at once
        head = pickle.loads(pickle.dumps(self._head))
        head_new = head.insert_batch(_heads(b, self._k))
        short = b.lengths < self._k
        new[short] = head_new[short]
        lengths = self._lengths.copy()
        shards = list(self._shards)
        for (j, idx, shard, _), flags in zip(jobs, results):
            new[idx] = flags
            lengths[j] += int(flags.sum())
            shards[j] = shard
        n_short = self._n_short + int(head_new[short].sum())
        self._shards, self._lengths, self._head, self._n_short = shards, lengths, head, n_short
        return new

    # ------------------------------------------------------------ persistence
    def save(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Write every shard (each by its worker), the head tree and a header
        into directory ``path``, as a whole: see ``radix_soa.dask._store``;
        ``radix_soa.dask.load`` reads it back. ``path`` must be on a
        filesystem the client and every worker share. Each part carries this
        save's id and its place in it, under its own checksum, so ``load``
        refuses a part that is not the one the header names."""
        _store.save(self, path)

    # ------------------------------------------------------------ reports
    def memory_report(self) -> Dict[str, Any]:
        """Bytes per shard (each shard's ``RadixCache.memory_report()``,
        computed on its worker), the head tree's report, and ``total``: the
        counts summed over shards and head tree, with ``bytes_per_stored_token``
        recomputed from the sums. ``sequences`` and ``skew`` (largest shard
        over the mean) say how even the shards are."""
        per = self._gather([self._submit(_memory, j) for j in range(self._n)], range(self._n),
                           "memory_report")
        head = self._head.memory_report()
        total = {key: sum(r[key] for r in per) + head[key] for key in _SUMMED}
        total["bytes_per_stored_token"] = (total["used_bytes"] / total["tokens_stored"]
                                           if total["tokens_stored"] else 0.0)
        lengths = self._lengths
        mean = lengths.mean() if lengths.size else 0.0
        return {"total": total, "head": head, "shards": per,
                "sequences": lengths.tolist(), "short_sequences": self._n_short,
                "skew": float(lengths.max() / mean) if mean else 0.0}


# ---------------------------------------------------------------- build

def build(seqs: Any, shards: int = 8, client: Optional[distributed.Client] = None,
          head: int = 16, timeout: float = _cluster.DEFAULT_TIMEOUT) -> ShardedCache:
    """A ``ShardedCache`` of ``seqs`` over the workers of ``client`` (the
    current client when None).

    ``seqs``: a ``dask.bag`` of sequences, a dask dataframe column (Series)
    of lists, or anything ``radix_soa.pack`` / ``RadixCache.insert_batch``
    takes (split on the client; the pieces travel in the task graph, so a
    lost shard can be recomputed). ``shards``: how many ``RadixCache`` shards,
    placed round-robin over the workers. ``head`` (k): how many leading
    tokens pick a sequence's shard (see the module docstring for the costs).
    ``timeout``: seconds this and every later call of the cache may wait
    for its tasks (``ShardedCache.timeout``). Empty sequences raise
    ``ValueError`` (as ``insert_batch``). With a ``distributed.Client``
    running::

        sc = build([[1, 2, 3], [1, 2, 4], [5]], shards=2, head=2, timeout=60)
        sc.exists_batch([[1, 2, 3], [1, 2]]).tolist()   # [True, False]
    """
    shards = check_int("shards", shards, minimum=1, maximum=1 << 20)
    head = check_int("head", head, minimum=1, maximum=1 << 20)
    timeout = _cluster.check_timeout(timeout)
    client = _client(client)
    pin = _workers(client, shards)
    head_tree = RadixCache()
    n_short = 0

    def add_heads(csr):
        nonlocal n_short
        hb = Batch(*csr)
        if len(hb):
            fresh = head_tree.insert_batch(hb)
            n_short += int((fresh & (hb.lengths < head)).sum())

    if _is_dask_collection(seqs):
        if hasattr(seqs, "to_delayed"):
            parts = seqs.to_delayed()
            parts = list(np.ravel(np.asarray(parts, dtype=object)))
        else:
            raise TypeError(f"build takes a dask bag or dataframe column; got "
                            f"{type(seqs).__name__}")
        part_f = client.compute(parts)
        splits = [client.submit(_split, p, head, shards, pure=False) for p in part_f]
        pieces = [[client.submit(_piece, s, j, pure=False) for s in splits]
                  for j in range(shards)]
        futures = [client.submit(_build_shard, *pieces[j], pure=False, **_near(pin[j]))
                   for j in range(shards)]
        for csr in _cluster.gather(client, [client.submit(_heads_of, s, pure=False)
                                            for s in splits],
                                   [f"partition {i}" for i in range(len(splits))], timeout,
                                   "build"):
            add_heads(csr)
        del part_f, splits, pieces
    else:
        b = pack(seqs)
        _validate_for_insert(b)
        sid = shard_of(b, head, shards)
        order = np.argsort(sid, kind="stable")
        bounds = np.searchsorted(sid[order], np.arange(-1, shards + 1))
        futures = [client.submit(_build_shard, _take(b, order[bounds[j + 1]:bounds[j + 2]]),
                                 pure=False, **_near(pin[j])) for j in range(shards)]
        if len(b):
            hb = _heads(b, head)
            add_heads((hb.flat, hb.offsets))
    lengths = _placed(client, futures, timeout, "build")
    return ShardedCache(client, head, shards, futures, lengths, head_tree, n_short, timeout)


def load(path: Union[str, "os.PathLike[str]"], mmap: bool = False,
         client: Optional[distributed.Client] = None,
         timeout: float = _cluster.DEFAULT_TIMEOUT) -> ShardedCache:
    """A ``ShardedCache`` written by ``ShardedCache.save``, each shard loaded
    by the worker that will hold it (``mmap=True``: mapped read-only there,
    as ``RadixCache.load(mmap=True)``; ``insert_batch`` still works, on
    copies). The head tree is loaded by the client. ``timeout`` as for
    ``build``.

    Everything is checked before it is trusted: a truncated, corrupted,
    foreign or edited directory (a header whose counts disagree with its
    parts, even with its checksum recomputed; a swapped, copied, missing or
    extra shard; a missing head tree) raises ``TreeFormatError`` naming the
    part (see ``radix_soa.dask._store``). A lost worker reloads its shards
    from the directory, checked the same way: keep the directory, as it is,
    while the cache is used (saving over it makes a lost shard an error)::

        sc.save("tree_dir/")
        back = load("tree_dir/", mmap=True)   # len(back) == len(sc)
    """
    client = _client(client)
    timeout = _cluster.check_timeout(timeout)
    path = os.path.abspath(os.fspath(path))
    header, head = _store.checked_header(path, mmap)
    k, n, save_id = header["head"], header["shards"], header["save"]
    pin = _workers(client, n)
    futures = [client.submit(_store.load_shard, path, j, mmap, _store.identity(save_id, k, n, j),
                             pure=False, **_near(pin[j])) for j in range(n)]
    counts = _placed(client, futures, timeout, "load")
    _store.check_counts(path, header, counts)
    return ShardedCache(client, k, n, futures, counts, head, header["short_sequences"], timeout)
