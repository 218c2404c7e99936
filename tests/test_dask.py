"""radix_soa.dask on a real 2-process LocalCluster: every answer against one
in-process RadixCache holding the same sequences; workers killed mid-call;
saved directories edited behind the checksums."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

distributed = pytest.importorskip("distributed", reason="dask[distributed] is not installed "
                                  "(pip install radix-soa[dask])")
import dask.bag as db  # noqa: E402

import radix_soa as rs  # noqa: E402
import radix_soa.dask as rsd  # noqa: E402

# one worker runs this file: its module-scoped fixture is built once
pytestmark = pytest.mark.xdist_group("dask")


@pytest.fixture(scope="module")
def client():
    import dask

    # a LocalCluster closes a worker's nanny for good when no worker of that
    # name is back 15 s after it died: the tests below kill workers often
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           host="127.0.0.1", dashboard_address=None)
        c = distributed.Client(cluster)
        yield c
        c.close()
        cluster.close()


def corpus(seed=0, n=3000):
    """Sequences over a 3-token alphabet (much sharing), 1..20 tokens, with
    duplicates and a common 5-token opening on a third of them."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        s = list(rng.integers(0, 3, int(rng.integers(1, 21))))
        if i % 3 == 0:
            s = [7, 7, 7, 7, 7] + s
        out.append(s)
    out += out[:50]  # duplicates
    return out


def queries(seqs, seed=1):
    """Exact hits, strict prefixes, extensions, misses, short and empty ones."""
    rng = np.random.default_rng(seed)
    picks = [seqs[int(i)] for i in rng.integers(0, len(seqs), 400)]
    q = list(picks)
    q += [s[:int(rng.integers(0, len(s) + 1))] for s in picks]
    q += [s + [int(rng.integers(0, 4))] for s in picks]
    q += [s[:-1] + [9] for s in picks]
    q += [list(rng.integers(0, 4, int(rng.integers(0, 25)))) for _ in range(800)]
    q += [[], [7], [7, 7, 7, 7, 7], [9]]
    return q


def reference(seqs):
    rc = rs.RadixCache()
    rc.insert_batch(seqs)
    return rc


SEQS = corpus()
REF = reference(SEQS)
QUERIES = queries(SEQS)
WANT_EXISTS = REF.exists_batch(QUERIES)
WANT_MATCH = REF.match_prefix_batch(QUERIES)


def check(sc, ref=REF, q=QUERIES):
    assert len(sc) == len(ref)
    np.testing.assert_array_equal(sc.exists_batch(q), ref.exists_batch(q))
    np.testing.assert_array_equal(sc.match_prefix_batch(q), ref.match_prefix_batch(q))


def test_the_queries_cover_every_kind():
    assert WANT_EXISTS.any() and not WANT_EXISTS.all()
    lengths = np.array([len(s) for s in QUERIES])
    assert (WANT_MATCH < lengths).any()          # strict prefixes and misses
    assert ((WANT_MATCH > 0) & (WANT_MATCH < 4)).any()  # matches shorter than the head
    assert (lengths == 0).any()


@pytest.mark.parametrize("shards, head", [(1, 4), (3, 1), (3, 4), (8, 6), (5, 26)])
def test_answers_equal_one_tree(client, shards, head):
    sc = rsd.build(SEQS, shards=shards, client=client, head=head)
    assert sc.shards == shards and sc.head == head
    check(sc)
    if head == 26:  # longer than every sequence: all live in the head tree
        assert sc.shard_lengths.sum() == 0


