"""The compiled replay against the pure-Python replay (same semantics), the
published Mooncake figures, and the schedule module."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

import radix_soa as rs
from radix_soa import replay, sweep
from radix_soa.baselines.replay_reference import replay_reference
from radix_soa.studies.traces import Trace

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"


# fields that measure the implementation itself, not what the replay found
IMPLEMENTATION_FIELDS = {"peak_index_bytes", "final_index_bytes", "seconds"}


def same(a, b):
    """Every result field of the compiled replay ``a`` equals the reference's."""
    names = [f.name for f in dataclasses.fields(rs.ReplayResult)]
    compared = 0
    for name in names:
        if name in IMPLEMENTATION_FIELDS:
            continue
        ours, ref = getattr(a, name), getattr(b, name)
        if name == "rejected":
            ref = int(ref.sum())
        if isinstance(ours, np.ndarray):
            assert ours.tolist() == ref.tolist(), name
        else:
            assert ours == ref, name
        compared += 1
    assert compared == len(names) - len(IMPLEMENTATION_FIELDS)


def small_trace(seqs, namespaces):
    return Trace.from_sequences([np.array(s, np.int64) for s in seqs], name="t",
                                namespace=np.array(namespaces, np.int64))


requests = st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=12),
                              st.integers(0, 1)), min_size=1, max_size=40)


@given(requests, st.sampled_from([None, 0, 3, 8, 20]), st.sampled_from([None, 0, 5, 30]),
       st.sampled_from([1, 2]), st.sampled_from(["fcfs", "lpm", "dfs"]), st.integers(1, 5),
       st.sampled_from(["lru", "lru", "lfu", "fifo", "mru", "filo", "priority"]),
       st.sampled_from([0.0, 0.0, 0.25, 0.5, 0.9]))
def test_compiled_replay_equals_the_reference(reqs, capacity, host, page, schedule, window,
                                              policy, warmup):
    trace = small_trace([r for r, _ in reqs], [ns for _, ns in reqs])
    kw = dict(capacity=capacity, host_capacity=host, page_size=page, schedule=schedule,
              window=window, eviction_policy=policy, warmup=warmup)
    same(replay(trace, **kw), replay_reference(trace, **kw))


def test_resuming_after_growth_gives_the_same_result():
    # long distinct requests make both tiers grow (and compact) mid-replay
    rng = np.random.default_rng(0)
    base = rng.integers(0, 50, size=3000)
    seqs = [np.concatenate([base[: int(rng.integers(1, 3000))], rng.integers(0, 9, size=300)])
            for _ in range(150)]
    kw = dict(capacity=20_000, host_capacity=40_000, schedule="lpm", window=8)
    same(replay(seqs, **kw), replay_reference(seqs, **kw))


def test_dead_runs_are_compacted_mid_replay():
    rng = np.random.default_rng(3)
    seqs = [rng.integers(0, 10**6, size=1000) for _ in range(300)]
    seqs += seqs[-5:]
    kw = dict(capacity=4000, host_capacity=3000)
    r = replay(seqs, **kw)
    same(r, replay_reference(seqs, **kw))
    assert r.evicted_ids > 290_000
    assert r.peak_index_bytes < 600_000  # buffers were compacted, not grown to 300k tokens
    assert r.host_hits[-5:].sum() > 0  # LRU cycling: the device misses, the host tier holds them


def test_result_accounting():
    seqs = rs.workloads.shared_prefix(n_sequences=300, n_prompts=5, prompt_len=100,
                                      tail_len=(10, 50), seed=2)
    lengths = np.array([len(s) for s in seqs])
    full = replay(seqs)
    assert full.evicted_ids == 0 and full.rejected == 0
    assert full.total_ids == lengths.sum() == full.prefill_tokens
    assert np.all(full.hits <= lengths) and np.all(full.hits >= 0)
    rc = rs.RadixCache()  # unbounded: the cache ends holding exactly the tree of all requests
    rc.insert_batch(seqs)
    assert full.final_ids == rc.num_tokens == full.peak_ids
    small = replay(seqs, capacity=1000)
    assert small.peak_ids <= 1000
    assert small.hit_ids < full.hit_ids
    assert small.prefill_tokens_saved == small.hit_ids  # block size 1, hits <= inputs
    assert small.order.tolist() == list(range(300))
    summary = small.summary()
    assert summary["hit_rate"] == pytest.approx(small.hit_ids / small.total_ids)
    assert "hits" not in summary


def test_a_request_longer_than_the_capacity_is_not_cached():
    r = replay([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [1, 2], [1, 2, 9]], capacity=3)
    assert r.rejected == 2 and r.hits.tolist() == [0, 0, 0, 2] and r.final_ids == 3


