"""The subscriber of vLLM's KV-event publishers (radix_soa.integrations.vllm)
over real pyzmq sockets on 127.0.0.1: vLLM's wire (both event encodings,
checked byte for byte against vLLM's msgspec structs restated here), gaps
replayed, restarts, malformed frames, many workers on one thread; the index
it builds is checked against a pure-Python reference index fed every event
and against the engines' own caches. Waits poll a condition with a deadline;
no sleep synchronizes anything."""

import os
import random
import threading
import time

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import radix_soa as rs
from radix_soa.baselines.router_reference import ReferenceRouterIndex
from radix_soa.integrations.vllm import Endpoint, KVEventSubscriber, as_endpoint, main
from radix_soa.integrations.vllm_wire import (WirePublisher, decode_batch, encode_batch,
                                              encode_event)

PAGE = 4
LOCAL = "tcp://127.0.0.1:*"
# a replay given up is a lost batch: on a loaded machine wait long before that
SLOW = {"replay_timeout": 60}


def engine_batches(seed, n=25, event_hash="fast64", namespaces=(None,)):
    """A cache's event batches (one per engine step) and the requests it
    saw: inserts over a small alphabet (shared prefixes), a capacity that
    evicts, now and then a reset."""
    rng = random.Random(seed)
    pc = rs.PrefixCache(capacity=40, page_size=PAGE, events=True, values=False,
                        event_hash=event_hash,
                        event_hash_seed="0" if event_hash == "sha256_cbor" else None)
    batches, queries = [], []
    for _ in range(n):
        for _ in range(rng.randint(0, 3)):
            q = [rng.randint(0, 2) for _ in range(rng.randint(1, 16))]
            pc.insert(q, namespace=rng.choice(namespaces))
            queries.append(q)
        if rng.random() < 0.04:
            pc.reset()
        batches.append(pc.take_events())
    return pc, batches, queries


def index(**kw):
    return rs.RouterIndex(page_size=PAGE, **kw)


def reference(batches):
    ref = ReferenceRouterIndex(PAGE, strict=True)
    for b in batches:
        ref.apply("w", b)
    return ref.held("w")


def wait(sub, cond, timeout=60):
    assert sub.wait(cond, timeout), sub.stats()


def caught_up(sub, worker, pub):
    def done():
        s = sub.stats(worker)
        return s["last_seq"] == pub.seq - 1 and not s["replaying"]
    return done


def listening(sub, pub, worker="w"):
    """The publisher hears the subscriber, whose start replay (the stream
    asked from 0, before any batch) has ended."""
    assert pub.wait_subscribers(1)
    wait(sub, lambda: not sub.stats(worker)["replaying"])


