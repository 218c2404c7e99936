"""``RouterIndex.apply_wire``: vLLM's msgpack batches applied from their
bytes give what ``apply`` gives for the decoded events, all or nothing,
and a malformed payload is an ``EventError`` naming its byte and event."""

import random

import msgpack
import numpy as np
import pytest

import radix_soa as rs
from radix_soa.integrations.vllm_wire import decode_events, encode_batch

PAGE = 2


def stream(seed, n=60, namespaces=(None, "ad", 5)):
    rng = random.Random(seed)
    pc = rs.PrefixCache(capacity=60, page_size=PAGE, events=True, values=False)
    batches, queries = [], []
    for _ in range(n):
        for _ in range(rng.randint(0, 3)):
            q = [rng.randint(0, 3) for _ in range(rng.randint(1, 20))]
            pc.insert(q, namespace=rng.choice(namespaces))
            queries.append(q)
        if rng.random() < 0.05:
            pc.reset()
        batches.append(pc.take_events())
    return batches, queries


def state(ix, queries, namespaces=(None, "ad", 5)):
    return ({w: ix.blocks_of(w) for w in ix.workers}, dict(ix.degraded),
            [ix.overlap(q, namespace=ns).tolist() for q in queries for ns in namespaces],
            len(ix))


@pytest.mark.parametrize("encoding", ["map", "array"])
@pytest.mark.parametrize("strict", [True, False])
def test_apply_wire_is_apply_of_the_decoded_events(encoding, strict):
    batches, queries = stream(1)
    a = rs.RouterIndex(page_size=PAGE, strict=strict)
    b = rs.RouterIndex(page_size=PAGE, strict=strict)
    for s, bt in enumerate(batches):
        p = encode_batch(bt, encoding=encoding, ts=2.5)
        a.apply("w", [e for _, e in decode_events(p)[1]], seq=s)
        got = b.apply_wire("w", p, seq=s)
        assert got.events == len(bt) and got.ts == 2.5 and not got.duplicate
    assert state(a, queries) == state(b, queries)
    assert b.apply_wire("w", encode_batch(batches[0]), seq=3).duplicate  # an old seq: skipped
    assert state(a, queries) == state(b, queries)


def test_apply_wire_of_vllm_09_arrays_and_lenient_problems():
    batches, queries = stream(2, namespaces=(None, 5))
    a = rs.RouterIndex(page_size=PAGE, strict=False)
    b = rs.RouterIndex(page_size=PAGE, strict=False)
    for s, bt in enumerate(batches):
        if s % 7 == 3:
            continue  # a lost batch: problems follow, the worker degrades
        p = encode_batch(bt, encoding="array-0.9")
        a.apply("w", [e for _, e in decode_events(p)[1]], seq=s)
        b.apply_wire("w", p, seq=s)
    assert state(a, queries, (None, 5)) == state(b, queries, (None, 5))
    assert b.status("w") == "degraded"


def test_a_strict_batch_that_fails_leaves_the_index_as_it_was():
    batches, queries = stream(3)
    ix = rs.RouterIndex(page_size=PAGE)
    for bt in batches[:30]:
        ix.apply_wire("w", encode_batch(bt))
    ix.apply_wire("v", encode_batch(batches[0]))
    before = state(ix, queries)
    handles = [m[2] for m in ix._hmaps.values()]
    # kernel runs, a clear (applied one by one) between them, then a problem
    later = [e for bt in batches[30:] for e in bt]
    bad = later + [rs.AllBlocksCleared()] + [e for bt in batches[:10] for e in bt] + \
        [rs.BlockRemoved([12345])]
    with pytest.raises(rs.EventError, match="BlockRemoved of block 12345"):
        ix.apply_wire("w", encode_batch(bad))
    assert state(ix, queries) == before and [m[2] for m in ix._hmaps.values()] == handles
    with pytest.raises(rs.EventError):
        ix.apply_wire("new", encode_batch([rs.BlockRemoved([1])]))
    assert "new" not in ix and state(ix, queries) == before