def test_host_tier_returns_what_the_device_evicted():
    a, b = list(range(10)), list(range(100, 110))
    r = replay([a, b, a], capacity=10, host_capacity=100)
    assert r.hits.tolist() == [0, 0, 0] and r.host_hits.tolist() == [0, 0, 10]
    r = replay([a, b, a], capacity=10)  # without a host tier it is recomputed
    assert r.host_hits.tolist() == [0, 0, 0]


def test_block_size_converts_hits_to_prefill_tokens():
    tr = Trace(name="blocks", flat=np.array([1, 2, 1, 2, 3], np.int64),
               offsets=np.array([0, 2, 5], np.int64), timestamps=np.zeros(2),
               input_tokens=np.array([1000, 1200], np.int64), output_tokens=np.zeros(2, np.int64),
               namespace=np.zeros(2, np.int64), block_size=512)
    r = replay(tr)
    assert r.hits.tolist() == [0, 2]
    assert r.prefill_tokens_saved == 1024 and r.prefill_tokens == 2200


def block_trace():
    # 512-token blocks; the last block of each request is partial
    return Trace(name="blocks", flat=np.array([1, 2, 1, 2, 3, 1, 2, 3, 4], np.int64),
                 offsets=np.array([0, 2, 5, 9], np.int64), timestamps=np.zeros(3),
                 input_tokens=np.array([1000, 1200, 1600], np.int64),
                 output_tokens=np.zeros(3, np.int64), namespace=np.zeros(3, np.int64),
                 block_size=512)


def test_token_weighted_hit_rate_caps_each_hit_at_the_input_length():
    r = replay(block_trace())
    assert r.hits.tolist() == [0, 2, 3]
    # request 2: min(2 x 512, 1200) = 1024; request 3: min(3 x 512, 1600) = 1536
    assert r.prefill_tokens_hit == 1024 + 1536 and r.prefill_tokens == 3800
    assert r.token_hit_rate == pytest.approx(2560 / 3800)
    assert r.hit_rate == pytest.approx(5 / 9)  # ids
    tokens = replay([[1, 2, 3], [1, 2, 4]])  # a token trace: both rates agree
    assert tokens.token_hit_rate == tokens.hit_rate == pytest.approx(2 / 6)


def test_warmup_scores_only_the_last_requests():
    tr = block_trace()
    whole = replay(tr)
    r = replay(tr, warmup=0.5)  # floor(0.5 x 3) = 1 request warms the cache
    assert r.scored_requests == 2 and r.warmup == 0.5 and r.requests == 3
    assert r.hits.tolist() == whole.hits.tolist()  # the same replay, scored differently
    assert (r.hit_ids, r.total_ids) == (5, 7)
    assert (r.prefill_tokens_hit, r.prefill_tokens) == (2560, 2800)
    assert r.token_hit_rate == pytest.approx(2560 / 2800)
    assert r.request_hit_rate == 1.0 and whole.request_hit_rate == pytest.approx(2 / 3)
    assert r.peak_ids == whole.peak_ids == 4  # cache measures cover the whole replay
    assert replay(tr, warmup=0.9).scored_requests == 1
    table = sweep(tr, [2, 4], warmup=0.5)
    assert [x.scored_requests for x in table.results] == [2, 2]
    assert "scored: the last 2 of 3 requests (the first 50%" in str(table)


@pytest.mark.parametrize("bad, exc", [(1.0, ValueError), (-0.1, ValueError),
                                      (float("nan"), ValueError), ("0.5", TypeError),
                                      (True, TypeError), (None, TypeError)])
def test_bad_warmup(bad, exc):
    with pytest.raises(exc, match="warmup"):
        replay([[1, 2]], warmup=bad)


def test_result_names_count_ids():
    r = replay([[1, 2, 3], [1, 2, 4]], capacity=3)
    assert r.total_ids == 6 and r.hit_ids == 2 and r.evicted_ids == 1  # 3 makes room for 4
    assert not hasattr(r, "hit_tokens") and not hasattr(r, "peak_tokens")
    assert not any(k.endswith("_tokens") and k not in ("prefill_tokens",)
                   for k in r.summary() if not k.startswith("prefill"))


def test_namespaces_are_kept_apart():
    tr = small_trace([[1, 2, 3], [1, 2, 3], [1, 2, 3]], [0, 1, 0])
    assert replay(tr).hits.tolist() == [0, 0, 3]


@pytest.mark.parametrize("kwargs, exc", [
    (dict(schedule="random"), ValueError), (dict(capacity=-1), ValueError),
    (dict(capacity=1.5), TypeError), (dict(capacity="big"), TypeError),
    (dict(page_size=0), ValueError), (dict(window=0), ValueError),
    (dict(host_capacity=-5), ValueError),
])
def test_bad_arguments(kwargs, exc):
    with pytest.raises(exc):
        replay([[1, 2]], **kwargs)


