"""``RouterIndex`` against NVIDIA Dynamo's own router index
(``dynamo._core.RadixTree`` from ``ai-dynamo-runtime``, in the dev extra):
fed the same KV events, both give every worker the same overlap."""

import json

import numpy as np
import pytest

import radix_soa as rs

dynamo_core = pytest.importorskip(
    "dynamo._core", reason="ai-dynamo-runtime (the dev extra) provides Dynamo's RadixTree")


def local_hash(tokens):
    """Dynamo walks its tree by the hash of a block's tokens alone."""
    return hash(tuple(int(t) for t in tokens)) & (2**63 - 1)


def dynamo_event(i, e, page):
    if isinstance(e, rs.BlockStored):
        blocks = [{"block_hash": h, "tokens_hash": local_hash(e.token_ids[j * page:(j + 1) * page])}
                  for j, h in enumerate(e.block_hashes)]
        data = {"stored": {"parent_hash": e.parent_block_hash, "blocks": blocks}}
    else:
        data = {"removed": {"block_hashes": list(e.block_hashes)}}
    return json.dumps({"event_id": i, "data": data}).encode()


@pytest.mark.parametrize("page", [1, 4])
def test_the_same_events_give_the_same_scores_as_dynamos_radix_tree(page, monkeypatch):
    monkeypatch.setenv("RUST_LOG", "error")
    rng = np.random.default_rng(page)
    workers = 6
    caches = [rs.PrefixCache(capacity=60 * page, page_size=page, events=True, values=False)
              for _ in range(workers)]
    ix = rs.RouterIndex(page_size=page, workers=range(workers))
    tree = dynamo_core.RadixTree()
    prompts = [rng.integers(0, 50, size=int(k) * page).tolist() for k in rng.integers(1, 8, 6)]
    queries, n = [], [0] * workers
    removed = 0
    for step in range(300):
        w = int(rng.integers(0, workers))
        q = prompts[int(rng.integers(0, len(prompts)))] + \
            rng.integers(0, 3, size=int(rng.integers(0, 6)) * page).tolist()
        caches[w].insert(q)
        queries.append(q)
        events = caches[w].take_events()
        removed += sum(isinstance(e, rs.BlockRemoved) for e in events)
        ix.apply(w, events)
        for e in events:
            tree.apply_event(w, dynamo_event(n[w], e, page))
            n[w] += 1
        if step % 20 == 19:
            for qq in queries[-20:]:
                ours = (ix.overlap(qq) // page).tolist()
                scores = tree.find_matches(
                    [local_hash(qq[j * page:(j + 1) * page]) for j in range(len(qq) // page)]
                ).scores
                assert ours == [scores.get((v, 0), 0) for v in range(workers)]
                assert ours == [caches[v].match_length(qq) // page for v in range(workers)]
    assert removed > 10    # evictions were in the stream
    assert max(ix.overlap(queries[-1])) > 0