def test_medium_and_group_select_the_events_applied():
    ev = [{"type": "BlockStored", "block_hashes": [b"a" * 32], "parent_block_hash": None,
           "token_ids": [1, 2], "block_size": PAGE, "medium": "CPU"},
          {"type": "BlockStored", "block_hashes": [b"b" * 32], "parent_block_hash": None,
           "token_ids": [3, 4], "block_size": PAGE, "medium": "GPU", "group_idx": 1},
          {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None,
           "token_ids": [5, 6], "block_size": PAGE, "medium": "GPU", "group_idx": 0}]
    ix = rs.RouterIndex(page_size=PAGE, workers=["w"])
    got = ix.apply_wire("w", encode_batch(ev), medium="GPU", group_idx=0)
    assert (got.events, got.skipped) == (1, 2)
    assert [ix.overlap(q)[0] for q in ([1, 2], [3, 4], [5, 6])] == [0, 0, 2]


def test_lora_and_extra_keys_from_the_wire():
    ev = {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None,
          "token_ids": [1, 2, 3, 4], "block_size": PAGE, "lora_id": 2, "lora_name": "ad",
          "extra_keys": [["ad", "salt"], ["ad"]]}
    for encoding in ("map", "array"):
        ix = rs.RouterIndex(page_size=PAGE)
        ix.apply_wire("w", encode_batch([ev], encoding=encoding))
        assert ix.overlap([1, 2, 3, 4], lora_name="ad", extra_keys=["salt"]).tolist() == [4]
        assert ix.overlap([1, 2, 3, 4], lora_name="ad").tolist() == [0]
        ix.apply_wire("w", encode_batch([{"type": "BlockRemoved", "block_hashes": [12]}]))
        assert ix.overlap([1, 2, 3, 4], lora_name="ad", extra_keys=["salt"]).tolist() == [2]


def test_a_malformed_payload_names_its_byte_and_event_and_changes_nothing():
    batches, queries = stream(4, n=12)
    ix = rs.RouterIndex(page_size=PAGE)
    ix.apply_wire("w", encode_batch(batches[0]))
    before = state(ix, queries)
    good = encode_batch([e for bt in batches[1:] for e in bt])
    cases = [
        (b"", "byte 0: the payload ends"),
        (msgpack.packb({"ts": 1.0}), "events must be a list"),
        (msgpack.packb([1.0, [{"type": "Nope"}], 0]), "byte 17, event 0: unknown event type"),
        (msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}], 0]),
         "event 0: a block hash"),
        (msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1],
                               "parent_block_hash": None, "token_ids": [1], "block_size": 2}]]),
         "event 0: token_ids must hold"),
        (msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1],
                               "parent_block_hash": None, "token_ids": [1, 2, 3],
                               "block_size": 3}]]), "block_size 3 but this index has page_size"),
        (msgpack.packb([1.0, [["BlockRemoved"]], 0]), "event 0: an event with a number of fields"),
        (good + b"\x00", "bytes after the batch"),
        (msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1],
                               "parent_block_hash": None, "token_ids": [1, 2], "block_size": 2,
                               "lora_name": b"\xff"}]]), "event 0: medium and lora_name"),
    ]
    for payload, match in cases:
        with pytest.raises(rs.EventError, match=match):
            ix.apply_wire("w", payload)
        assert state(ix, queries) == before
    rng = random.Random(5)
    for cut in range(len(good)):  # every truncation is an error, never a crash
        with pytest.raises(rs.EventError, match=r"^byte \d+"):
            ix.apply_wire("w", good[:cut])
    for _ in range(300):  # a flipped byte: an error, or a batch that applies
        b = bytearray(good)
        b[rng.randrange(len(b))] = rng.randrange(256)
        other = rs.RouterIndex(page_size=PAGE, strict=False)
        try:
            other.apply_wire("w", bytes(b))
        except rs.EventError:
            assert len(other) == 0
    assert state(ix, queries) == before