def test_empty_trace_is_an_error():
    with pytest.raises(ValueError):
        replay([])


def test_sweep_rows_equal_single_replays():
    seqs = rs.workloads.shared_prefix(n_sequences=200, n_prompts=5, prompt_len=80,
                                      tail_len=(10, 40), seed=4)
    caps = [300, 1000, 3000, None]
    table = sweep(seqs, caps, schedule="dfs", threads=2)
    assert [r["capacity"] for r in table.rows] == caps
    for cap, row in zip(caps, table.rows):
        assert row["hit_rate"] == replay(seqs, capacity=cap, schedule="dfs").hit_rate
    assert set(table.to_dict()) == set(table.COLUMNS)
    assert "unbounded" in str(table)
    with pytest.raises(ValueError):
        sweep(seqs, [])


def test_schedule_module_orders():
    q = rs.pack([[5, 1], [1, 2, 3], [5, 0], [1, 2]])
    assert rs.schedule.dfs_order(q).tolist() == [3, 1, 2, 0]
    assert rs.schedule.dfs_order(q, window=2).tolist() == [1, 0, 2, 3]  # 2nd window reversed
    assert rs.schedule.dfs_order(q, namespaces=[1, 0, 1, 0]).tolist() == [3, 1, 2, 0]
    assert rs.schedule.fcfs_order(q).tolist() == [0, 1, 2, 3]
    pc = rs.PrefixCache(values=False)
    pc.insert([1, 2, 3, 4])
    assert rs.schedule.lpm_order(pc, q).tolist() == [1, 3, 0, 2]
    assert pc.stats["lookups"] == 0  # read only


def test_scheduling_changes_hits_under_pressure():
    # two interleaved families of long shared prefixes: grouping them helps
    rng = np.random.default_rng(1)
    fams = [rng.integers(0, 1000, size=400) for _ in range(6)]
    seqs = [np.concatenate([fams[i % 6], rng.integers(0, 1000, size=20)]) for i in range(240)]
    fcfs = replay(seqs, capacity=1500)
    dfs = replay(seqs, capacity=1500, schedule="dfs", window=24)
    lpm = replay(seqs, capacity=1500, schedule="lpm", window=24)
    assert dfs.hit_rate > fcfs.hit_rate and lpm.hit_rate > fcfs.hit_rate


# ---------------------------------------------------------------- published figures

def mooncake(name):
    path = TRACES / "mooncake-fast25" / name
    if not path.exists():
        pytest.skip(f"real traces not present at {path}")
    return rs.traces.load_mooncake(path)


@pytest.mark.parametrize("name, expected", [("conversation_trace.jsonl", 0.37),
                                            ("synthetic_trace.jsonl", 0.64)])
def test_mooncake_unbounded_block_hit_rate(name, expected):
    tr = mooncake(name)
    r = replay(tr)
    assert r.hit_rate == pytest.approx(expected, abs=0.01)
    assert r.requests == len(tr)
    capped = replay(tr, capacity=r.peak_ids // 10)
    assert capped.hit_rate < r.hit_rate and capped.peak_ids <= r.peak_ids // 10


@pytest.mark.slow
def test_mooncake_capacity_sweep_matches_the_reference_at_one_point():
    tr = mooncake("conversation_trace.jsonl")
    kw = dict(capacity=20_000, schedule="lpm", window=16)
    same(replay(tr, **kw), replay_reference(tr, **kw))


def compiled_signatures():
    import importlib
    import pkgutil
    import radix_soa._kernels as K
    out = {}
    for m in pkgutil.iter_modules(K.__path__):
        mod = importlib.import_module(f"radix_soa._kernels.{m.name}")
        for name, obj in vars(mod).items():
            if hasattr(obj, "signatures"):
                out[(mod.__name__, name)] = len(obj.signatures)
    return out


def test_warmup_replay_leaves_nothing_to_compile_for_a_study():
    from radix_soa._warmup import warmup_replay
    from radix_soa.studies.study import generated_trace
    warmup_replay()
    before = compiled_signatures()
    tr, _ = generated_trace("multi_turn", 300, 0)  # a Trace: writable arrays, unlike pack()'s
    for kw in (dict(), dict(capacity=2000), dict(capacity=2000, host_capacity=3000),
               dict(capacity=1000, schedule="lpm", window=8), dict(capacity=1000, schedule="dfs")):
        replay(tr, **kw)
    after = compiled_signatures()
    assert {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v} == {}


def test_rows_and_summaries_hold_the_id_names_only():
    import radix_soa as rs

    r = rs.sweep([[1, 2], [1, 3], [1, 2]], capacities=[2, 10])
    for d in (r.rows[0], r.to_dict(), r.results[0].summary()):
        assert "evicted_ids" in d and "evicted_tokens" not in d
        with pytest.raises(KeyError):
            d["evicted_tokens"]