def test_heads_short_sequences_and_sequences_of_exactly_k_tokens(client):
    seqs = [[1, 2, 3, 4, 5], [1, 2], [6, 6, 6, 6], [6, 6, 6, 6, 1], [9]]
    sc = rsd.build(seqs, shards=3, client=client, head=4)
    q = [[1, 2, 3, 4], [1, 2, 3, 4, 5], [1, 2], [1], [1, 2, 3, 4, 5, 6], [6, 6, 6, 6],
         [6, 6, 6], [6, 6, 6, 6, 2], [9], [9, 9], [], [2]]
    assert sc.exists_batch(q).tolist() == [False, True, True, False, False, True,
                                           False, False, True, False, False, False]
    assert sc.match_prefix_batch(q).tolist() == [4, 5, 2, 1, 5, 4, 3, 4, 1, 1, 0, 0]
    assert len(sc) == 5 and sc.memory_report()["short_sequences"] == 2


@pytest.mark.slow
def test_built_from_a_dask_bag_dataframe_arrow_and_csr(client):
    bag = db.from_sequence(SEQS, npartitions=5)
    check(rsd.build(bag, shards=4, client=client, head=3))
    dd = pytest.importorskip("dask.dataframe", reason="dask.dataframe needs pandas")
    import pandas as pd

    import dask

    with dask.config.set({"dataframe.convert-string": False}):  # keep the lists as lists
        df = dd.from_pandas(pd.DataFrame({"tokens": SEQS}), npartitions=3)
        check(rsd.build(df["tokens"], shards=3, client=client, head=5))
    strings = dd.from_pandas(pd.DataFrame({"tokens": SEQS}), npartitions=2)
    if str(strings["tokens"].dtype).startswith(("string", "str")):
        with pytest.raises(TypeError, match="convert-string"):
            rsd.build(strings["tokens"], shards=2, client=client)
    pa = pytest.importorskip("pyarrow")
    arr = pa.array(SEQS, type=pa.list_(pa.int64()))
    sc = rsd.build(arr, shards=2, client=client, head=4)
    check(sc, q=pa.array(QUERIES, type=pa.list_(pa.int64())))
    b = rs.pack(SEQS)
    check(rsd.build((b.flat, b.offsets), shards=2, client=client, head=4))


def test_insert_batch_equals_one_tree_and_is_all_or_nothing(client):
    sc = rsd.build(SEQS[:1500], shards=3, client=client, head=4)
    ref = reference(SEQS[:1500])
    more = SEQS[1000:] + [[1], [1], [5, 5]]
    np.testing.assert_array_equal(sc.insert_batch(more), ref.insert_batch(more))
    check(sc, ref)
    before = len(sc)
    for bad, exc in [(more[:5] + [[]], ValueError), ([[1, 2], [3.5]], TypeError)]:
        with pytest.raises(exc):
            sc.insert_batch(bad)
        assert len(sc) == before
    check(sc, ref)


def test_memory_report_sums_the_shards(client):
    sc = rsd.build(SEQS, shards=3, client=client, head=4)
    rep = sc.memory_report()
    b = rs.pack(SEQS)
    sid = rsd.shard_of(b, 4, 3)
    for j, shard in enumerate(rep["shards"]):
        want = reference([SEQS[i] for i in np.flatnonzero(sid == j)])
        assert shard["tokens_stored"] == want.num_tokens and shard["nodes"] == want.num_nodes
        assert rep["sequences"][j] == len(want)
    assert rep["total"]["tokens_stored"] == (sum(s["tokens_stored"] for s in rep["shards"])
                                             + rep["head"]["tokens_stored"])
    assert sum(rep["sequences"]) + rep["short_sequences"] == len(REF)
    assert rep["skew"] >= 1.0


# ---------------------------------------------------------------- workers killed

CALL_LIMIT = 60  # seconds: a call past it hangs (recovering takes a few)
TIMEOUT = 40     # the caches' own timeout: their TimeoutError says what waits


class in_background:
    """``call()`` run in a thread; ``result()`` waits for it at most
    ``seconds`` and fails the test (instead of hanging) past them."""

    def __init__(self, call):
        self._box = {}
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call):
        try:
            self._box["value"] = call()
        except BaseException as exc:  # handed to the test's thread
            self._box["error"] = exc

    def result(self, seconds=CALL_LIMIT):
        self._thread.join(seconds)
        if self._thread.is_alive():
            pytest.fail(f"the call is still waiting after {seconds} s: it hangs")
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]


