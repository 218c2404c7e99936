"""The compiled cluster replay against the pure-Python one (same semantics),
each worker against ``replay``, every router's documented rule, bad input,
the sweep, and the Mooncake conversation trace over 8 workers."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

import radix_soa as rs
from radix_soa import replay, replay_cluster, sweep_cluster
from radix_soa._kernels import cluster as KC
from radix_soa.baselines.cluster_reference import cluster_reference
from radix_soa.studies.cluster import ROUTERS as CLUSTER_ROUTERS
from radix_soa.studies.traces import Trace

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"
ROUTERS = list(CLUSTER_ROUTERS)


def trace_of(seqs, namespaces=None, times=None, outputs=None, block_size=1):
    n = len(seqs)
    tr = Trace.from_sequences([np.array(s, np.int64) for s in seqs], name="t",
                              namespace=np.array(namespaces if namespaces is not None
                                                 else [0] * n, np.int64))
    return Trace(name="t", flat=tr.flat, offsets=tr.offsets,
                 timestamps=np.array(times if times is not None else [0.0] * n, np.float64),
                 input_tokens=np.diff(tr.offsets) * block_size,
                 output_tokens=np.array(outputs if outputs is not None else [0] * n, np.int64),
                 namespace=tr.namespace, block_size=block_size)


def same(r, ref):
    assert r.assignments.tolist() == ref.assignments.tolist()
    assert r.hits.tolist() == ref.hits.tolist()
    assert r.rejected.tolist() == ref.rejected.tolist()
    assert r.per_worker["evicted_ids"].tolist() == ref.evicted_ids
    assert r.per_worker["peak_ids"].tolist() == ref.peak_ids
    assert r.per_worker["final_ids"].tolist() == ref.final_ids
    assert r.per_worker["peak_outstanding"].tolist() == ref.peak_outstanding
    assert r.per_worker["busy_seconds"].tolist() == ref.busy_seconds
    assert r.first_token.tolist() == ref.first_token.tolist()
    assert r.finish.tolist() == ref.finish.tolist()


requests = st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=12),
                              st.integers(0, 1), st.floats(0, 2), st.integers(0, 30)),
                    min_size=1, max_size=40)


@given(requests, st.integers(1, 4), st.sampled_from(ROUTERS),
       st.sampled_from([None, 0, 4, 10, 30]), st.sampled_from([1, 2]),
       st.sampled_from(["lru", "lru", "lfu", "fifo"]),
       st.fixed_dictionaries({
           "slots": st.integers(1, 3), "prefill_rate": st.sampled_from([1.0, 5.0, 1e4]),
           "decode_rate": st.sampled_from([1.0, 10.0]), "load": st.sampled_from(["requests", "tokens"]),
           "prefix_pages": st.integers(1, 3), "vnodes": st.integers(1, 8),
           "cache_threshold": st.sampled_from([0.0, 0.3, 0.5, 0.9]),
           "balance_abs_threshold": st.integers(0, 3),
           "balance_rel_threshold": st.sampled_from([1.0, 1.1, 2.0]),
           "max_tree_size": st.sampled_from([None, 0, 5, 20]),
           "eviction_interval": st.sampled_from([None, 0.0, 0.5, 3.0]),
           "overlap_score_weight": st.sampled_from([0.0, 1.0, 4.0]), "seed": st.integers(0, 3)}),
       st.sampled_from([1, 16]))
def test_compiled_cluster_replay_equals_the_reference(reqs, workers, router, capacity, page,
                                                      policy, options, block):
    times = np.cumsum([t for _, _, t, _ in reqs])
    trace = trace_of([r for r, _, _, _ in reqs], [ns for _, ns, _, _ in reqs], times,
                     [o for _, _, _, o in reqs], block)
    kw = dict(workers=workers, router=router, capacity=capacity, page_size=page,
              eviction_policy=policy, **options)
    same(replay_cluster(trace, **kw), cluster_reference(trace, **kw))


def long_trace(n=120, seed=0, decode=True):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 50, size=3000)
    seqs = [np.concatenate([base[: int(rng.integers(1, 3000))], rng.integers(0, 9, size=200)])
            for _ in range(n)]
    outputs = rng.integers(0, 200, n) if decode else np.zeros(n, np.int64)
    return trace_of(seqs, times=np.arange(n) * 0.05, outputs=outputs)


@pytest.mark.parametrize("router", ["cache_aware", "kv_overlap", "prefix_hash"])
def test_trees_grow_mid_replay_and_the_replay_resumes(router, monkeypatch):
    # the trees are sized for a fair share of the trace; these routers keep
    # requests sharing a long prefix together, so one worker outgrows it
    from radix_soa._tree import storage as _storage
    grew = []
    reserve = _storage.TreeStorage.reserve

    def counted(self, tokens=0, nodes=0):
        grew.append((tokens, nodes))
        return reserve(self, tokens, nodes)

    monkeypatch.setattr(_storage.TreeStorage, "reserve", counted)
    tr = long_trace(decode=False)  # no decode load: kv_overlap goes by overlap alone
    kw = dict(workers=3, router=router, slots=2, prefill_rate=50_000.0,
              balance_abs_threshold=1000, overlap_score_weight=100.0, eviction_interval=1.0)
    same(replay_cluster(tr, **kw), cluster_reference(tr, **kw))
    assert grew  # the kernel stopped for room at least once


@pytest.mark.parametrize("router", ROUTERS)
def test_one_worker_is_replay(router):
    tr = long_trace(60, seed=1)
    r = replay_cluster(tr, workers=1, capacity=15_000, router=router)
    one = replay(tr, capacity=15_000)
    assert r.hits.tolist() == one.hits.tolist()
    assert r.assignments.tolist() == [0] * len(tr)
    assert r.evicted_ids == one.evicted_ids and r.per_worker["peak_ids"][0] == one.peak_ids
    assert r.hit_rate == one.hit_rate and r.prefill_tokens_saved == one.prefill_tokens_saved
    assert r.load_imbalance == r.request_imbalance == 1.0


@pytest.mark.parametrize("router", ["cache_aware", "kv_overlap", "prefix_hash", "random"])
def test_each_worker_replays_its_share_like_replay(router):
    tr = long_trace(90, seed=2)
    r = replay_cluster(tr, workers=3, capacity=8_000, router=router, page_size=2)
    for w in range(3):
        mine = np.flatnonzero(r.assignments == w)
        if len(mine) == 0:  # prefix_hash: every request here starts alike
            assert r.per_worker["requests"][w] == r.per_worker["peak_ids"][w] == 0
            continue
        share = replay([tr[i] for i in mine], capacity=8_000, page_size=2)
        assert r.hits[mine].tolist() == share.hits.tolist()
        assert r.per_worker["evicted_ids"][w] == share.evicted_ids
        assert r.per_worker["peak_ids"][w] == share.peak_ids
        assert r.per_worker["requests"][w] == len(mine)
        assert r.per_worker["hit_ids"][w] == share.hit_ids


def test_round_robin_sends_request_i_to_i_mod_n():
    seqs = [[i % 7, 1, 2] for i in range(23)]
    r = replay_cluster(seqs, workers=5, router="round_robin")
    assert r.assignments.tolist() == [i % 5 for i in range(23)]
    assert r.per_worker["requests"].tolist() == [5, 5, 5, 4, 4]


def test_random_is_seeded():
    seqs = [[i, 1] for i in range(200)]
    a = replay_cluster(seqs, workers=4, router="random", seed=7).assignments
    b = replay_cluster(seqs, workers=4, router="random", seed=7).assignments
    c = replay_cluster(seqs, workers=4, router="random", seed=8).assignments
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()
    assert a.tolist() == np.random.default_rng(7).integers(0, 4, 200).tolist()


def test_prefix_hash_keeps_shared_first_pages_together_and_moves_keys_only_to_a_new_worker():
    rng = np.random.default_rng(0)
    heads = rng.integers(0, 1000, size=(40, 8))
    seqs = [np.concatenate([heads[i % 40], rng.integers(0, 9, size=5)]) for i in range(400)]
    r4 = replay_cluster(seqs, workers=4, router="prefix_hash", prefix_pages=2, page_size=4)
    for i in range(40, 400):
        assert r4.assignments[i] == r4.assignments[i % 40]
    assert len(set(r4.assignments.tolist())) == 4
    r5 = replay_cluster(seqs, workers=5, router="prefix_hash", prefix_pages=2, page_size=4)
    moved = r4.assignments != r5.assignments
    assert moved.any() and (r5.assignments[moved] == 4).all()


def test_least_loaded_routes_by_outstanding_requests():
    # request 0 decodes for 10 s on worker 0, request 1 for 1 s on worker 1;
    # at t=2 only worker 1 is free, at t=20 both are (lowest id wins)
    tr = trace_of([[1], [2], [3], [4]], times=[0, 0, 2, 20], outputs=[10, 1, 1, 1])
    r = replay_cluster(tr, workers=2, router="least_loaded", decode_rate=1.0)
    assert r.assignments.tolist() == [0, 1, 1, 0]
    assert r.finish.tolist() == pytest.approx([10, 1, 3, 21], abs=1e-3)
    # by tokens: request 0 holds 11 tokens, request 1 holds 101
    tr = trace_of([[1], [2], [3]], times=[0, 0, 0], outputs=[10, 100, 1])
    assert replay_cluster(tr, workers=2, router="least_loaded", load="tokens"
                          ).assignments.tolist() == [0, 1, 0]


def test_the_service_model_queues_on_the_earliest_free_slot():
    # one worker, two slots; prefill 10 tokens/s, decode 1 token/s
    tr = trace_of([[1] * 10, [2] * 20, [3] * 10], times=[0, 0, 1], outputs=[5, 5, 5])
    r = replay_cluster(tr, workers=1, router="round_robin", slots=2, prefill_rate=10.0,
                       decode_rate=1.0)
    assert r.first_token.tolist() == pytest.approx([1, 2, 7])   # the third waits for slot 0
    assert r.finish.tolist() == pytest.approx([6, 7, 12])
    assert r.mean_ttft == pytest.approx((1 + 2 + 6) / 3)
    assert r.per_worker["busy_seconds"][0] == pytest.approx(6 + 7 + 6)
    assert r.per_worker["peak_outstanding"][0] == 3


def test_cache_aware_follows_the_cache_until_the_balance_thresholds_trip():
    # identical requests that never finish: the first is a miss (shortest
    # queue: worker 0), then each matches worker 0's tree fully, until
    # 33 outstanding - 0 > 32 and 33 > 1.1 x 0 sends one to worker 1
    tr = trace_of([[5, 6, 7, 8]] * 40, outputs=[1] * 40)
    r = replay_cluster(tr, workers=2, router="cache_aware")
    assert r.assignments[:34].tolist() == [0] * 33 + [1]
    assert r.modes[:34].tolist() == [KC.MODE_MISS] + [KC.MODE_HIT] * 32 + [KC.MODE_BALANCE]
    # (33, 1): 32 is not > 32, so the cache wins again (both trees match; lowest id)
    assert r.assignments[34] == 0 and r.modes[34] == KC.MODE_HIT
    assert r.assignments[35] == 1 and r.modes[35] == KC.MODE_BALANCE


def test_cache_aware_below_the_threshold_and_with_emptied_trees_takes_the_shortest_queue():
    seqs = [[1, 2, 3, 4, 5, i + 10] for i in range(12)]
    r = replay_cluster(seqs, workers=3, router="cache_aware", cache_threshold=0.9)
    assert r.assignments.tolist() == [i % 3 for i in range(12)]   # a 5/6 match is not > 0.9
    assert (r.modes == KC.MODE_MISS).all()
    r = replay_cluster(seqs, workers=3, router="cache_aware", max_tree_size=0,
                       eviction_interval=0.0)
    assert (r.modes == KC.MODE_MISS).all()
    r = replay_cluster(seqs, workers=3, router="cache_aware")
    assert (r.modes[1:] == KC.MODE_HIT).all() and (r.assignments == 0).all()


def test_kv_overlap_trades_overlap_against_active_blocks():
    # at t=1 request 0 has finished its prefill but still decodes (holding
    # 8 + 100 blocks); its worker holds all 8 ids of request 1
    tr = trace_of([[1, 2, 3, 4, 5, 6, 7, 8]] * 2, times=[0, 1], outputs=[100, 0])
    heavy = replay_cluster(tr, workers=2, router="kv_overlap", overlap_score_weight=100.0)
    assert heavy.assignments[1] == heavy.assignments[0] and heavy.hits[1] == 8  # 116 < 808
    light = replay_cluster(tr, workers=2, router="kv_overlap", overlap_score_weight=1.0)
    assert light.assignments[1] != light.assignments[0] and light.hits[1] == 0  # 16 < 116


def test_the_result_adds_up_over_workers():
    tr = long_trace(80, seed=4)
    r = replay_cluster(tr, workers=4, capacity=10_000, router="cache_aware", warmup=0.25)
    pw = r.per_worker
    assert pw["requests"].sum() == r.scored_requests == 60
    assert pw["hit_ids"].sum() == r.hit_ids and pw["total_ids"].sum() == r.total_ids
    assert pw["prefill_tokens_saved"].sum() == r.prefill_tokens_saved
    assert r.hit_rate == r.hit_ids / r.total_ids
    busy = pw["busy_seconds"]
    assert r.load_imbalance == pytest.approx(busy.max() / busy.mean())
    assert r.summary()["router"] == "cache_aware"


@pytest.mark.slow
def test_without_the_directory_the_replay_gives_the_same_answers(monkeypatch):
    from radix_soa._tree import storage as _storage
    tr = long_trace(40, seed=5)
    kw = dict(workers=2, capacity=6_000, router="kv_overlap")
    expected = replay_cluster(tr, **kw)
    monkeypatch.setattr(_storage, "USE_DIRECTORY", False)
    r = replay_cluster(tr, **kw)
    assert r.assignments.tolist() == expected.assignments.tolist()
    assert r.hits.tolist() == expected.hits.tolist()


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(workers=0), ValueError, "workers"), (dict(workers=1.5), TypeError, "workers"),
    (dict(router="nearest"), ValueError, "router"), (dict(schedule="lpm"), ValueError, "schedule"),
    (dict(slots=0), ValueError, "slots"), (dict(prefill_rate=0), ValueError, "prefill_rate"),
    (dict(decode_rate=float("nan")), ValueError, "decode_rate"),
    (dict(decode_rate=float("inf")), ValueError, "decode_rate"),
    (dict(arrival_rate=-1.0), ValueError, "arrival_rate"), (dict(load="bytes"), ValueError, "load"),
    (dict(prefix_pages=0), ValueError, "prefix_pages"), (dict(vnodes=0), ValueError, "vnodes"),
    (dict(cache_threshold=1.5), ValueError, "cache_threshold"),
    (dict(cache_threshold="high"), TypeError, "cache_threshold"),
    (dict(balance_abs_threshold=-1), ValueError, "balance_abs_threshold"),
    (dict(balance_rel_threshold=0.5), ValueError, "balance_rel_threshold"),
    (dict(max_tree_size=-1), ValueError, "max_tree_size"),
    (dict(eviction_interval=-2.0), ValueError, "eviction_interval"),
    (dict(overlap_score_weight=-1.0), ValueError, "overlap_score_weight"),
    (dict(seed=-1), ValueError, "seed"), (dict(capacity=-5), ValueError, "capacity"),
    (dict(page_size=0), ValueError, "page_size"), (dict(warmup=1.0), ValueError, "warmup"),
    (dict(eviction_policy="oldest"), ValueError, "eviction_policy"),
])
def test_bad_options_are_refused_by_name(kwargs, exc, name):
    tr = trace_of([[1, 2], [1, 3]])
    before = tr.flat.copy()
    with pytest.raises(exc, match=name):
        replay_cluster(tr, **kwargs)
    assert np.array_equal(tr.flat, before)


def test_an_empty_trace_and_bad_timestamps_are_refused():
    with pytest.raises(ValueError, match="empty"):
        replay_cluster(Trace.from_sequences([]), workers=2)
    with pytest.raises(ValueError, match="timestamps"):
        replay_cluster(trace_of([[1], [2]], times=[0.0, float("nan")]), workers=2)


def test_the_sweep_nests_workers_routers_capacities_and_checks_everything_first():
    tr = long_trace(40, seed=6)
    calls = []
    table = sweep_cluster(tr, workers=[1, 3], capacities=[None, 5_000],
                          routers=["round_robin", "cache_aware"], progress=calls.append)
    keys = [(row["workers"], row["router"], row["capacity"]) for row in table.rows]
    assert keys == [(w, r, c) for w in (1, 3) for r in ("round_robin", "cache_aware")
                    for c in (None, 5_000)]
    assert sorted(calls) == list(range(1, 9))
    direct = replay_cluster(tr, workers=3, capacity=5_000, router="cache_aware")
    assert table.results[-1].hits.tolist() == direct.hits.tolist()
    assert table.to_dict()["hit_rate"][-1] == direct.hit_rate
    assert table.to_csv().splitlines()[0].startswith("workers,router,capacity,hit_rate")
    assert "imbalance" in str(table)
    seen = []
    with pytest.raises(ValueError, match="router"):
        sweep_cluster(tr, workers=[1, 2], routers=["round_robin", "bogus"], progress=seen.append)
    with pytest.raises(ValueError, match="workers"):
        sweep_cluster(tr, workers=[2, 0], progress=seen.append)
    with pytest.raises(ValueError, match="capacities"):
        sweep_cluster(tr, workers=[2], capacities=[])
    assert seen == []


def test_warmup_cluster_leaves_nothing_to_compile():
    from radix_soa._warmup import warmup_cluster
    from radix_soa.studies.study import generated_trace
    import importlib
    import pkgutil
    import radix_soa._kernels as K

    def signatures():
        out = {}
        for m in pkgutil.iter_modules(K.__path__):
            mod = importlib.import_module(f"radix_soa._kernels.{m.name}")
            out.update({(m.name, k): len(v.signatures) for k, v in vars(mod).items()
                        if hasattr(v, "signatures")})
        return out

    warmup_cluster()
    before = signatures()
    tr, _ = generated_trace("multi_turn", 200, 0)
    for router in ROUTERS:
        replay_cluster(tr, workers=4, capacity=2_000, router=router, page_size=2)
    after = signatures()
    assert {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v} == {}


# ---------------------------------------------------------------- the real trace

def mooncake(name):
    path = TRACES / "mooncake-fast25" / name
    if not path.exists():
        pytest.skip(f"real traces not present at {path}")
    return rs.traces.load_mooncake(path)


def test_mooncake_conversation_over_8_workers():
    tr = mooncake("conversation_trace.jsonl")
    kw = dict(workers=8, capacity=20_000)
    rr = replay_cluster(tr, router="round_robin", **kw)
    ca = replay_cluster(tr, router="cache_aware", **kw)
    kv = replay_cluster(tr, router="kv_overlap", **kw)
    single = replay(tr, capacity=20_000)
    # round robin splits every conversation over 8 caches; routing by prefix keeps them
    assert rr.hit_rate < kv.hit_rate < ca.hit_rate
    assert ca.hit_rate > single.hit_rate  # 8 caches of 20k hold more than one
    assert rr.request_imbalance == pytest.approx(1.0, abs=1e-3)
    for r in (rr, ca, kv):
        assert r.per_worker["requests"].sum() == len(tr)
        assert (r.per_worker["peak_ids"] <= 20_000).all()
