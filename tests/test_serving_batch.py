"""``begin_batch`` / ``checkpoint_batch`` / ``finish_batch`` against a loop
of ``begin`` / ``checkpoint`` / ``finish`` on a twin cache: the same tree,
results, statistics and events after every step, and a refused batch
changes nothing (the loop's error, raised before any request of it)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import radix_soa as rs
from radix_soa import CacheFullError, PrefixCache
from radix_soa._kernels.layout import REQUEST_SIZE

ID_MASK = (1 << 32) - 1


def state(pc):
    """What a cache shows, handles as node ids (each cache salts its own)."""
    return {"text": pc.to_text(max_lines=10_000), "stats": pc.stats, "total": pc.total_tokens,
            "locked": pc.locked_tokens, "inflight": pc.inflight_tokens,
            "nodes": pc.num_nodes, "namespaces": pc.namespaces,
            "values": sorted(pc.cached_values().tolist()) if pc.has_values else None}


def request_state(r):
    return r._st.tolist()


def values_of(x):
    return None if x is None else np.asarray(x).tolist()


def events(pc):
    return [repr(e) for e in pc.take_events()] if pc.events_enabled else []


def loop(calls):
    """Run ``calls`` in order; ``(results, error type or None)``."""
    out = []
    for c in calls:
        try:
            out.append(c())
        except (CacheFullError, ValueError, OverflowError) as exc:
            return out, type(exc)
    return out, None


configs = st.fixed_dictionaries({
    "capacity": st.sampled_from([None, 12, 30, 80]),
    "page_size": st.sampled_from([1, 2]),
    "count_inflight": st.booleans(),
    "events": st.booleans(),
    "eviction_policy": st.sampled_from(["lru", "lfu"]),
})
tokens = st.lists(st.integers(0, 3), min_size=0, max_size=9)
ops = st.lists(st.one_of(
    st.tuples(st.just("insert"), tokens),
    st.tuples(st.just("begin"), st.lists(tokens, min_size=0, max_size=5),
              st.sampled_from([None, "a"]), st.sampled_from([None, 0, 3])),
    st.tuples(st.just("checkpoint"), st.lists(st.integers(0, 40), max_size=4), tokens,
              st.booleans(), st.booleans()),
    st.tuples(st.just("finish"), st.lists(st.integers(0, 40), max_size=4), tokens,
              st.booleans(), st.booleans()),
    st.tuples(st.just("finish"), st.lists(st.integers(0, 40), max_size=4), tokens,
              st.booleans(), st.just(False)),
    st.tuples(st.just("evict"), st.integers(0, 20)),
    st.tuples(st.just("abort"), st.integers(0, 40)),
), min_size=1, max_size=14)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, program=ops)
def test_batch_calls_are_a_loop_of_per_request_calls(cfg, program):
    A = PrefixCache(**cfg)  # batch calls
    B = PrefixCache(**cfg)  # the loop of per-request calls
    reqs = []  # (request of A, request of B, its tokens so far, its uid)
    batches = []  # the RequestBatch of A each request came from, and its row
    uid = [0]

    def vals(u, toks):
        return [1000 * u + i for i in range(len(toks))]

    for op in program:
        before = state(A)
        kind = op[0]
        if kind == "insert":
            toks = op[1]
            uid[0] += 1
            got_a, ea = loop([lambda: A.insert(toks, values=vals(uid[0], toks))])
            got_b, eb = loop([lambda: B.insert(toks, values=vals(uid[0], toks))])
            assert ea is eb
            if ea is None:
                ra, rb = got_a[0], got_b[0]
                assert ra.cached == rb.cached and values_of(ra.evicted.values) == values_of(
                    rb.evicted.values)
        elif kind == "evict":
            assert values_of(A.evict(op[1]).values) == values_of(B.evict(op[1]).values)
        elif kind == "abort":
            if not reqs:
                continue
            ra, rb, _, _ = reqs[op[1] % len(reqs)]
            if not rb.open:
                continue
            A.abort(ra)
            B.abort(rb)
        elif kind == "begin":
            seqs, ns, reserve = op[1], op[2], op[3]
            res_b, err = loop([lambda q=q: B.begin(q, namespace=ns, reserve=reserve)
                               for q in seqs])
            try:
                rba, cached = A.begin_batch(seqs, namespace=ns, reserve=reserve)
            except (CacheFullError, ValueError, OverflowError) as exc:
                assert type(exc) is err
                assert state(A) == before
                return  # B did a prefix of the batch: the twins part here
            assert err is None
            assert cached.tolist() == [r.cached for r in res_b]
            for i, (q, r) in enumerate(zip(seqs, res_b)):
                a = rba[i]
                assert request_state(a) == request_state(r)
                assert values_of(a.values) == values_of(r.values)
                assert a.node & ID_MASK == r.node & ID_MASK
                assert values_of(a.evicted.values) == values_of(r.evicted.values)
                uid[0] += 1
                reqs.append((a, r, list(q), uid[0]))
                batches.append((rba, i))
            if len(seqs):
                assert rba.nodes.tolist() == [a.node for a in rba]
        else:  # checkpoint / finish of some requests, or of a whole RequestBatch
            picks, extra, whole, bad = op[1], op[2], op[3], op[4]
            if not reqs:
                continue
            chosen = sorted({p % len(reqs) for p in picks})
            if whole:  # the last begun batch, whole, if it is open
                rba = batches[-1][0]
                chosen = [j for j, (b, _) in enumerate(batches) if b is rba]
            if not chosen:
                continue
            seqs, vs = [], []
            for j in chosen:
                a, r, toks, u = reqs[j]
                new = toks + extra
                if bad and r.cached and j == chosen[-1]:
                    new = list(new)
                    new[0] = 99  # leaves its cached prefix
                seqs.append(new)
                vs.append(vals(u, new))
            method = "checkpoint" if kind == "checkpoint" else "finish"
            # a request of the batch that no state could admit: closed, or leaving its prefix
            invalid = any(not reqs[j][1].open for j in chosen) or (bad and reqs[chosen[-1]][1].cached)
            res_b, err = loop([lambda j=j, q=q, v=v: getattr(B, method)(reqs[j][1], q, v)
                               for j, q, v in zip(chosen, seqs, vs)])
            handles = batches[chosen[0]][0] if whole else [reqs[j][0] for j in chosen]
            steps = [reqs[j][0].steps for j in chosen]
            try:
                got = getattr(A, method + "_batch")(handles, seqs, vs)
            except (CacheFullError, ValueError, OverflowError) as exc:
                if err is CacheFullError and type(exc) is ValueError:
                    # documented: the batch checks every request before it makes room, so a
                    # later request's own error comes before an earlier one's capacity error
                    assert invalid, exc
                else:
                    assert type(exc) is err, (exc, err)
                assert state(A) == before
                assert [reqs[j][0].steps for j in chosen] == steps
                return
            assert err is None
            if method == "checkpoint":
                assert [x.tolist() for x in got] == [values_of(x) for x in res_b]
            else:
                assert got.cached.tolist() == [f.cached for f in res_b]
                assert [x.tolist() for x in got.free] == [values_of(f.free) for f in res_b]
                assert [x.tolist() for x in got.evicted] == [
                    values_of(f.evicted.values) if f.evicted.num_tokens else [] for f in res_b]
                assert [int(h) & ID_MASK for h in got.nodes] == [f.node & ID_MASK for f in res_b]
            for j, q, rb_res in zip(chosen, seqs, res_b):
                a, r, _, u = reqs[j]
                assert request_state(a) == request_state(r)
                ra_res = a.result  # rebuilt from what the batch staged
                if method == "checkpoint":
                    assert values_of(ra_res) == values_of(rb_res)
                else:
                    assert ra_res.cached == rb_res.cached and values_of(ra_res.free) == values_of(
                        rb_res.free)
                reqs[j] = (a, r, q, u)
        assert state(A) == state(B)
        assert events(A) == events(B)
        assert len(A.open_requests()) == len(B.open_requests())
        A.check_invariants()
        B.check_invariants()


def test_a_refused_batch_changes_nothing_and_names_its_request():
    pc = PrefixCache(capacity=10, count_inflight=True)
    pc.insert([1, 2, 3, 4], values=[1, 2, 3, 4])
    before = (pc.to_text(), pc.stats, pc.inflight_tokens)
    # the first fits (4 cached + 4 reserved), the second would pass the capacity
    with pytest.raises(CacheFullError, match="request 1 of the batch"):
        pc.begin_batch([[1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9, 9]])
    assert (pc.to_text(), pc.stats, pc.inflight_tokens) == before
    assert pc.open_requests() == []
    pc.check_invariants()
    # alone, the loop would have begun the first request and then refused the second
    r = pc.begin([1, 2, 3, 4, 5, 6, 7, 8])
    with pytest.raises(CacheFullError):
        pc.begin([9, 9, 9, 9, 9])
    pc.abort(r)


def test_a_refused_finish_batch_is_undone_after_evicting_for_earlier_requests():
    """Request 0 evicts to fit (so the batch runs on a copy of the tree),
    request 1 cannot fit: nothing of request 0 stays either."""
    pc = PrefixCache(capacity=9, events=True)
    pc.insert([7, 7, 7, 7], values=[70, 71, 72, 73])
    rb, _ = pc.begin_batch([[1, 2], [5, 6]])
    pc.finish_batch(rb, [[1, 2], [5, 6]], [[1, 2], [5, 6]])
    rb, _ = pc.begin_batch([[1, 2], [5, 6]])
    pc.take_events()
    before = (pc.to_text(), pc.stats, [r._st.tolist() for r in rb])
    with pytest.raises(CacheFullError):
        pc.finish_batch(rb, [[1, 2, 3, 3, 3, 3], [5, 6] + [8] * 12],
                        [[1, 2, 3, 3, 3, 3], [5, 6] + [8] * 12])
    assert (pc.to_text(), pc.stats, [r._st.tolist() for r in rb]) == before
    assert pc.take_events() == []
    assert all(r.open for r in rb)
    f = pc.finish_batch(rb, [[1, 2, 3, 3], [5, 6]], [[1, 2, 30, 31], [5, 6]])
    assert f.cached.tolist() == [2, 2] and [x.tolist() for x in f.evicted] == [[73], []]
    pc.check_invariants()


def test_batches_validate_everything_first():
    pc = PrefixCache()
    rb, _ = pc.begin_batch([[1, 2], [3]])
    with pytest.raises(ValueError, match="2 requests for a batch of 1"):
        pc.finish_batch(rb, [[1, 2]], [[1, 2]])
    with pytest.raises(ValueError, match="values of request 1 has 3 entries"):
        pc.finish_batch(rb, [[1, 2], [3]], [[1, 2], [3, 4, 5]])
    with pytest.raises(ValueError, match="listed twice"):
        pc.checkpoint_batch([rb[0], rb[0]], [[1, 2], [1, 2]], [[1, 2], [1, 2]])
    with pytest.raises(TypeError, match="Request from begin"):
        pc.finish_batch([object()], [[1]], [[1]])
    with pytest.raises(ValueError, match="reserve"):
        pc.begin_batch([[1]], reserve=[1, 2])
    pc.finish_batch(rb, [[1, 2], [3]], [[1, 2], [3]])
    with pytest.raises(ValueError, match="finished or aborted"):
        pc.finish_batch(rb, [[1, 2], [3]], [[1, 2], [3]])
    other = PrefixCache()
    with pytest.raises(ValueError, match="another cache"):
        other.finish_batch(rb, [[1, 2], [3]], [[1, 2], [3]])
    assert pc.open_requests() == []
    pc.check_invariants()


def test_a_request_batch_mixes_with_per_request_calls():
    pc = PrefixCache()
    pc.insert([1, 2, 3], values=[10, 11, 12])
    rb, cached = pc.begin_batch(np.array([[1, 2, 3, 4], [1, 2, 9, 9]]))
    assert cached.tolist() == [3, 2] and [v.tolist() for v in rb.values] == [[10, 11, 12],
                                                                           [10, 11]]
    assert pc.open_requests() == [rb[0], rb[1]]
    out = pc.checkpoint(rb[1], [1, 2, 9], [10, 11, 20])
    assert out.tolist() == []
    assert rb.cached.tolist() == [3, 3]
    pc.abort(rb[0])
    assert rb.open.tolist() == [False, True]
    f = pc.finish_batch([rb[1]], [[1, 2, 9, 9]], [[0, 0, 0, 21]])
    assert f.cached.tolist() == [3] and rb[1].result.cached == 3
    assert [x.tolist() for x in f.free] == [[]]  # its own cached prefix is no duplicate
    assert pc.open_requests() == []
    assert pc.match([1, 2, 9, 9]).values.tolist() == [10, 11, 20, 21]
    pc.check_invariants()


def test_an_unknown_namespace_is_made_by_the_first_insert_of_a_batch():
    pc = PrefixCache(page_size=2)
    rb, cached = pc.begin_batch([[1, 2, 3], [1, 2]], namespace="x")
    assert cached.tolist() == [0, 0] and pc.namespaces == [0]
    f = pc.finish_batch(rb, [[1, 2, 3], [1, 2]], [[5, 6, 7], [8, 9]])
    assert pc.namespaces == [0, "x"] and f.cached.tolist() == [0, 2]
    assert [x.tolist() for x in f.free] == [[7], [8, 9]]
    pc.check_invariants()


def test_batches_without_values():
    pc = PrefixCache(values=False)
    rb, cached = pc.begin_batch([[1, 2], [1]])
    assert rb.values is None and pc.checkpoint_batch(rb, [[1, 2], [1]]) is None
    f = pc.finish_batch(rb, [[1, 2, 3], [1]])
    assert f.free is None and f.cached.tolist() == [2, 1]  # what its checkpoint cached
    assert pc.total_tokens == 3


def test_the_state_rows_are_request_size():
    pc = PrefixCache()
    rb, _ = pc.begin_batch([[1]])
    assert rb._states.shape == (1, REQUEST_SIZE)
    assert isinstance(rb, rs.RequestBatch)


def test_begun_values_are_read_while_open_or_written_to_out():
    pc = PrefixCache()
    pc.insert([1, 2, 3, 4], values=[10, 11, 12, 13])
    rb, cached = pc.begin_batch([[1, 2, 3, 4, 5], [1, 2, 7]])
    pc.checkpoint_batch(rb, [[1, 2, 3, 4, 5], [1, 2, 7]], [[0, 0, 0, 0, 50], [0, 0, 70]])
    # after a checkpoint moved the locks deeper, the begun prefix is still what it was
    assert [v.tolist() for v in rb.values] == [[10, 11, 12, 13], [10, 11]]
    assert rb[1].values.tolist() == [10, 11]
    pc.abort(rb[1])
    with pytest.raises(ValueError, match="request 1 of the batch is closed"):
        rb.values
    assert rb[0].values.tolist() == [10, 11, 12, 13]
    table = np.full(12, -1, np.int64)
    rb2, _ = pc.begin_batch([[1, 2, 3], [1, 2, 7, 9]], out=table[1:])
    assert table.tolist() == [-1, 10, 11, 12, 10, 11, 70, -1, -1, -1, -1, -1]
    pc.abort(rb2[0])
    assert rb2[0].values.tolist() == [10, 11, 12]  # kept in out: readable once closed too
    with pytest.raises(ValueError, match="room for 2 values"):
        pc.begin_batch([[1, 2, 3]], out=np.empty(2, np.int64))
    with pytest.raises(ValueError, match="1-D int64"):
        pc.begin_batch([[1, 2, 3]], out=np.empty(3, np.int32))


@pytest.mark.parametrize("reserve", [[5, 2**63 - 1], [5, 2**31], np.array([5, 2**63 + 7], np.uint64)])
def test_a_reserve_past_a_sequences_most_tokens_is_refused_before_anything_begins(reserve):
    # 2**63 - 1 once overflowed the kernel's sum of reserves, so the batch ran
    # without its undo copy and left its first request begun; a uint64 past
    # 2**63 wrapped to a negative reserve, read as the default
    pc = PrefixCache(capacity=100, count_inflight=True, values=False)
    before = (pc.inflight_tokens, len(pc.open_requests()))
    with pytest.raises(OverflowError, match="reserve"):
        pc.begin_batch([[1], [2]], reserve=reserve)
    assert (pc.inflight_tokens, len(pc.open_requests())) == before
    with pytest.raises(OverflowError, match="reserve"):
        pc.begin([1], reserve=2**63 - 1)
    assert (pc.inflight_tokens, len(pc.open_requests())) == before
    rb, _ = pc.begin_batch([[1], [2]], reserve=[5, 7])  # in range: taken
    assert [r.reserved for r in rb] == [5, 7] and pc.inflight_tokens == 12