def bounded(call, seconds=CALL_LIMIT):
    """``call()``'s result (or exception), within ``seconds``."""
    return in_background(call).result(seconds)


def kill(client, workers=None):
    """SIGKILL the worker processes (all when ``workers`` is None; the nanny
    restarts each at a new address); their addresses."""
    pids = client.run(os.getpid, workers=workers)
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    return set(pids)


def settled(client, gone=()):
    """Wait until the cluster has its 2 workers again, none of ``gone``."""
    end = time.monotonic() + CALL_LIMIT
    while True:
        workers = set(client.scheduler_info()["workers"])
        if len(workers) == 2 and not workers & set(gone):
            return
        assert time.monotonic() < end, f"the cluster did not recover: {workers}"
        time.sleep(0.1)


def _worker_hooks():
    """Functions for ``client.run`` (nested, so they travel by value)."""

    def slow_down(module, name, started, release):
        """On this worker, ``module.name`` first writes its pid to the file
        ``started``, then waits (at most 45 s) for the file ``release``."""
        import importlib

        mod = importlib.import_module(module)
        real = getattr(mod, name)

        def slow(*args, **kwargs):
            with open(f"{started}.{os.getpid()}", "w") as f:
                f.write(str(os.getpid()))
            os.replace(f"{started}.{os.getpid()}", started)
            end = time.monotonic() + 45
            while not os.path.exists(release) and time.monotonic() < end:
                time.sleep(0.02)
            return real(*args, **kwargs)

        slow.__wrapped__ = real
        setattr(mod, name, slow)

    def restore(module, name):
        import importlib

        mod = importlib.import_module(module)
        setattr(mod, name, getattr(getattr(mod, name), "__wrapped__", getattr(mod, name)))

    return slow_down, restore


SLOW_DOWN, RESTORE = _worker_hooks()


class Slowed:
    """``module.name`` made to wait on ``workers`` (all when None) until
    released: ``with Slowed(client, tmp_path, module, name, workers) as s:``,
    then ``s.wait_started()`` and ``s.kill()`` (the worker it started on;
    the others then go on)."""

    def __init__(self, client, tmp_path, module, name, workers=None):
        self.client, self.module, self.name, self.workers = client, module, name, workers
        self.started, self.release = tmp_path / f"{name}.started", tmp_path / f"{name}.release"
        self.gone = set()

    def __enter__(self):
        self.pids = self.client.run(os.getpid, workers=self.workers)
        self.client.run(SLOW_DOWN, self.module, self.name, str(self.started),
                        str(self.release), workers=self.workers)
        return self

    def wait_started(self):
        end = time.monotonic() + CALL_LIMIT
        while not self.started.exists():
            assert time.monotonic() < end, f"{self.name} never started on the slowed worker"
            time.sleep(0.02)

    def kill(self):
        pid = int(self.started.read_text())
        os.kill(pid, signal.SIGKILL)
        self.gone = {w for w, p in self.pids.items() if p == pid}
        self.release.touch()
        return self.gone

    def __exit__(self, *exc):
        self.release.touch()
        alive = [w for w in self.pids if w not in self.gone]  # a killed one comes back unpatched
        if alive:
            self.client.run(RESTORE, self.module, self.name, workers=alive)


def test_shards_keep_no_worker_restriction_once_placed(client):
    settled(client)
    sc = rsd.build(SEQS, shards=4, client=client, head=3)
    back = sc.insert_batch([[4, 4, 4, 4]])
    restrictions = client.run_on_scheduler(
        lambda dask_scheduler, keys: [dask_scheduler.tasks[k].worker_restrictions for k in keys],
        keys=[f.key for f in sc._shards])
    assert restrictions == [None] * 4 and back.tolist() == [True]


