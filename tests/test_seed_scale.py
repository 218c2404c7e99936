"""The seed constraint at full scale: 10^5 operations on sequences of up to
10^4 tokens with long shared prefixes."""

import numpy as np
import pytest

from radix_soa import RadixCache, workloads
from radix_soa.baselines.reference import ReferenceRadixTree

N_OPS = 100_000
MAX_LEN = 10_000


@pytest.mark.slow
def test_seed_constraint_scale():
    pool = workloads.long_shared_prefix(n_sequences=1500, n_trunks=24, max_len=MAX_LEN,
                                        vocab=200, seed=3)
    assert max(len(s) for s in pool) <= MAX_LEN
    assert max(len(s) for s in pool) > 9_000
    keys = [s.tobytes() for s in pool]
    rng = np.random.default_rng(11)
    kinds = rng.choice(4, size=N_OPS, p=[0.4, 0.4, 0.1, 0.1])
    picks = rng.integers(0, len(pool), size=N_OPS)
    rc = RadixCache()
    stored = set()
    for step, (kind, i) in enumerate(zip(kinds.tolist(), picks.tolist())):
        seq, key = pool[i], keys[i]
        if kind == 0:
            assert rc.insert(seq) == (key not in stored)
            stored.add(key)
        elif kind == 1:
            assert rc.exists(seq) == (key in stored)
        elif kind == 2:
            if key in stored:
                rc.remove(seq)
                stored.discard(key)
            else:
                with pytest.raises(KeyError):
                    rc.remove(seq)
        else:
            cut = len(seq) // 2
            # a stored sequence through this prefix makes the match at least cut long
            assert rc.match_prefix(seq[:cut]) == cut or key not in stored
        if step % 25_000 == 0:
            rc.check_invariants()
    rc.check_invariants()
    assert len(rc) == len(stored)

    # the final tree is exactly the canonical tree of what is stored
    ref = ReferenceRadixTree()
    for s in pool:
        if s.tobytes() in stored:
            ref.insert(s)
    assert (rc.num_nodes, rc.num_tokens) == (ref.num_nodes, ref.num_tokens)
    flat, off = rc.to_csr()
    assert {flat[off[j]:off[j + 1]].tobytes() for j in range(len(off) - 1)} == stored
    # the stored tokens are far fewer than the tokens held by the sequences
    assert rc.num_tokens < 0.5 * sum(len(s) for s in pool if s.tobytes() in stored)
    for j in rng.integers(0, len(pool), size=300).tolist():
        q = np.concatenate([pool[j][: int(rng.integers(1, len(pool[j]) + 1))], [-7]])
        assert rc.match_prefix(q) == ref.match_prefix(q)
