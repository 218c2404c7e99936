"""Seeded generators of token-sequence workloads with prefix structure.

Every generator is deterministic for a given ``seed`` and returns a list of
1-D int64 NumPy arrays.

>>> seqs = shared_prefix(n_sequences=4, n_prompts=2, prompt_len=8, tail_len=(2, 3))
>>> len(seqs), all(len(s) in (10, 11) for s in seqs)
(4, True)
"""

import numpy as np

DEFAULT_VOCAB = 32_000


def shared_prefix(n_sequences=20_000, n_prompts=50, prompt_len=800, tail_len=(20, 400),
                  vocab=DEFAULT_VOCAB, seed=0):
    """Chat-style traffic: each sequence is one of ``n_prompts`` system
    prompts of ``prompt_len`` tokens followed by a unique random tail of
    ``tail_len[0]..tail_len[1]`` tokens (inclusive)."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, vocab, size=(n_prompts, prompt_len), dtype=np.int64)
    which = rng.integers(0, n_prompts, size=n_sequences)
    lens = rng.integers(tail_len[0], tail_len[1] + 1, size=n_sequences)
    tails = rng.integers(0, vocab, size=int(lens.sum()), dtype=np.int64)
    out = []
    pos = 0
    for w, n in zip(which.tolist(), lens.tolist()):
        out.append(np.concatenate([prompts[w], tails[pos:pos + n]]))
        pos += n
    return out


def long_shared_prefix(n_sequences=2_000, n_trunks=32, max_len=10_000, tail_len=(1, 200),
                       vocab=DEFAULT_VOCAB, seed=0):
    """The seed-constraint shape: sequences up to ``max_len`` tokens that cut
    one of ``n_trunks`` long random trunks at a random point and add a short
    random tail, so prefixes of thousands of tokens are shared and nodes
    split deep inside long spans."""
    rng = np.random.default_rng(seed)
    trunk_max = max_len - tail_len[1]
    trunks = rng.integers(0, vocab, size=(n_trunks, trunk_max), dtype=np.int64)
    out = []
    for _ in range(n_sequences):
        t = int(rng.integers(0, n_trunks))
        cut = int(rng.integers(1, trunk_max + 1))
        tail = rng.integers(0, vocab, size=int(rng.integers(tail_len[0], tail_len[1] + 1)),
                            dtype=np.int64)
        out.append(np.concatenate([trunks[t, :cut], tail]))
    return out


def multi_turn(n_conversations=500, turns=(2, 12), system_len=400, turn_len=(20, 300),
               vocab=DEFAULT_VOCAB, n_system_prompts=8, seed=0):
    """Multi-turn chat: every turn's request is the whole history so far, so
    each request extends the previous one of its conversation. Returned in
    conversation order (turn after turn)."""
    rng = np.random.default_rng(seed)
    systems = rng.integers(0, vocab, size=(n_system_prompts, system_len), dtype=np.int64)
    out = []
    for _ in range(n_conversations):
        history = systems[int(rng.integers(0, n_system_prompts))]
        for _ in range(int(rng.integers(turns[0], turns[1] + 1))):
            step = rng.integers(0, vocab, size=int(rng.integers(turn_len[0], turn_len[1] + 1)),
                                dtype=np.int64)
            history = np.concatenate([history, step])
            out.append(history)
    return out