@pytest.mark.slow
@pytest.mark.parametrize("call", ["exists_batch", "match_prefix_batch", "insert_batch", "save",
                                  "memory_report"])
def test_every_worker_killed_right_before_a_call_is_recomputed(client, tmp_path, call):
    # every shard is lost while no worker runs: before shards were unpinned,
    # their recomputation waited forever for the dead workers' addresses
    settled(client)
    sc = rsd.build(SEQS, shards=4, client=client, head=3, timeout=TIMEOUT)
    ref = reference(SEQS)
    gone = kill(client)
    if call == "exists_batch":
        np.testing.assert_array_equal(bounded(lambda: sc.exists_batch(QUERIES)), WANT_EXISTS)
    elif call == "match_prefix_batch":
        np.testing.assert_array_equal(bounded(lambda: sc.match_prefix_batch(QUERIES)),
                                      WANT_MATCH)
    elif call == "insert_batch":
        more = [[5, 5, 5, 5], [1], [7, 7, 7, 7, 7, 0, 0, 0]]
        np.testing.assert_array_equal(bounded(lambda: sc.insert_batch(more)),
                                      ref.insert_batch(more))
    elif call == "save":
        bounded(lambda: sc.save(tmp_path / "t"))
    else:
        rep = bounded(sc.memory_report)
        assert sum(rep["sequences"]) + rep["short_sequences"] == len(REF)
    settled(client, gone)
    check(sc, ref)
    if call == "save":
        check(bounded(lambda: rsd.load(tmp_path / "t", client=client)), ref)


@pytest.mark.slow
@pytest.mark.parametrize("call", ["exists_batch", "insert_batch", "save", "build", "load"])
def test_a_worker_killed_while_its_task_runs_is_recomputed(client, tmp_path, call):
    settled(client)
    ref = reference(SEQS)
    module, name = {"exists_batch": ("radix_soa.dask._sharded", "_lookup"),
                    "insert_batch": ("radix_soa.dask._sharded", "_insert_copy"),
                    "save": ("radix_soa.dask._store", "_save_shard"),
                    "build": ("radix_soa.dask._sharded", "_build_shard"),
                    "load": ("radix_soa.dask._store", "load_shard")}[call]
    if call == "load":
        rsd.build(SEQS, shards=4, client=client, head=3).save(tmp_path / "t")
    else:
        sc = rsd.build(SEQS, shards=4, client=client, head=3)
    more = SEQS[:100] + [[5, 5, 5, 5, 5]]
    with Slowed(client, tmp_path, module, name) as slowed:
        pending = in_background({
            "exists_batch": lambda: sc.exists_batch(QUERIES),
            "insert_batch": lambda: sc.insert_batch(more),
            "save": lambda: sc.save(tmp_path / "t"),
            "build": lambda: rsd.build(SEQS, shards=4, client=client, head=3),
            "load": lambda: rsd.load(tmp_path / "t", client=client)}[call])
        slowed.wait_started()  # a task of the call is running: kill its worker
        gone = slowed.kill()
        got = pending.result()
    if call == "exists_batch":
        np.testing.assert_array_equal(got, WANT_EXISTS)
    elif call == "insert_batch":
        np.testing.assert_array_equal(got, ref.insert_batch(more))
    elif call == "save":
        sc = bounded(lambda: rsd.load(tmp_path / "t", client=client))
    else:
        sc = got
    settled(client, gone)
    check(sc, ref)