def bind_again(endpoint, replay, ctx):
    """A publisher on the addresses a closed one had (the port frees soon)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return WirePublisher(endpoint, replay, context=ctx)
        except zmq.ZMQError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


# ---------------------------------------------------------------- the wire

ALL = ["map", "array", "array-0.9"]


def test_every_encoding_decodes_to_the_events_it_encodes():
    _, batches, _ = engine_batches(1, namespaces=(None, 3))
    events = [e for b in batches for e in b]
    assert {type(e).__name__ for e in events} == {"BlockStored", "BlockRemoved",
                                                   "AllBlocksCleared"}
    for enc in ALL:
        got = decode_batch(encode_batch(events, ts=2.0, encoding=enc))
        assert got.ts == 2.0 and got.data_parallel_rank == (None if enc == "array-0.9" else 0)
        assert [rs.event_from_dict(d) for d in got.events] == events, enc


def test_hashes_as_vllm_sends_them():
    b = decode_batch(msgpack.packb([1.0, [["BlockStored", [-1, 5], -2, [1, 2, 3, 4, 5, 6, 7, 8],
                                            4, None]]]))
    assert b.events[0]["block_hashes"] == [2**64 - 1, 5]    # Python's hash(): two's complement
    assert b.events[0]["parent_block_hash"] == 2**64 - 2
    h = bytes(range(32))
    b = decode_batch(encode_batch([{"type": "BlockRemoved", "block_hashes": [h]}]))
    assert b.events[0]["block_hashes"] == [h]


def test_a_map_envelope_and_vllms_further_fields_are_read():
    ev = {"type": "BlockStored", "block_hashes": [9], "parent_block_hash": None,
          "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_id": None, "medium": "GPU",
          "lora_name": None, "extra_keys": [None], "group_idx": 0,
          "kv_cache_spec_kind": "full_attention", "session_id": "s"}
    b = decode_batch(msgpack.packb({"ts": 3, "events": [ev], "data_parallel_rank": 1}))
    assert b.ts == 3.0 and b.data_parallel_rank == 1
    assert b.events[0]["kv_cache_spec_kind"] == "full_attention"
    arr = encode_event(ev, "array")
    assert arr[:8] == ["BlockStored", [9], None, [1, 2, 3, 4], 4, None, "GPU", None]
    assert decode_batch(msgpack.packb([0.0, [arr]])).events[0]["group_idx"] == 0


@pytest.mark.parametrize("payload, says", [
    (b"\xc1", "not msgpack"),
    (msgpack.packb(5), "KVEventBatch"),
    (msgpack.packb(["t", []]), "ts must be a number"),
    (msgpack.packb([1.0, {}]), "events must be a list"),
    (msgpack.packb([1.0, [], "r"]), "data_parallel_rank"),
    (msgpack.packb([1.0, [{"type": "Nope"}]]), "unknown event type 'Nope'"),
    (msgpack.packb([1.0, [["BlockStored", [1]]]]), "has 1 fields"),
    (msgpack.packb([1.0, [7]]), "event 0: an event is a map"),
    (msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": 3}]]), "must be a list"),
    (msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}]]), "ints or"),
    (msgpack.packb([1.0, [["BlockStored", [1], None, [1, 2], 4, None]]]), "token_ids holds 2"),
])
def test_a_malformed_payload_is_an_event_error_saying_what(payload, says):
    with pytest.raises(rs.EventError, match=says):
        decode_batch(payload)


def test_encoders_refuse_what_they_cannot_write():
    with pytest.raises(ValueError, match="encoding"):
        encode_batch([], encoding="json")
    with pytest.raises(ValueError, match="unknown event type"):
        encode_event({"type": "X"})
    with pytest.raises(TypeError, match="event object or its dict"):
        encode_event(5)


def vllm_structs(array_events, v09=False):
    """vLLM's structs restated with msgspec (vllm/distributed/kv_events.py):
    the wire encoder must write their bytes exactly."""
    import msgspec
    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list

    class EventBatchRank(EventBatch):
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, array_like=array_events, omit_defaults=True, gc=False,
                       tag=True):
        pass

    if v09:  # vLLM 0.9.0 (commit b4e69e0)
        class BlockStored(KVCacheEvent):
            block_hashes: list[int]
            parent_block_hash: int | None
            token_ids: list[int]
            block_size: int
            lora_id: int | None

        class BlockRemoved(KVCacheEvent):
            block_hashes: list[int]
    else:   # vLLM 0.34.0's fields (array_events: the order before PR #42892)
        class BlockStored(KVCacheEvent):  # type: ignore[no-redef]
            block_hashes: list[int | bytes]
            parent_block_hash: int | bytes | None
            token_ids: list[int]
            block_size: int
            lora_id: int | None
            medium: str | None
            lora_name: str | None
            extra_keys: list | None = None
            group_idx: int | None = None
            kv_cache_spec_kind: str | None = None
            kv_cache_spec_sliding_window: int | None = None
            if not array_events:   # fields vLLM added after PR #42892
                locality: str | None = None
                ownership: str | None = None
                session_id: str | None = None
                lookahead_token_ids: list[list[int]] | None = None

        class BlockRemoved(KVCacheEvent):  # type: ignore[no-redef]
            block_hashes: list[int | bytes]
            medium: str | None
            group_idx: int | None = None
            if not array_events:
                locality: str | None = None
                ownership: str | None = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    return (EventBatch if v09 else EventBatchRank), BlockStored, BlockRemoved, AllBlocksCleared


def as_vllm(e, structs, v09):
    _, stored, removed, cleared = structs
    if isinstance(e, rs.BlockStored):
        kw = dict(block_hashes=e.block_hashes, parent_block_hash=e.parent_block_hash,
                  token_ids=e.token_ids, block_size=e.block_size, lora_id=e.lora_id)
        if not v09:
            kw.update(medium="GPU", lora_name=e.lora_name, group_idx=0)
        return stored(**kw)
    if isinstance(e, rs.BlockRemoved):
        return removed(e.block_hashes) if v09 else removed(e.block_hashes, "GPU", group_idx=0)
    return cleared()


@pytest.mark.parametrize("encoding, event_hash", [  # vLLM 0.9.0 had int hashes only
    ("map", "fast64"), ("map", "sha256_cbor"), ("array", "fast64"), ("array", "sha256_cbor"),
    ("array-0.9", "fast64")])
def test_the_encoder_writes_vllms_bytes(encoding, event_hash):
    v09 = encoding == "array-0.9"
    structs = vllm_structs(encoding != "map", v09)
    import msgspec
    enc = msgspec.msgpack.Encoder()
    for batch in engine_batches(2, event_hash=event_hash, namespaces=(None, 5))[1]:
        theirs = [as_vllm(e, structs, v09) for e in batch]
        ours = [{**e.to_dict(), **({} if isinstance(e, rs.AllBlocksCleared) else
                                   {"medium": "GPU", "group_idx": 0})} for e in batch]
        want = enc.encode(structs[0](1.25, theirs) if v09 else structs[0](1.25, theirs, 0))
        assert encode_batch(ours, ts=1.25, encoding=encoding) == want


# ---------------------------------------------------------------- the subscriber

@pytest.mark.parametrize("encoding", ALL)
def test_every_encoding_builds_the_index_the_engine_holds(ctx, encoding):
    pc, batches, queries = engine_batches(3)
    ix = index()
    with WirePublisher(LOCAL, LOCAL, encoding=encoding, context=ctx) as pub, \
            KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, **SLOW) as sub:
        listening(sub, pub)
        for b in batches:
            pub.publish(b)
        wait(sub, caught_up(sub, "w", pub))
        assert ix.blocks_of("w") == reference(batches)
        assert ix.status("w") == "exact"
        assert [ix.overlap(q).tolist() for q in queries] == \
            [[pc.match_length(q)] for q in queries]
        s = sub.stats("w")
        assert s["batches"] == len(batches) and s["gaps"] == s["errors"] == 0
        assert s["events"] == sum(map(len, batches))


@pytest.mark.parametrize("replay_topic", [True, False])  # vLLM 0.34.0's replies, earlier ones
def test_a_dropped_batch_is_detected_and_replayed(ctx, replay_topic):
    pc, batches, queries = engine_batches(4)
    drop = {3, 4, 11}
    ix = index()
    with WirePublisher(LOCAL, LOCAL, replay_topic=replay_topic, topic="kv", context=ctx) as pub, \
            KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint, "kv")},
                              **SLOW) as sub:
        listening(sub, pub)
        for i, b in enumerate(batches):
            pub.publish(b, send=i not in drop)
            if i in (5, 12):   # the gap seen (a later batch arrived), then replayed
                wait(sub, caught_up(sub, "w", pub))
        wait(sub, caught_up(sub, "w", pub))
        s = sub.stats("w")
        assert s["gaps"] == 2 and s["replayed"] == 5 and s["errors"] == 0
        assert ix.blocks_of("w") == reference(batches) and ix.status("w") == "exact"
        assert [ix.overlap(q).tolist() for q in queries] == \
            [[pc.match_length(q)] for q in queries]


def test_a_gap_among_the_batches_held_during_a_replay_is_asked_for_again(ctx):
    _, batches, _ = engine_batches(12, n=5)
    ix = index()
    with WirePublisher(LOCAL, LOCAL, serve=False, context=ctx) as pub, \
            KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, probe_every=None,
                              **SLOW) as sub:
        assert pub.wait_subscribers(1)
        wait(sub, lambda: pub.serve_replay(0) == 1)       # the start replay: nothing yet
        wait(sub, lambda: not sub.stats("w")["replaying"])
        pub.publish(batches[0])
        pub.publish(batches[1], send=False)
        pub.publish(batches[2])
        wait(sub, lambda: pub.serve_replay(0) == 1)       # asked for 1..: 1, 2, the end
        pub.publish(batches[3], send=False)
        pub.publish(batches[4])                            # held, past a new gap
        wait(sub, lambda: pub.serve_replay(0) == 1)       # asked again, from 3
        wait(sub, caught_up(sub, "w", pub))
        assert ix.status("w") == "exact" and ix.blocks_of("w") == reference(batches)
        assert sub.stats("w")["replayed"] == 4


def test_a_subscriber_joining_late_replays_from_zero(ctx):
    _, batches, _ = engine_batches(5)
    ix = index()
    with WirePublisher(LOCAL, LOCAL, context=ctx) as pub:
        for b in batches[:-1]:
            pub.publish(b)          # nobody listens yet: lost to the subscriber
        with KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, **SLOW) as sub:
            listening(sub, pub)     # asked at once, from 0: no batch awaited
            assert ix.blocks_of("w") == reference(batches[:-1]) and ix.status("w") == "exact"
            pub.publish(batches[-1])
            wait(sub, caught_up(sub, "w", pub))
            assert sub.stats("w")["replayed"] == len(batches) - 1
            assert ix.blocks_of("w") == reference(batches) and ix.status("w") == "exact"


def test_a_batch_gone_from_the_replay_buffer_degrades_the_worker_which_stays_answerable(ctx):
    pc = rs.PrefixCache(page_size=PAGE, events=True, values=False)
    ix = index()
    with WirePublisher(LOCAL, LOCAL, buffer_steps=2, context=ctx) as pub, \
            KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, **SLOW) as sub:
        listening(sub, pub)
        pc.insert([1, 2, 3, 4])
        pub.publish(pc.take_events())
        pc.insert([1, 2, 3, 4, 5, 6, 7, 8])
        pub.publish(pc.take_events(), send=False)     # lost, and soon out of the buffer
        for _ in range(2):
            pub.publish([], send=False)
        pc.insert([9, 9, 9, 9])
        pub.publish(pc.take_events())
        wait(sub, caught_up(sub, "w", pub))
        assert ix.status("w") == "degraded" and "never arrived" in ix.degraded["w"]
        assert ix.overlap([9, 9, 9, 9]).tolist() == [4]
        assert ix.overlap([1, 2, 3, 4, 5, 6, 7, 8]).tolist() == [4]  # what it knows
        pub.publish([rs.AllBlocksCleared()])          # vLLM's reset_prefix_cache
        wait(sub, caught_up(sub, "w", pub))
        assert ix.status("w") == "exact" and ix.blocks_of("w") == []


def test_without_a_replay_socket_a_gap_degrades(ctx):
    ix = index()
    with WirePublisher(LOCAL, context=ctx) as pub, \
            KVEventSubscriber(ix, {"w": pub.endpoint}) as sub:
        listening(sub, pub)
        pub.publish([])
        pub.publish([], send=False)
        pub.publish([])
        wait(sub, caught_up(sub, "w", pub))
        assert sub.stats("w")["gaps"] == 1 and ix.status("w") == "degraded"


def test_an_unanswered_replay_times_out_and_degrades(ctx):
    ix = index()
    with WirePublisher(LOCAL, LOCAL, serve=False, context=ctx) as pub, \
            KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)},
                              replay_timeout=0.2) as sub:
        assert pub.wait_subscribers(1)
        pub.publish([], send=False)
        pub.publish([])
        wait(sub, lambda: sub.stats("w")["replay_timeouts"] == 1)
        wait(sub, caught_up(sub, "w", pub))
        assert ix.status("w") == "degraded"
        pub.serve_replay(0)             # the late answer goes to a closed socket
        pub.publish([])
        wait(sub, caught_up(sub, "w", pub))
        assert sub.stats("w")["replayed"] == 0 and sub.stats("w")["errors"] == 0


def test_a_restarted_engine_is_seen_and_its_old_pages_dropped(ctx):
    old, old_batches, _ = engine_batches(6)
    new, new_batches, queries = engine_batches(7, n=8)
    ix = index()
    pub = WirePublisher(LOCAL, LOCAL, context=ctx)
    with KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, **SLOW) as sub:
        listening(sub, pub)
        for b in old_batches:
            pub.publish(b)
        wait(sub, caught_up(sub, "w", pub))
        assert ix.blocks_of("w") == reference(old_batches) != []
        pub.close()                                       # the engine dies
        pub = bind_again(pub.endpoint, pub.replay_endpoint, ctx)   # and is back
        # a SUB socket reconnects (and subscribes again) as its owner polls it
        wait(sub, lambda: pub.wait_subscribers(1, timeout=0.01))
        pub.publish(new_batches[0], send=False)           # the new stream's start is missed
        for b in new_batches[1:]:
            pub.publish(b)
        wait(sub, caught_up(sub, "w", pub))
        s = sub.stats("w")
        assert s["restarts"] == 1 and s["errors"] == 0
        assert ix.blocks_of("w") == reference(new_batches) and ix.status("w") == "exact"
        assert [ix.overlap(q).tolist() for q in queries] == \
            [[new.match_length(q)] for q in queries]
    pub.close()


def test_a_restart_whose_new_count_passed_the_old_one_is_told_from_a_gap(ctx):
    # the subscriber reconnects only after the new engine's count passed the
    # old one's: by the numbers a gap; the replay repeats the last batch
    # applied with another payload, so it is a restart
    old, old_batches, _ = engine_batches(6, n=5)
    new, new_batches, queries = engine_batches(7, n=12)
    ix = index()
    pub = WirePublisher(LOCAL, LOCAL, context=ctx)
    with KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, **SLOW) as sub:
        listening(sub, pub)
        for b in old_batches:
            pub.publish(b)
        wait(sub, caught_up(sub, "w", pub))
        assert ix.blocks_of("w") == reference(old_batches) != []
        pub.close()
        pub = bind_again(pub.endpoint, pub.replay_endpoint, ctx)
        for b in new_batches[:9]:  # seqs 0..8, past the old 4, sent before anyone listens
            pub.publish(b, send=False)
        wait(sub, lambda: pub.wait_subscribers(1, timeout=0.01))
        for b in new_batches[9:]:
            pub.publish(b)
        wait(sub, caught_up(sub, "w", pub))
        s = sub.stats("w")
        # the reconnect is checked at once (a replay from the last batch applied)
        assert s["restarts"] == 1 and s["reconnects"] == 1 and s["errors"] == 0
        assert ix.blocks_of("w") == reference(new_batches) and ix.status("w") == "exact"
        assert [ix.overlap(q).tolist() for q in queries] == \
            [[new.match_length(q)] for q in queries]
    pub.close()


def test_a_restart_whose_new_count_comes_up_to_the_old_one_is_seen_on_the_reconnect(ctx):
    # the first new batch the subscriber sees is numbered the next one
    # expected: no gap, but the SUB socket reconnected, so it is checked
    old, old_batches, _ = engine_batches(10, n=5)
    new, new_batches, queries = engine_batches(11, n=9)
    ix = index()
    pub = WirePublisher(LOCAL, LOCAL, context=ctx)
    with KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, **SLOW) as sub:
        listening(sub, pub)
        for b in old_batches:  # seqs 0..4
            pub.publish(b)
        wait(sub, caught_up(sub, "w", pub))
        pub.close()
        pub = bind_again(pub.endpoint, pub.replay_endpoint, ctx)
        for b in new_batches[:5]:  # seqs 0..4 of the new stream, unseen
            pub.publish(b, send=False)
        wait(sub, lambda: pub.wait_subscribers(1, timeout=0.01))
        for b in new_batches[5:]:  # from 5: what the subscriber expects next
            pub.publish(b)
        wait(sub, caught_up(sub, "w", pub))
        s = sub.stats("w")
        assert s["reconnects"] == 1 and s["restarts"] == 1 and s["gaps"] == 0
        assert ix.blocks_of("w") == reference(new_batches) and ix.status("w") == "exact"
        assert [ix.overlap(q).tolist() for q in queries] == \
            [[new.match_length(q)] for q in queries]
    pub.close()


def test_a_gap_replayed_from_the_last_batch_applied_is_no_restart(ctx):
    # the same engine: the replay repeats the last batch applied as it was
    pc, batches, queries = engine_batches(8, n=10)
    ix = index()
    with WirePublisher(LOCAL, LOCAL, context=ctx) as pub, \
            KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, **SLOW) as sub:
        listening(sub, pub)
        for i, b in enumerate(batches):
            pub.publish(b, send=i not in (3, 4, 7))
            sub.poll_once(0)
        wait(sub, caught_up(sub, "w", pub))
        s = sub.stats("w")
        assert s["restarts"] == 0 and s["gaps"] >= 1 and s["replayed"] >= 3
        assert ix.blocks_of("w") == reference(batches) and ix.status("w") == "exact"
        assert [ix.overlap(q).tolist() for q in queries] == [[pc.match_length(q)] for q in queries]


def test_a_gap_whose_last_applied_batch_left_the_buffer_degrades_the_worker(ctx):
    # the replay fills the gap but cannot repeat the last batch applied: a
    # restart whose count passed the old one cannot be ruled out
    pc, batches, _ = engine_batches(9, n=8)
    ix = index()
    with WirePublisher(LOCAL, LOCAL, context=ctx, buffer_steps=3) as pub, \
            KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, **SLOW) as sub:
        listening(sub, pub)
        for b in batches[:5]:
            pub.publish(b)
        wait(sub, caught_up(sub, "w", pub))
        for b in batches[5:7]:
            pub.publish(b, send=False)  # the buffer: seqs 5, 6, then 7
        pub.publish(batches[7])
        wait(sub, caught_up(sub, "w", pub))
        s = sub.stats("w")
        assert s["restarts"] == 0 and s["replayed"] == 3 and "ruled out" in s["last_error"]
        assert "ruled out" in ix.degraded["w"]
        assert ix.blocks_of("w") == reference(batches) and ix.status("w") == "degraded"


def test_a_restart_while_a_gaps_replay_runs_is_seen(ctx):
    # the old engine answered the replay, but before that answer is read the
    # engine restarts and its new batches arrive: the answer is dropped and
    # the replay asked again, of the new engine, so the restart shows
    old, old_batches, _ = engine_batches(10, n=5)
    new, new_batches, _ = engine_batches(11, n=5)
    new_batches += [[], [], []]  # steps storing nothing
    assert reference(new_batches) != reference(old_batches)
    ix = index()
    pub = WirePublisher(LOCAL, LOCAL, context=ctx, serve=False)
    with KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, probe_every=None,
                           **SLOW) as sub:
        feed = sub._feeds["w"]
        assert pub.wait_subscribers(1)
        wait(sub, lambda: pub.serve_replay(0) == 1)       # the start replay: nothing yet
        wait(sub, lambda: not sub.stats("w")["replaying"])
        for b in old_batches[:3]:
            pub.publish(b)
        wait(sub, caught_up(sub, "w", pub))
        pub.publish(old_batches[3], send=False)
        pub.publish(old_batches[4])                 # seq 4: a gap, a replay asked from 2
        wait(sub, lambda: sub.stats("w")["replaying"])
        assert pub.serve_replay(5000) == 1          # the old engine answers: 2, 3, 4, end
        assert feed.replay.poll(5000)               # unread, at the DEALER
        pub.close()
        pub = bind_again(pub.endpoint, pub.replay_endpoint, ctx)
        for b in new_batches[:5]:                   # new seqs 0..4, unseen
            pub.publish(b, send=False)
        deadline = time.monotonic() + 30            # the SUB socket resubscribes as it is touched
        while not pub.wait_subscribers(1, timeout=0.01):
            feed.sub.poll(0)
            assert time.monotonic() < deadline
        for b in new_batches[5:7]:                  # new 5, 6: next after the old 4
            pub.publish(b)
        assert feed.sub.poll(5000)
        wait(sub, caught_up(sub, "w", pub))        # the new publisher serves its replays itself
        s = sub.stats("w")
        assert s["reconnects"] == 1 and s["restarts"] == 1
        assert ix.status("w") == "exact" and ix.blocks_of("w") == reference(new_batches[:7])
    pub.close()


def test_a_reconnect_without_a_replay_socket_degrades_the_worker(ctx):
    # nothing to check the stream with: a restart cannot be ruled out
    old, old_batches, _ = engine_batches(10, n=5)
    new, new_batches, _ = engine_batches(11, n=7)
    ix = index()
    pub = WirePublisher(LOCAL, context=ctx)
    with KVEventSubscriber(ix, {"w": pub.endpoint}, **SLOW) as sub:
        listening(sub, pub)
        for b in old_batches:
            pub.publish(b)
        wait(sub, caught_up(sub, "w", pub))
        assert ix.status("w") == "exact"
        pub.close()
        pub = bind_again(pub.endpoint, None, ctx)
        for b in new_batches[:5]:
            pub.publish(b, send=False)
        wait(sub, lambda: pub.wait_subscribers(1, timeout=0.01))
        for b in new_batches[5:]:
            pub.publish(b)
        wait(sub, caught_up(sub, "w", pub))
        s = sub.stats("w")
        assert s["reconnects"] == 1 and "reconnected" in s["last_error"]
        assert ix.status("w") == "degraded" and "ruled out" in ix.degraded["w"]
    pub.close()


def test_close_after_the_users_context_was_destroyed():
    c = zmq.Context()
    pub = WirePublisher(LOCAL, LOCAL, context=c)
    sub = KVEventSubscriber(index(), {"w": (pub.endpoint, pub.replay_endpoint)}, context=c)
    pub.close()
    c.destroy(0)
    sub.close()
    assert sub.workers == []


def test_a_restart_after_one_batch_is_told_from_a_duplicate_by_its_payload(ctx):
    # the engine dies after its batch 0 and its new stream starts at 0 again:
    # the same seq with another payload is a restart, not a duplicate to skip
    old = rs.PrefixCache(page_size=PAGE, events=True, values=False)
    new = rs.PrefixCache(page_size=PAGE, events=True, values=False)
    old.insert([1] * (2 * PAGE))
    new.insert([2] * (2 * PAGE))
    new_batches = [new.take_events()]
    new.insert([2] * PAGE + [3] * PAGE)
    new_batches.append(new.take_events())
    ix = index()
    pub = WirePublisher(LOCAL, LOCAL, context=ctx)
    with KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, **SLOW) as sub:
        listening(sub, pub)
        pub.publish(old.take_events())
        wait(sub, caught_up(sub, "w", pub))
        assert ix.overlap([1] * (2 * PAGE)).tolist() == [2 * PAGE]
        pub.close()
        pub = bind_again(pub.endpoint, pub.replay_endpoint, ctx)
        wait(sub, lambda: pub.wait_subscribers(1, timeout=0.01))
        for b in new_batches:
            pub.publish(b)
        wait(sub, caught_up(sub, "w", pub))
        assert sub.stats("w")["restarts"] == 1 and sub.stats("w")["duplicates"] == 0
        assert ix.blocks_of("w") == reference(new_batches) and ix.status("w") == "exact"
        assert ix.overlap([1] * (2 * PAGE)).tolist() == [0]
        assert ix.overlap([2] * PAGE + [3] * PAGE).tolist() == [2 * PAGE]
    pub.close()


def test_malformed_frames_are_counted_and_the_thread_goes_on(ctx):
    pc = rs.PrefixCache(page_size=PAGE, events=True, values=False)
    ix = index()
    with WirePublisher(LOCAL, LOCAL, context=ctx) as pub, \
            KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, **SLOW) as sub:
        sub.start()
        listening(sub, pub)
        pc.insert([1, 2, 3, 4])
        pub.publish(pc.take_events())
        wait(sub, caught_up(sub, "w", pub))
        assert ix.status("w") == "exact"
        pub.send_raw([b"", b"\x00" * 8])                  # two frames
        pub.send_raw([b"", b"\x00" * 7, b""])             # a 7-byte seq
        wait(sub, lambda: sub.stats("w")["errors"] == 2)
        assert "a seq of 7 bytes" in sub.stats("w")["last_error"]
        assert ix.status("w") == "exact"                  # junk tied to no seq loses nothing
        pub.send_raw([b"", (1).to_bytes(8, "big"), b"\xc1garbage"])  # seq 1: garbage
        pub.seq = 2
        wait(sub, lambda: sub.stats("w")["errors"] == 3)
        assert sub.stats("w")["last_error"].startswith("worker 'w' seq 1: byte 0: a KVEventBatch")
        # asked again of the replay socket, which never held it: lost
        wait(sub, lambda: ix.status("w") == "degraded")
        assert "seq 1" in ix.degraded["w"] and sub.stats("w")["junk"] == 2
        pub.publish([rs.BlockStored([5], None, [1, 2], 2)])   # another page size
        wait(sub, lambda: sub.stats("w")["errors"] == 4)
        assert "block_size 2 but this index has page_size 4" in sub.stats("w")["last_error"]
        pub.publish([rs.AllBlocksCleared()])
        pc.reset(); pc.insert([5, 6, 7, 8])
        pub.publish(pc.take_events()[1:])
        wait(sub, caught_up(sub, "w", pub))
        assert sub.running and ix.status("w") == "exact"
        assert ix.overlap([5, 6, 7, 8]).tolist() == [4] and sub.stats("w")["errors"] == 4


def test_other_media_and_groups_are_skipped(ctx):
    pc = rs.PrefixCache(page_size=PAGE, events=True, values=False)
    pc.insert([1, 2, 3, 4])
    (e,) = pc.take_events()
    gpu = {**e.to_dict(), "medium": "GPU", "group_idx": 0}
    ix = index()
    with WirePublisher(LOCAL, LOCAL, context=ctx) as pub, \
            KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, **SLOW) as sub:
        listening(sub, pub)
        pub.publish([gpu, {**gpu, "medium": "CPU"}, {**gpu, "group_idx": 1}])
        wait(sub, caught_up(sub, "w", pub))
        assert sub.stats("w")["skipped"] == 2 and ix.status("w") == "exact"
        assert ix.blocks_of("w") == e.block_hashes


def threads():
    return sum(t.name == "radix-soa-kv-events" for t in threading.enumerate())


def test_many_workers_on_one_thread_and_stop_within_a_bound(ctx):
    runs = {w: engine_batches(10 + w) for w in range(3)}
    pubs = {w: WirePublisher(LOCAL, LOCAL, encoding=ALL[w], context=ctx) for w in runs}
    ix = index()
    sub = KVEventSubscriber(ix, {w: Endpoint(p.endpoint, p.replay_endpoint)
                                 for w, p in pubs.items()}, **SLOW).start()
    assert sub.running and threads() == 1
    for w, p in pubs.items():
        listening(sub, p, w)
    for i in range(25):
        for w, p in pubs.items():
            p.publish(runs[w][1][i], send=(i + w) % 7 != 3)
    for p in pubs.values():
        p.publish([])
    for w, p in pubs.items():
        wait(sub, caught_up(sub, w, p))
        assert ix.blocks_of(w) == reference(runs[w][1]) and ix.status(w) == "exact"
    assert ix.workers == [0, 1, 2]
    with pytest.raises(RuntimeError, match="not start"):
        sub.poll_once(0)
    assert sub.stop(timeout=5) and not sub.running
    assert threads() == 0
    sub.close()
    for p in pubs.values():
        p.close()


def test_endpoints_come_and_go_while_running(ctx):
    ix = index()
    a = WirePublisher(LOCAL, LOCAL, context=ctx)
    b = WirePublisher(LOCAL, context=ctx, encoding="array")
    pc = rs.PrefixCache(page_size=PAGE, events=True, values=False)
    pc.insert([1, 2, 3, 4])
    evs = pc.take_events()
    with KVEventSubscriber(ix, {"a": a.endpoint}) as sub:
        sub.start()
        sub.add_endpoint("b", {"pub": b.endpoint})
        assert sub.workers == ["a", "b"] and ix.workers == ["a", "b"]
        assert a.wait_subscribers(1) and b.wait_subscribers(1)
        b.publish(evs)
        wait(sub, caught_up(sub, "b", b))
        assert ix.overlap([1, 2, 3, 4]).tolist() == [0, 4]
        with pytest.raises(ValueError, match="already has an endpoint"):
            sub.add_endpoint("b", b.endpoint)
        sub.remove_endpoint("b")
        assert sub.workers == ["a"] and ix.workers == ["a"]
        with pytest.raises(KeyError):
            sub.remove_endpoint("b")
        sub.remove_endpoint("a", drop=False)
        assert ix.workers == ["a"] and sub.workers == []
    a.close()
    b.close()


def test_sha256_cbor_hashes_in_both_forms(ctx):
    pc, batches, queries = engine_batches(8, event_hash="sha256_cbor")
    def low64(h):
        return None if h is None else int.from_bytes(h, "big") & (2**64 - 1)

    def int_form(e):
        d = e.to_dict()
        if "block_hashes" in d:
            d["block_hashes"] = [low64(h) for h in d["block_hashes"]]
        if "parent_block_hash" in d:
            d["parent_block_hash"] = low64(d["parent_block_hash"])
        return d

    as_int = [[int_form(e) for e in b] for b in batches]
    for form in (batches, as_int):
        ix = index(event_hash="sha256_cbor", event_hash_seed="0")
        with WirePublisher(LOCAL, LOCAL, context=ctx) as pub, \
                KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, **SLOW) as sub:
            listening(sub, pub)
            for i, b in enumerate(form):
                pub.publish(b, send=i % 5 != 2)
            pub.publish([])
            wait(sub, caught_up(sub, "w", pub))
            assert ix.status("w") == "exact" and sub.stats("w")["errors"] == 0
            assert [ix.overlap(q).tolist() for q in queries] == \
                [[pc.match_length(q)] for q in queries]


def test_bad_arguments_are_refused():
    ix = index()
    with pytest.raises(TypeError, match="index must be a RouterIndex"):
        KVEventSubscriber(object(), {})
    with pytest.raises(TypeError, match="endpoints must be a mapping"):
        KVEventSubscriber(ix, ["tcp://127.0.0.1:1"])
    with pytest.raises(ValueError, match="replay_timeout"):
        KVEventSubscriber(ix, {}, replay_timeout=0)
    with pytest.raises(TypeError, match="a worker id"):
        KVEventSubscriber(ix, {1.5: "tcp://127.0.0.1:1"})
    with pytest.raises(TypeError, match=r"endpoints\['w'\] must be"):
        KVEventSubscriber(ix, {"w": 5})
    with pytest.raises(ValueError, match="pub address"):
        as_endpoint(("",))
    with pytest.raises(ValueError, match="a dict has 'pub'"):
        as_endpoint({"pubb": "x"})
    with pytest.raises(ValueError, match="replay address"):
        as_endpoint(("tcp://h:1", 5))
    assert as_endpoint(("tcp://h:1", "tcp://h:2", "t")) == Endpoint("tcp://h:1", "tcp://h:2", "t")
    with pytest.raises(ValueError, match="the endpoint of worker 'b'"):
        KVEventSubscriber(ix, {"a": "tcp://127.0.0.1:1", "b": ("tcp://127.0.0.1:1", "nope://x")})
    assert ix.workers == []                 # nothing registered
    sub = KVEventSubscriber(ix, {})
    with pytest.raises(ValueError, match="the endpoint of worker 'c'"):
        sub.add_endpoint("c", "bad")
    assert ix.workers == [] and sub.workers == []
    with pytest.raises(ValueError, match="timeout_ms"):
        sub.poll_once(-1)
    sub.close()
    with pytest.raises(RuntimeError, match="closed"):
        sub.poll_once(0)
    assert ix.workers == []


def test_mark_degraded():
    ix = index(workers=["w"])
    with pytest.raises(KeyError):
        ix.mark_degraded("x", "p")
    with pytest.raises(TypeError, match="problem must be a str"):
        ix.mark_degraded("w", 5)
    ix.mark_degraded("w", "first")
    ix.mark_degraded("w", "second")
    assert ix.degraded == {"w": "first"}
    ix.apply("w", [rs.AllBlocksCleared()], strict=False)
    assert ix.status("w") == "exact"


@pytest.mark.parametrize("argv, says", [
    (["w"], "WORKER=PUB"),
    (["w=tcp://127.0.0.1:1", "w=tcp://127.0.0.1:2"], "named twice"),
    (["w=tcp://127.0.0.1:1", "--page-size", "0"], "page_size"),
    (["w=tcp://127.0.0.1:1", "--interval", "0"], "--interval"),
    (["w=tcp://127.0.0.1:1", "--event-hash", "sha256_cbor"], "event_hash_seed"),
])
def test_the_command_exits_2_with_one_line(argv, says, capsys, monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err


def test_the_command_prints_each_workers_state(capsys):
    import json
    with WirePublisher(LOCAL, LOCAL) as pub:
        assert main([f"w0={pub.endpoint},{pub.replay_endpoint}", "x=tcp://127.0.0.1:1",
                     "--event-hash-seed", "0", "--duration", "1.5", "--interval", "0.5"]) == 0
    line = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert list(line) == ["w0", "x"]
    # w0's replay socket said it holds nothing: exact; x never answered
    assert line["w0"]["status"] == "exact" and line["w0"]["pages"] == 0
    assert line["w0"]["batches"] == 0 and line["x"]["last_seq"] is None
    assert line["x"]["status"] == "syncing"
    assert line["x"]["reason"].startswith("nothing from tcp://127.0.0.1:1 since ")


# ---------------------------------------------------------------- random losses

@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**20), fate=st.lists(st.sampled_from("sssssssddx"), min_size=30,
                                                 max_size=30),
       restart_at=st.none() | st.integers(2, 28), encoding=st.sampled_from(ALL))
def test_random_drops_duplicates_and_a_restart_end_exact(seed, fate, restart_at, encoding):
    """Each batch sent (s), dropped (d: kept for replay) or sent twice (x),
    the engine restarting (a fresh cache, its publisher counting from 0)
    before batch ``restart_at``, the batches either side of it sent (a seq
    going down: what the subscriber can see); the subscriber
    polling at random points. After a last batch it holds exactly the
    pages of the engine running then."""
    pc, batches, queries = engine_batches(seed, n=len(fate))
    if restart_at is not None:
        pc, after, queries = engine_batches(seed + 1, n=len(fate) - restart_at)
        batches = batches[:restart_at] + after
        fate[restart_at - 1] = fate[restart_at] = "s"  # a restart the numbers show
    ix = index()
    with WirePublisher(LOCAL, LOCAL, encoding=encoding) as pub, \
            KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, **SLOW) as sub:
        assert pub.wait_subscribers(1)
        # empty batches until one arrives: the subscriber surely listens (a
        # stray SUB socket of another test on a reused port can answer the
        # subscriber count), so the batches below meet the fates they are given
        deadline = time.monotonic() + 30
        while sub.stats("w")["last_seq"] is None:
            pub.publish([])
            sub.poll_once(50)
            assert time.monotonic() < deadline
        for i, (b, f) in enumerate(zip(batches, fate)):
            if i == restart_at:
                pub.restart()
            seq = pub.publish(b, send=f != "d")
            if f == "x":
                pub.send_raw([b"", seq.to_bytes(8, "big"), pub.buffer[-1][1]])
            if random.Random(seed + i).random() < 0.3:
                sub.poll_once(0)
        pub.publish([])
        wait(sub, caught_up(sub, "w", pub))
        s = sub.stats("w")
        assert s["duplicates"] == fate.count("x") and s["errors"] == 0, (s, "".join(fate))
        assert s["restarts"] == (restart_at is not None)
        live = batches[restart_at or 0:]
        assert ix.status("w") == "exact" and ix.blocks_of("w") == reference(live)
        assert [ix.overlap(q).tolist() for q in queries] == \
            [[pc.match_length(q)] for q in queries]


# ---------------------------------------------------------------- vLLM's own publisher

def _vllm_kv_events():
    try:
        import vllm.distributed.kv_events as kv
    except Exception as exc:  # ImportError, or vLLM failing to set itself up
        if os.environ.get("RADIX_SOA_REQUIRE_VLLM"):  # .ci/run's vLLM leg
            raise
        pytest.skip(f"vLLM's own publisher is not importable here ({type(exc).__name__}: "
                    f"{exc}); docs/guide/vllm.md says how to install it on CPU")
    return kv


def test_vllms_own_publisher_replayed_from_0_at_start(tmp_path):
    kv = _vllm_kv_events()
    pc, batches, queries = engine_batches(9)
    # ipc: vLLM's publisher binds it (a tcp address without '*' it would connect to)
    pub_at, replay_at = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    vpub = kv.ZmqEventPublisher(0, endpoint=pub_at, replay_endpoint=replay_at, topic="kv")

    def convert(e):
        if isinstance(e, rs.BlockStored):
            return kv.BlockStored(block_hashes=e.block_hashes,
                                  parent_block_hash=e.parent_block_hash,
                                  token_ids=e.token_ids, block_size=e.block_size, lora_id=None,
                                  medium="GPU", lora_name=None, group_idx=0)
        if isinstance(e, rs.BlockRemoved):
            return kv.BlockRemoved(block_hashes=e.block_hashes, medium="GPU", group_idx=0)
        return kv.AllBlocksCleared()

    ix = index()
    try:
        for b in batches[:10]:   # before the subscriber: missed, there to replay
            vpub.publish(kv.KVEventBatch(ts=1.0, events=[convert(e) for e in b]))
        # vLLM's publisher sends from a thread of its own: the ten must be sent
        # (into no subscriber) before ours connects, or some arrive live
        deadline = time.monotonic() + 30
        while len(getattr(vpub, "_buffer", ())) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
            if not hasattr(vpub, "_buffer"):  # another vLLM: its buffer named otherwise
                time.sleep(2)
                break
        ep = Endpoint(pub_at, replay_at, "kv")
        with KVEventSubscriber(ix, {"w": ep}, **SLOW) as sub:
            sent = 10
            # the stream is asked of the replay socket from 0 at once (ask, don't
            # wait); vLLM's PUB says nothing of subscribers: send empty batches
            # until the subscriber has caught up with them
            while not sub.wait(lambda: sub.stats("w")["last_seq"] == sent - 1 and
                               not sub.stats("w")["replaying"], timeout=0.2):
                assert sent < 200, sub.stats("w")
                vpub.publish(kv.KVEventBatch(ts=1.0, events=[]))
                sent += 1
            for b in batches[10:]:
                vpub.publish(kv.KVEventBatch(ts=1.0, events=[convert(e) for e in b]))
            total = sent + len(batches) - 10
            wait(sub, lambda: sub.stats("w")["last_seq"] == total - 1 and
                 not sub.stats("w")["replaying"])
            s = sub.stats("w")
            assert s["replayed"] >= 10 and s["errors"] == 0
            assert s["data_parallel_rank"] == 0
            assert ix.status("w") == "exact" and ix.blocks_of("w") == reference(batches)
            assert [ix.overlap(q).tolist() for q in queries] == \
                [[pc.match_length(q)] for q in queries]
    finally:
        vpub.shutdown()


# ---------------------------------------------------------------- ask, don't wait (issue 35)

def test_a_router_started_while_its_engine_idles_is_exact_without_a_new_batch(ctx):
    pc, batches, queries = engine_batches(21, n=6)
    ix = index()
    with WirePublisher(LOCAL, LOCAL, context=ctx) as pub:
        for b in batches:
            pub.publish(b)                      # before the router: nobody listens
        with KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, **SLOW) as sub:
            assert ix.status("w") == "syncing" and "replay" in ix.syncing["w"]
            wait(sub, lambda: ix.status("w") == "exact")   # no batch published since
            assert ix.blocks_of("w") == reference(batches)
            assert [ix.overlap(q).tolist() for q in queries] == \
                [[pc.match_length(q)] for q in queries]


def test_an_idle_engine_restart_is_seen_without_a_new_batch(ctx):
    _, batches, _ = engine_batches(22, n=6)
    ix = index()
    pub = WirePublisher(LOCAL, LOCAL, context=ctx)
    with KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)}, **SLOW) as sub:
        listening(sub, pub)
        for b in batches:
            pub.publish(b)
        wait(sub, caught_up(sub, "w", pub))
        assert ix.blocks_of("w") != []
        pub.close()
        pub = bind_again(pub.endpoint, pub.replay_endpoint, ctx)   # back, and idle
        wait(sub, lambda: sub.stats("w")["restarts"] == 1 and ix.status("w") == "exact")
        assert ix.blocks_of("w") == [] and sub.stats("w")["reconnects"] == 1
    pub.close()


def test_a_dropped_last_batch_is_found_by_a_probe(ctx):
    pc, batches, queries = engine_batches(23, n=6)
    ix = index()
    with WirePublisher(LOCAL, LOCAL, context=ctx) as pub, \
            KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)},
                              probe_every=0.2, **SLOW) as sub:
        listening(sub, pub)
        for i, b in enumerate(batches):
            pub.publish(b, send=i != len(batches) - 1)   # the last one lost; then idle
        wait(sub, caught_up(sub, "w", pub))
        s = sub.stats("w")
        assert s["probes"] >= 1 and s["gaps"] == 0 and ix.status("w") == "exact"
        assert ix.blocks_of("w") == reference(batches)


def test_without_probes_a_dropped_last_batch_stays_unseen(ctx):
    # the contrast: what the probe above is for
    _, batches, _ = engine_batches(23, n=6)
    ix = index()
    with WirePublisher(LOCAL, LOCAL, context=ctx) as pub, \
            KVEventSubscriber(ix, {"w": (pub.endpoint, pub.replay_endpoint)},
                              probe_every=None, **SLOW) as sub:
        listening(sub, pub)
        for i, b in enumerate(batches):
            pub.publish(b, send=i != len(batches) - 1)
        wait(sub, lambda: sub.stats("w")["last_seq"] == len(batches) - 2)
        assert not sub.wait(lambda: sub.stats("w")["last_seq"] == len(batches) - 1, timeout=1)
        assert sub.stats("w")["probes"] == 0
@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"])
def test_vllms_own_publisher_and_block_hashes_with_no_hash_flag(tmp_path, algo):
    """vLLM 0.34.0's own publisher, events and block hashes (``algo``, its
    ``prefix_caching_hash_algo``; NONE_HASH from PYTHONHASHSEED, or random
    per process when unset, as an engine draws it), LoRA pages among them,
    into an index made with no hash flag: pages keyed by their tokens, every
    overlap exact."""
    kv = _vllm_kv_events()
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as u

    fn = get_hash_fn_by_name(algo)
    u.init_none_hash(fn)
    pc, batches, queries = engine_batches(21, namespaces=(None, "adapter"))
    vh = {}  # the cache's own page hash -> vLLM's block hash of the same page

    def ext(h):
        return u.maybe_convert_block_hash(vh[h])  # vLLM's int form, as it publishes

    def convert(e):
        if isinstance(e, rs.BlockStored):
            parent = vh[e.parent_block_hash] if e.parent_block_hash is not None else None
            lora = e.lora_name
            extra = (("lora", lora, "/adapters/" + lora),) if lora else None  # vLLM's own keys
            out = []
            for j, h in enumerate(e.block_hashes):
                parent = u.hash_block_tokens(fn, parent, e.token_ids[j * PAGE:(j + 1) * PAGE],
                                             extra)
                vh[h] = parent
                out.append(u.maybe_convert_block_hash(parent))
            return kv.BlockStored(
                block_hashes=out,
                parent_block_hash=None if e.parent_block_hash is None else ext(
                    e.parent_block_hash),
                token_ids=e.token_ids, block_size=e.block_size, lora_id=None, medium="GPU",
                lora_name=lora,
                extra_keys=u.to_event_extra_keys([extra] * len(out)) if extra else None,
                group_idx=0)
        if isinstance(e, rs.BlockRemoved):
            return kv.BlockRemoved(block_hashes=[ext(h) for h in e.block_hashes], medium="GPU",
                                   group_idx=0)
        return kv.AllBlocksCleared()

    assert any(e.lora_name == "adapter" for b in batches for e in b
               if isinstance(e, rs.BlockStored))
    pub_at = f"ipc://{tmp_path}/pub"
    vpub = kv.ZmqEventPublisher(0, endpoint=pub_at, replay_endpoint=None, topic="kv")
    ix = index()  # no event_hash: the default
    try:
        with KVEventSubscriber(ix, {"w": Endpoint(pub_at, None, "kv")}, **SLOW) as sub:
            sent = 0
            while not sub.wait(lambda: sub.stats("w")["batches"] > 0, timeout=0.2):
                assert sent < 200, sub.stats("w")
                vpub.publish(kv.KVEventBatch(ts=1.0, events=[]))
                sent += 1
            for b in batches:
                vpub.publish(kv.KVEventBatch(ts=1.0, events=[convert(e) for e in b]))
            wait(sub, lambda: sub.stats("w")["last_seq"] == sent + len(batches) - 1)
            assert sub.stats("w")["errors"] == 0 and ix.status("w") == "exact"
            for q in queries:
                for ns in (None, "adapter"):
                    assert ix.overlap(q, lora_name=ns).tolist() == \
                        [pc.match_length(q, namespace=ns)], (q, ns)
            assert sorted(ix.blocks_of("w")) == sorted(ext(h) for h in reference(batches))
    finally:
        vpub.shutdown()