@pytest.mark.slow
def test_a_worker_killed_between_submit_and_gather_gives_exact_answers(client, monkeypatch):
    settled(client)
    sc = rsd.build(SEQS[:1500], shards=4, client=client, head=3, timeout=TIMEOUT)
    ref = reference(SEQS[:1500])
    real = rsd.ShardedCache._gather
    killed = []

    def gather_after_a_kill(self, *args):
        if not killed:  # the tasks are submitted; the worker holding shard 1 dies
            killed.extend(kill(client, [sc._where()[1][0]]))
        return real(self, *args)

    monkeypatch.setattr(rsd.ShardedCache, "_gather", gather_after_a_kill)
    more = SEQS[1000:]
    np.testing.assert_array_equal(bounded(lambda: sc.insert_batch(more)),
                                  ref.insert_batch(more))
    assert killed
    settled(client, killed)
    gone = list(killed)
    killed.clear()
    np.testing.assert_array_equal(bounded(lambda: sc.match_prefix_batch(QUERIES)),
                                  ref.match_prefix_batch(QUERIES))
    assert killed
    monkeypatch.setattr(rsd.ShardedCache, "_gather", real)
    settled(client, gone + killed)  # restarted at new addresses
    check(sc, ref)


@pytest.mark.slow
def test_a_task_that_kills_every_worker_it_runs_on_raises_killed_worker(client):
    settled(client)
    sc = rsd.build(SEQS, shards=1, client=client, head=3, timeout=TIMEOUT)  # one lookup task

    class Poison(distributed.WorkerPlugin):  # nested: travels by value
        """Every worker, restarted ones too, dies when it answers a lookup."""

        name = "poison-lookup"

        def setup(self, worker):
            import radix_soa.dask._sharded as m

            def die(*args):
                os.kill(os.getpid(), signal.SIGKILL)

            die.__wrapped__ = m._lookup
            m._lookup = die

        def teardown(self, worker):
            import radix_soa.dask._sharded as m

            m._lookup = getattr(m._lookup, "__wrapped__", m._lookup)

    client.register_plugin(Poison())
    try:
        with pytest.raises(distributed.KilledWorker) as e:
            bounded(lambda: sc.exists_batch(QUERIES))
        assert "raised by shard" in " ".join(getattr(e.value, "__notes__", []))
    finally:
        client.unregister_worker_plugin(Poison.name)
    settled(client)
    client.run(RESTORE, "radix_soa.dask._sharded", "_lookup")  # one restarted meanwhile
    check(sc)  # the shards lost on the way are recomputed


@pytest.mark.slow
def test_a_lost_shard_that_cannot_be_reloaded_is_an_error_naming_it(client, tmp_path):
    settled(client)
    rsd.build(SEQS, shards=3, client=client, head=3).save(tmp_path / "t")
    sc = rsd.load(tmp_path / "t", client=client)
    check(sc)
    shutil.rmtree(tmp_path / "t")  # the directory its shards would be reloaded from
    gone = kill(client)
    with pytest.raises(rs.TreeFormatError, match=r"shard \d \(shard-0000\d\) is missing"):
        bounded(lambda: sc.exists_batch(QUERIES))
    settled(client, gone)


@pytest.mark.slow
def test_a_call_past_its_timeout_names_the_shards_and_changes_nothing(client, tmp_path):
    settled(client)
    sc = rsd.build(SEQS, shards=3, client=client, head=3, timeout=30)
    assert sc.timeout == 30.0
    sc.timeout = 1.5
    before = len(sc)
    with Slowed(client, tmp_path, "radix_soa.dask._sharded", "_insert_copy"):
        t = time.monotonic()
        with pytest.raises(TimeoutError,
                           match=r"insert_batch: shard \d \(task (processing|waiting)\)"):
            bounded(lambda: sc.insert_batch([[5, 5, 5, 5, 5], [6, 6, 6]]))
        assert time.monotonic() - t < 15
    assert len(sc) == before
    sc.timeout = 30
    check(sc)
    with pytest.raises(ValueError, match="timeout"):
        sc.timeout = 0
    with pytest.raises(TypeError, match="timeout"):
        rsd.build(SEQS[:10], client=client, timeout="soon")
    with pytest.raises(ValueError, match="timeout"):
        rsd.load(tmp_path, client=client, timeout=float("inf"))


def test_bad_arguments_raise_and_name_them(client):
    with pytest.raises(ValueError, match="shards"):
        rsd.build(SEQS, shards=0, client=client)
    with pytest.raises(TypeError, match="head"):
        rsd.build(SEQS, head=1.5, client=client)
    with pytest.raises(ValueError, match="empty"):
        rsd.build([[1], []], client=client)
    empty = rsd.build([], shards=2, client=client, head=2)
    assert len(empty) == 0
    assert empty.exists_batch([[1], [], [1, 2, 3]]).tolist() == [False] * 3
    assert empty.match_prefix_batch([[1], [], [1, 2, 3]]).tolist() == [0] * 3
    sc = rsd.build(SEQS[:10], shards=2, client=client, head=2)
    with pytest.raises(TypeError, match="dask collections"):
        sc.insert_batch(db.from_sequence(QUERIES[:10]))


def test_without_dask_the_import_says_how_to_install():
    code = ("import sys; sys.modules['dask'] = None; sys.modules['distributed'] = None\n"
            "try:\n    import radix_soa.dask\nexcept ImportError as e:\n    print(e)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert "pip install radix-soa[dask]" in out.stdout, out.stderr


@pytest.mark.slow
def test_dask_collections_as_queries_give_dask_arrays(client):
    import dask.array as da

    sc = rsd.build(SEQS, shards=3, client=client, head=4)
    bag = db.from_sequence([[int(t) for t in q] for q in QUERIES], npartitions=5)
    got = sc.exists_batch(bag)
    assert isinstance(got, da.Array) and got.numblocks == (bag.npartitions,)
    np.testing.assert_array_equal(got.compute(), WANT_EXISTS)
    np.testing.assert_array_equal(sc.match_prefix_batch(bag).compute(), WANT_MATCH)


@pytest.mark.slow
def test_saved_and_loaded_by_the_workers(client, tmp_path):
    sc = rsd.build(SEQS, shards=3, client=client, head=4)
    sc.save(tmp_path / "tree")
    assert sorted(os.listdir(tmp_path)) == ["tree"]  # no temporary left beside it
    for mmap in (False, True):
        back = rsd.load(tmp_path / "tree", mmap=mmap, client=client)
        assert (back.shards, back.head) == (3, 4)
        np.testing.assert_array_equal(back.shard_lengths, sc.shard_lengths)
        check(back)
    more = [[5, 5, 5, 5, 5], [1], [7, 7, 7, 7, 7, 0]]
    ref = reference(SEQS)
    np.testing.assert_array_equal(back.insert_batch(more), ref.insert_batch(more))  # on copies
    check(back, ref)
    back.save(tmp_path / "tree")  # replaces its own directory
    check(rsd.load(tmp_path / "tree", client=client), ref)


def test_saving_never_replaces_what_it_did_not_write(client, tmp_path):
    sc = rsd.build(SEQS[:100], shards=2, client=client, head=2)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        sc.save(other)
    assert os.listdir(other) == ["keep.txt"]


def write_manifest(path, header):
    """An edited header.json with its checksum recomputed: an edit the
    checksum cannot see."""
    from radix_soa._tree.persist import header_crc

    header["header_crc32"] = header_crc(header)
    (path / "header.json").write_text(json.dumps(header))


@pytest.fixture(scope="module")
def saved(client, tmp_path_factory):
    """A save of 20,000 sequences on 4 shards (and a second save of them)."""
    rng = np.random.default_rng(7)
    seqs = [list(rng.integers(0, 50, int(rng.integers(1, 30)))) for _ in range(20_000)]
    sc = rsd.build(seqs, shards=4, client=client, head=2)
    root = tmp_path_factory.mktemp("saved")
    sc.save(root / "a")
    sc.save(root / "b")
    return root, reference(seqs), seqs


def test_a_damaged_directory_is_refused(client, saved, tmp_path):
    shutil.copytree(saved[0] / "a", tmp_path / "t")
    header = tmp_path / "t" / "header.json"
    good = header.read_text()
    header.write_text(good.replace('"shards": 4', '"shards": 3'))
    with pytest.raises(rs.TreeFormatError, match="checksum"):
        rsd.load(tmp_path / "t", client=client)
    h = json.loads(good)
    h["sequences"][0] += 1
    write_manifest(tmp_path / "t", h)
    with pytest.raises(rs.TreeFormatError, match="shard 0 holds"):
        rsd.load(tmp_path / "t", client=client)
    header.write_text(good)
    shutil.rmtree(tmp_path / "t" / "shard-00001")
    with pytest.raises(rs.TreeFormatError, match=r"shard 1 \(shard-00001\) is missing"):
        rsd.load(tmp_path / "t", client=client)
    with pytest.raises(rs.TreeFormatError, match="not a ShardedCache"):
        rsd.load(tmp_path / "t" / "head", client=client)


def _swap(t, h, other):
    os.rename(t / "shard-00000", t / "x")
    os.rename(t / "shard-00001", t / "shard-00000")
    os.rename(t / "x", t / "shard-00001")
    h["sequences"][:2] = h["sequences"][1::-1]


def _fewer_shards(t, h, other):
    h["shards"] -= 1
    h["sequences"].pop()


def _fewer_shards_and_the_last_removed(t, h, other):
    _fewer_shards(t, h, other)
    shutil.rmtree(t / "shard-00003")


def _copied_over(t, h, other):
    shutil.rmtree(t / "shard-00001")
    shutil.copytree(t / "shard-00000", t / "shard-00001")
    h["sequences"][1] = h["sequences"][0]


def _from_another_save(t, h, other):
    shutil.rmtree(t / "shard-00002")
    shutil.copytree(other / "shard-00002", t / "shard-00002")


def _head_tree_of_another_save(t, h, other):
    shutil.rmtree(t / "head")
    shutil.copytree(other / "head", t / "head")


def _another_head(t, h, other):
    h["head"] = 3


def _another_save_id(t, h, other):
    h["save"] = "0" * 32


def _an_extra_shard(t, h, other):
    shutil.copytree(t / "shard-00000", t / "shard-00004")


EDITS = [
    (_swap, r"shard 0 \(shard-00000\) is another part of the save: its header says part=1"),
    (_fewer_shards, r"holds shard-00003 beyond its 3 shards"),
    (_fewer_shards_and_the_last_removed, r"the head tree \(head/\) was saved with another "
                                         r"shard count: its header says shards=4"),
    (_copied_over, r"shard 1 \(shard-00001\) is another part of the save"),
    (_from_another_save, r"shard 2 \(shard-00002\) belongs to another save"),
    (_head_tree_of_another_save, r"the head tree \(head/\) belongs to another save"),
    (_another_head, r"the head tree \(head/\) was saved with another head"),
    (_another_save_id, r"the head tree \(head/\) belongs to another save"),
    (_an_extra_shard, r"holds shard-00004 beyond its 4 shards"),
]


@pytest.mark.parametrize("edit, message", EDITS, ids=[e.__name__[1:] for e, _ in EDITS])
def test_a_manifest_edited_behind_its_checksum_is_refused(client, saved, tmp_path, edit,
                                                          message):
    # each of these used to load and then answer wrongly (stored sequences
    # missed, a wrong len): every count the header states is checked against
    # the parts, which carry their identity under their own checksum
    root, ref, seqs = saved
    t = tmp_path / "t"
    shutil.copytree(root / "a", t)
    h = json.loads((t / "header.json").read_text())
    edit(t, h, root / "b")  # b: another save of the same sequences
    write_manifest(t, h)
    with pytest.raises(rs.TreeFormatError, match=message):
        rsd.load(t, client=client, timeout=TIMEOUT)


@pytest.mark.slow
def test_the_saved_directory_loads_whole_and_its_parts_as_plain_trees(client, saved):
    root, ref, seqs = saved
    back = rsd.load(root / "a", client=client, mmap=True)
    assert len(back) == len(ref)
    assert back.exists_batch(seqs).all()
    parts = [rs.RadixCache.load(root / "a" / f"shard-{j:05d}") for j in range(4)]
    assert sum(map(len, parts)) == sum(back.shard_lengths)  # a shard is a plain tree too


@pytest.mark.parametrize("remove", ["head", "head/header.json", "head/tokens.npy",
                                    "shard-00002/header.json", "shard-00002/meta.npy"])
def test_a_missing_part_is_a_tree_format_error(client, saved, tmp_path, remove):
    shutil.copytree(saved[0] / "a", tmp_path / "t")
    target = tmp_path / "t" / remove
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    part = remove.split("/")[0]
    with pytest.raises(rs.TreeFormatError, match=part):
        rsd.load(tmp_path / "t", client=client, timeout=TIMEOUT)


def test_a_save_without_part_identities_is_refused(client, saved, tmp_path):
    shutil.copytree(saved[0] / "a", tmp_path / "t")
    h = json.loads((tmp_path / "t" / "header.json").read_text())
    del h["save"]  # what saves before part identities wrote
    write_manifest(tmp_path / "t", h)
    with pytest.raises(rs.TreeFormatError, match="no save id"):
        rsd.load(tmp_path / "t", client=client)


def _rows(sweep):
    return [{k: v for k, v in row.items() if k != "seconds"} for row in sweep.rows]


def test_sweeps_equal_rs_sweep(client):
    trace = rs.workloads.generate("multi_turn", n=40)
    other = rs.workloads.generate("few_shot", n=60)
    caps = [None, 2000, 500]
    want = rs.sweep(trace, caps, threads=1, page_size=2)
    done = []
    got = rsd.sweep(trace, caps, client=client, page_size=2, progress=done.append)
    assert _rows(got) == _rows(want) and done == [1, 2, 3]
    np.testing.assert_array_equal(got.results[1].hits, want.results[1].hits)
    many = rsd.sweep_many({"a": trace, "b": other}, caps, schedules=["fcfs", "lpm"],
                          client=client)
    assert list(many) == [("a", "fcfs"), ("a", "lpm"), ("b", "fcfs"), ("b", "lpm")]
    for (name, schedule), res in many.items():
        tr = trace if name == "a" else other
        assert _rows(res) == _rows(rs.sweep(tr, caps, threads=1, schedule=schedule))


def test_a_worker_killed_during_a_sweep_is_recomputed(client, tmp_path):
    settled(client)
    trace = rs.workloads.generate("multi_turn", n=40)
    caps = [None, 2000, 500, 100]
    want = rs.sweep(trace, caps, threads=1)
    with Slowed(client, tmp_path, "radix_soa.studies.replay", "replay") as slowed:
        pending = in_background(lambda: rsd.sweep(trace, caps, client=client, timeout=TIMEOUT))
        slowed.wait_started()
        gone = slowed.kill()
        got = pending.result()
    assert _rows(got) == _rows(want)
    settled(client, gone)


def test_sweep_arguments_are_checked_before_any_task(client):
    trace = rs.workloads.generate("multi_turn", n=5)
    with pytest.raises(ValueError, match="capacities"):
        rsd.sweep(trace, [], client=client)
    with pytest.raises(ValueError, match="capacities"):
        rsd.sweep(trace, [10, -1], client=client)
    with pytest.raises(ValueError, match="schedule"):
        rsd.sweep_many({"a": trace}, [10], schedules=["nope"], client=client)
    with pytest.raises(ValueError, match="page_size"):
        rsd.sweep(trace, [10], client=client, page_size=0)
    with pytest.raises(TypeError, match="traces"):
        rsd.sweep_many([trace], [10], client=client)
