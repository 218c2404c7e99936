"""Tests for radix_soa.workloads: regression pins for the original
generators, determinism, structural properties of the newer generators
(checked with plain-Python list logic, independent of the generator code),
as_trace, the registry and parameter validation."""

import hashlib
from collections import defaultdict

import numpy as np
import pytest

from radix_soa import RadixCache
from radix_soa import workloads as W
from radix_soa.studies.traces import Trace


def digest(seqs):
    """sha256 over (int64 length, little-endian int64 tokens) of every
    sequence in order, so both the tokens and the boundaries are pinned."""
    h = hashlib.sha256()
    for s in seqs:
        s = np.asarray(s)
        h.update(np.int64(len(s)).tobytes())
        h.update(s.astype("<i8").tobytes())
    return h.hexdigest()


def L(seq):
    return [int(x) for x in seq]


# ----------------------------------------------------------------------------
# regression pins
# ----------------------------------------------------------------------------

# Regression pins, not independent truths: these values were computed by
# running exactly `digest(getattr(W, name)(**kwargs))` (plus len and token
# total) against the ORIGINAL radix_soa/workloads.py at commit c651b1a, before
# the new generators were added. Benchmarks and other code rely on these
# outputs, so a change here means the old generators' output changed.
PINS = [
    ("shared_prefix", {}, 20000, 20206201,
     "8dc67c33c54e0f7d6a547283cce1b2a93b8756228e5394d6b3a2c695cd5b21d3"),
    ("long_shared_prefix", {}, 2000, 10041526,
     "b9e7706d0221f29cb7a4c647cf92ce5e54bb20ff6837357b67d839dfa81643e9"),
    ("multi_turn", {}, 3453, 3979008,
     "555d12c1193860bbdd0d7891cac86a4a307fe7d9665a0b08dcd564b42180b5c1"),
    ("shared_prefix", dict(n_sequences=300, n_prompts=7, prompt_len=50, tail_len=(1, 30),
                           vocab=1000, seed=3), 300, 19454,
     "a57226d209382f5eda93b6eb18024a2595169c7a9f86d6a76d1f9f3358de8612"),
    ("long_shared_prefix", dict(n_sequences=200, n_trunks=5, max_len=600, tail_len=(1, 20),
                                vocab=1000, seed=3), 200, 55205,
     "1ef383406bae4c2d99f9813e296c787df509c3417877d254a3322a385f4e5f99"),
    ("multi_turn", dict(n_conversations=40, turns=(1, 5), system_len=30, turn_len=(1, 20),
                        vocab=1000, n_system_prompts=3, seed=3), 127, 6888,
     "da31cc45cf49d518af6896fc245016e335ef71579600afd014a75a7bf16ce681"),
]


@pytest.mark.parametrize("name,kwargs,n,tokens,sha", PINS,
                         ids=[f"{p[0]}-{'default' if not p[1] else 'small'}" for p in PINS])
def test_original_generators_unchanged(name, kwargs, n, tokens, sha):
    seqs = getattr(W, name)(**kwargs)
    assert len(seqs) == n
    assert sum(len(s) for s in seqs) == tokens
    assert all(s.dtype == np.int64 and s.ndim == 1 for s in seqs)
    assert digest(seqs) == sha


# ----------------------------------------------------------------------------
# small configurations used below
# ----------------------------------------------------------------------------

FEW = dict(n_requests=400, n_exemplars=12, exemplar_len=(3, 9), shots=(0, 5), system_len=20,
           question_len=(1, 6), n_tasks=5, vocab=50)
CHAT = dict(n_conversations=60, turns=(1, 9), system_len=15, turn_len=(1, 7), edit_prob=0.2,
            regenerate_prob=0.2, n_system_prompts=3, vocab=40)
AGENT = dict(n_sessions=30, system_len=12, tools_len=9, steps=(1, 12), call_len=(1, 4),
             result_len=(2, 30), fork_prob=0.25, task_len=(1, 5), sub_steps=(1, 4), vocab=40)
NEW = [(W.few_shot, FEW), (W.multi_turn_branching, CHAT), (W.agent_loops, AGENT)]


def ids_of(cases):
    return [f.__name__ for f, _ in cases]


# ----------------------------------------------------------------------------
# determinism, output type
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("gen,kw", NEW, ids=ids_of(NEW))
def test_deterministic_per_seed(gen, kw):
    a, b = gen(**kw, seed=7), gen(**kw, seed=7)
    assert digest(a) == digest(b)
    assert digest(gen(**kw, seed=8)) != digest(a)
    assert all(isinstance(s, np.ndarray) and s.dtype == np.int64 and s.ndim == 1 for s in a)
    assert all(0 <= int(s.min()) and int(s.max()) < kw["vocab"] for s in a)
    # the meta flag does not change the sequences
    seqs, meta = gen(**kw, seed=7, return_meta=True)
    assert digest(seqs) == digest(a)
    assert all(len(col) == len(seqs) for col in meta.values())


@pytest.mark.parametrize("gen,kw", NEW, ids=ids_of(NEW))
def test_default_seed_is_zero(gen, kw):
    assert digest(gen(**kw)) == digest(gen(**kw, seed=0))


@pytest.mark.parametrize("gen,kw", NEW, ids=ids_of(NEW))
def test_zero_requests(gen, kw):
    count = {"few_shot": "n_requests", "multi_turn_branching": "n_conversations",
             "agent_loops": "n_sessions"}[gen.__name__]
    assert gen(**{**kw, count: 0}) == []
    seqs, meta = gen(**{**kw, count: 0}, return_meta=True)
    assert seqs == [] and all(len(v) == 0 for v in meta.values())


def test_branch_views_are_read_only():
    for gen, kw in NEW[1:]:
        s = gen(**kw)[-1]
        with pytest.raises(ValueError):
            s[0] = 1


# ----------------------------------------------------------------------------
# few_shot
# ----------------------------------------------------------------------------

def test_few_shot_structure():
    seqs, meta = W.few_shot(**FEW, return_meta=True)
    lists = [L(s) for s in seqs]
    sys_len = FEW["system_len"]
    system = lists[0][:sys_len]
    assert all(s[:sys_len] == system for s in lists)
    lo_e, hi_e = FEW["exemplar_len"]
    lo_q, hi_q = FEW["question_len"]
    for s, k, p in zip(lists, meta["shots"].tolist(), meta["prefix_len"].tolist()):
        assert FEW["shots"][0] <= k <= FEW["shots"][1]
        assert sys_len + k * lo_e <= p <= sys_len + k * hi_e
        assert lo_q <= len(s) - p <= hi_q
    assert set(meta["task"].tolist()) <= set(range(FEW["n_tasks"]))
    # within a task the templated prefixes nest: fewer shots = a prefix of more shots
    by_task = defaultdict(dict)
    for s, t, k, p in zip(lists, meta["task"].tolist(), meta["shots"].tolist(),
                          meta["prefix_len"].tolist()):
        prev = by_task[t].setdefault(k, s[:p])
        assert prev == s[:p]  # same task and k: same template
    for t, templates in by_task.items():
        ks = sorted(templates)
        for a, b in zip(ks, ks[1:]):
            assert templates[b][:len(templates[a])] == templates[a]
            assert len(templates[b]) > len(templates[a])
    # partial sharing: several tasks, several shot counts
    assert len(by_task) > 1 and len(set(meta["shots"].tolist())) > 1


def test_few_shot_task_popularity_is_skewed():
    _, meta = W.few_shot(n_requests=3000, n_tasks=10, task_zipf=1.0, system_len=1,
                         return_meta=True)
    counts = np.bincount(meta["task"], minlength=10)
    assert counts[0] > 2 * counts[9]


# ----------------------------------------------------------------------------
# multi_turn_branching
# ----------------------------------------------------------------------------

def test_multi_turn_branching_structure():
    seqs, meta = W.multi_turn_branching(**CHAT, return_meta=True)
    lists = [L(s) for s in seqs]
    conv, kind = meta["conversation"].tolist(), meta["kind"].tolist()
    parent, shared = meta["parent"].tolist(), meta["shared"].tolist()
    sys_len = CHAT["system_len"]
    lo, hi = CHAT["turn_len"]
    last_of = {}  # conversation -> index of its latest request so far
    per_conv = defaultdict(int)
    for i, s in enumerate(lists):
        c = conv[i]
        per_conv[c] += 1
        # parent is exactly the previous request of the same conversation
        assert parent[i] == last_of.get(c, -1)
        last_of[c] = i
        if kind[i] == "new":
            assert shared[i] == 0
            assert lo <= len(s) - sys_len <= hi
            continue
        p = lists[parent[i]]
        if kind[i] == "turn":  # extends: old history + reply + new user message
            assert s[:len(p)] == p and shared[i] == len(p)
            assert 2 * lo <= len(s) - len(p) <= 2 * hi
        elif kind[i] == "regenerate":
            assert s == p and shared[i] == len(p)
        else:
            assert kind[i] == "edit"
            b = shared[i]
            assert sys_len <= b < len(p)  # a strict prefix, never into the system prompt
            assert s[:b] == p[:b] and s[b] != p[b]  # branches exactly there
            assert lo <= len(s) - b <= hi
    assert sorted(per_conv) == list(range(CHAT["n_conversations"]))
    assert all(CHAT["turns"][0] <= n <= CHAT["turns"][1] for n in per_conv.values())
    assert {"new", "turn", "edit", "regenerate"} == set(kind)
    # edits hit the first user message and later ones
    points = [shared[i] for i in range(len(lists)) if kind[i] == "edit"]
    assert sys_len in points and any(b > sys_len for b in points)
    # every request starts with one of the system prompts
    systems = {tuple(s[:sys_len]) for s in lists}
    assert len(systems) <= CHAT["n_system_prompts"]


def test_multi_turn_branching_edit_continues_on_branch():
    seqs, meta = W.multi_turn_branching(**{**CHAT, "edit_prob": 0.3, "regenerate_prob": 0.0},
                                        return_meta=True)
    kind, parent = meta["kind"].tolist(), meta["parent"].tolist()
    # a turn right after an edit extends the edited request, not the old branch
    n = 0
    for i, k in enumerate(kind):
        if k == "turn" and kind[parent[i]] == "edit":
            p = L(seqs[parent[i]])
            assert L(seqs[i])[:len(p)] == p
            n += 1
    assert n > 0


def test_multi_turn_branching_without_branches_only_extends():
    seqs, meta = W.multi_turn_branching(**{**CHAT, "edit_prob": 0, "regenerate_prob": 0},
                                        return_meta=True)
    assert set(meta["kind"].tolist()) <= {"new", "turn"}
    latest = {}
    for s, c in zip(map(L, seqs), meta["conversation"].tolist()):
        if c in latest:
            assert s[:len(latest[c])] == latest[c] and len(s) > len(latest[c])
        latest[c] = s


def test_multi_turn_branching_all_edits():
    _, meta = W.multi_turn_branching(**{**CHAT, "edit_prob": 1.0, "regenerate_prob": 0.0},
                                     return_meta=True)
    assert set(meta["kind"].tolist()) == {"new", "edit"}


def test_multi_turn_branching_interleaves_in_time():
    seqs, meta = W.multi_turn_branching(n_conversations=100, system_len=5, turn_len=(1, 3),
                                        return_meta=True)
    t = meta["time"].tolist()
    assert all(a <= b for a, b in zip(t, t[1:]))
    conv = meta["conversation"].tolist()
    # not one conversation after another: many switches between conversations
    switches = sum(a != b for a, b in zip(conv, conv[1:]))
    assert switches > 2 * 100
    # and not a trivial round robin: some conversation starts after another's later turns
    first, last = {}, {}
    for i, c in enumerate(conv):
        first.setdefault(c, i)
        last[c] = i
    overlaps = sum(first[c] < last[d] and first[d] < last[c]
                   for c in range(0, 100, 10) for d in range(100) if d != c)
    assert overlaps > 0


# ----------------------------------------------------------------------------
# agent_loops
# ----------------------------------------------------------------------------

def test_agent_loops_structure():
    seqs, meta = W.agent_loops(**AGENT, return_meta=True)
    lists = [L(s) for s in seqs]
    trunk_len = AGENT["system_len"] + AGENT["tools_len"]
    trunk = lists[0][:trunk_len]
    assert all(s[:trunk_len] == trunk for s in lists)
    session, agent = meta["session"].tolist(), meta["agent"].tolist()
    kind, parent, shared = meta["kind"].tolist(), meta["parent"].tolist(), meta["shared"].tolist()
    (clo, chi), (rlo, rhi), (tlo, thi) = AGENT["call_len"], AGENT["result_len"], AGENT["task_len"]
    main_of = {}    # agent -> True for a session's main agent
    n_req = defaultdict(int)
    for i, s in enumerate(lists):
        n_req[agent[i]] += 1
        if kind[i] == "new":
            assert parent[i] == -1 and shared[i] == 0
            assert tlo <= len(s) - trunk_len <= thi
            assert agent[i] not in main_of
            main_of[agent[i]] = True
            continue
        j = parent[i]
        assert 0 <= j < i and session[j] == session[i]
        p = lists[j]
        assert s[:len(p)] == p and shared[i] == len(p)  # every request extends its parent
        if kind[i] == "fork":
            assert main_of.get(agent[j]) is True  # sub-agents are forked by main agents only
            assert agent[i] not in main_of
            main_of[agent[i]] = False
            assert clo <= len(s) - len(p) <= chi
        else:
            assert kind[i] == "step" and agent[j] == agent[i]
            assert clo + rlo <= len(s) - len(p) <= chi + rhi
    mains = [a for a, m in main_of.items() if m]
    subs = [a for a, m in main_of.items() if not m]
    assert len(mains) == AGENT["n_sessions"] and subs
    assert all(AGENT["steps"][0] <= n_req[a] <= AGENT["steps"][1] for a in mains)
    assert all(AGENT["sub_steps"][0] <= n_req[a] <= AGENT["sub_steps"][1] for a in subs)
    t = meta["time"].tolist()
    assert all(a <= b for a, b in zip(t, t[1:]))
    # sessions interleave
    switches = sum(a != b for a, b in zip(session, session[1:]))
    assert switches > AGENT["n_sessions"]


def test_agent_loops_parent_resumes_after_sub_agent():
    seqs, meta = W.agent_loops(**AGENT, return_meta=True)
    kind, agent, parent = meta["kind"].tolist(), meta["agent"].tolist(), meta["parent"].tolist()
    for i, k in enumerate(kind):
        if k != "fork":
            continue
        # the parent's next request comes after all of the sub-agent's requests,
        # and starts with the sub-agent's first request (context + spawning call)
        nxt = [m for m in range(len(kind)) if parent[m] == parent[i] and agent[m] != agent[i]]
        sub = [m for m in range(len(kind)) if agent[m] == agent[i]]
        if nxt:
            assert nxt[0] > max(sub)
            first = L(seqs[i])
            assert L(seqs[nxt[0]])[:len(first)] == first


def test_agent_loops_no_forks():
    _, meta = W.agent_loops(**{**AGENT, "fork_prob": 0.0}, return_meta=True)
    assert "fork" not in set(meta["kind"].tolist())
    assert len(set(meta["agent"].tolist())) == AGENT["n_sessions"]


def test_agent_result_lengths_are_log_uniform():
    # the median tool result is well below the midpoint of result_len
    seqs, meta = W.agent_loops(n_sessions=20, system_len=1, tools_len=1, call_len=(1, 1),
                               result_len=(10, 1000), fork_prob=0.0, return_meta=True)
    steps = [len(seqs[i]) - len(seqs[p]) - 1
             for i, (k, p) in enumerate(zip(meta["kind"].tolist(), meta["parent"].tolist()))
             if k == "step"]
    assert all(10 <= r <= 1000 for r in steps)
    assert np.median(steps) < 300


# ----------------------------------------------------------------------------
# consistency with the cache
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("gen,kw", NEW[1:], ids=ids_of(NEW[1:]))
def test_cache_hits_at_least_the_constructed_sharing(gen, kw):
    seqs, meta = gen(**kw, return_meta=True)
    rc = RadixCache()
    for s, sh in zip(seqs, meta["shared"].tolist()):
        assert rc.match_prefix(s) >= sh
        rc.insert(s)


# ----------------------------------------------------------------------------
# as_trace, registry
# ----------------------------------------------------------------------------

def test_as_trace():
    seqs, meta = W.multi_turn_branching(**CHAT, return_meta=True)
    t = W.as_trace(seqs, "chat", rate=3.0, output_len=(5, 9), seed=1)
    assert isinstance(t, Trace) and t.name == "chat" and len(t) == len(seqs)
    ts = t.timestamps.tolist()
    assert ts[0] == 0.0 and all(a <= b for a, b in zip(ts, ts[1:]))
    assert all(5 <= o <= 9 for o in t.output_tokens.tolist())
    assert [L(x) for x in t.sequences()] == [L(s) for s in seqs]
    assert t.input_tokens.tolist() == [len(s) for s in seqs]
    # mean gap ~ 1 / rate
    assert 0.2 < np.diff(t.timestamps).mean() < 0.5
    again = W.as_trace(seqs, "chat", rate=3.0, output_len=(5, 9), seed=1)
    assert np.array_equal(again.timestamps, t.timestamps)
    assert np.array_equal(again.output_tokens, t.output_tokens)
    own = W.as_trace(seqs, "chat", timestamps=meta["time"], output_len=4)
    assert np.array_equal(own.timestamps, meta["time"]) and set(own.output_tokens) == {4}
    assert len(W.as_trace([], "empty")) == 0


@pytest.mark.parametrize("kwargs", [
    dict(rate=0), dict(rate=-1.0), dict(rate=float("inf")), dict(output_len=-1),
    dict(output_len=(5, 4)), dict(output_len=(-1, 3)), dict(timestamps=[0.0, 1.0]),
    dict(timestamps=[0.0, 2.0, 1.0]), dict(timestamps=[-1.0, 0.0, 1.0]),
])
def test_as_trace_rejects_bad_parameters(kwargs):
    with pytest.raises(ValueError):
        W.as_trace([[1], [2], [3]], "x", **kwargs)


def test_registry_and_generate():
    assert W.GENERATORS == {"chat": W.shared_prefix, "few_shot": W.few_shot,
                            "multi_turn": W.multi_turn_branching, "agent": W.agent_loops,
                            "long_prefix": W.long_shared_prefix}
    assert digest(W.generate("agent", **AGENT, seed=3)) == digest(W.agent_loops(**AGENT, seed=3))
    for bad in ("nope", "", None, ["chat"]):
        with pytest.raises(ValueError) as e:
            W.generate(bad)
        for known in W.GENERATORS:
            assert known in str(e.value)


def test_generate_n_is_each_generators_size():
    assert W.SIZE_ARGUMENTS.keys() == W.GENERATORS.keys()
    small = {"chat": dict(prompt_len=4, tail_len=(1, 3)),
             "few_shot": dict(system_len=4),
             "multi_turn": dict(turns=(1, 3), system_len=4, turn_len=(1, 3), return_meta=True),
             "agent": {**{k: v for k, v in AGENT.items() if k != "n_sessions"},
                       "return_meta": True},
             "long_prefix": dict(max_len=50, tail_len=(1, 5))}
    # how many units of size each workload holds
    units = {"chat": len, "few_shot": len, "long_prefix": len,
             "multi_turn": lambda out: len(set(out[1]["conversation"].tolist())),
             "agent": lambda out: len(set(out[1]["session"].tolist()))}

    def seqs(out):
        return out[0] if isinstance(out, tuple) else out

    for name, size in W.SIZE_ARGUMENTS.items():
        kw = dict(small[name], seed=4)
        direct = W.GENERATORS[name](**{size: 6}, **kw)
        by_n = W.generate(name, n=6, **kw)
        by_own_name = W.generate(name, **{size: 6}, **kw)
        assert digest(seqs(by_n)) == digest(seqs(direct)) == digest(seqs(by_own_name)), name
        assert units[name](by_n) == 6, name


def test_generate_refuses_unknown_and_doubled_size_arguments():
    with pytest.raises(TypeError, match="'n_sessions'.*n= \\(or n_conversations=\\)"):
        W.generate("multi_turn", n_sessions=150)
    with pytest.raises(TypeError, match="'n_requests'"):
        W.generate("chat", n_requests=3)
    with pytest.raises(TypeError, match="both n and n_sequences"):
        W.generate("chat", n=3, n_sequences=3)
    with pytest.raises(TypeError, match="n must be an int"):
        W.generate("chat", n=2.0)
    with pytest.raises(TypeError, match="n must be an int"):
        W.generate("chat", n=True)
    with pytest.raises(ValueError, match="n must be >= 0"):
        W.generate("agent", n=-1)


# ----------------------------------------------------------------------------
# parameter validation
# ----------------------------------------------------------------------------

BAD = [
    (W.few_shot, dict(n_requests=-1)),
    (W.few_shot, dict(n_exemplars=-3)),
    (W.few_shot, dict(shots=(5, 2))),
    (W.few_shot, dict(shots=(-1, 2))),
    (W.few_shot, dict(shots=(2, 100), n_exemplars=10)),
    (W.few_shot, dict(exemplar_len=(0, 5))),
    (W.few_shot, dict(exemplar_len=(9, 3))),
    (W.few_shot, dict(question_len=(3,))),
    (W.few_shot, dict(system_len=-1)),
    (W.few_shot, dict(n_tasks=0)),
    (W.few_shot, dict(task_zipf=-1.0)),
    (W.few_shot, dict(n_requests=2.5)),
    (W.few_shot, dict(vocab=1)),
    (W.multi_turn_branching, dict(n_conversations=-1)),
    (W.multi_turn_branching, dict(turns=(3, 2))),
    (W.multi_turn_branching, dict(turns=(0, 2))),
    (W.multi_turn_branching, dict(turn_len=(0, 4))),
    (W.multi_turn_branching, dict(turn_len="ab")),
    (W.multi_turn_branching, dict(system_len=-5)),
    (W.multi_turn_branching, dict(edit_prob=-0.1)),
    (W.multi_turn_branching, dict(regenerate_prob=1.5)),
    (W.multi_turn_branching, dict(edit_prob=0.6, regenerate_prob=0.6)),
    (W.multi_turn_branching, dict(edit_prob=float("nan"))),
    (W.multi_turn_branching, dict(n_system_prompts=0)),
    (W.multi_turn_branching, dict(arrival_rate=0.0)),
    (W.multi_turn_branching, dict(think_time=-1.0)),
    (W.agent_loops, dict(n_sessions=-1)),
    (W.agent_loops, dict(steps=(10, 5))),
    (W.agent_loops, dict(steps=(0, 5))),
    (W.agent_loops, dict(call_len=(0, 5))),
    (W.agent_loops, dict(result_len=(100, 50))),
    (W.agent_loops, dict(task_len=(1, 0))),
    (W.agent_loops, dict(sub_steps=(2, 1))),
    (W.agent_loops, dict(system_len=-1)),
    (W.agent_loops, dict(tools_len=-1)),
    (W.agent_loops, dict(fork_prob=2.0)),
    (W.agent_loops, dict(step_time=-1.0)),
    (W.agent_loops, dict(arrival_rate=-2.0)),
    (W.agent_loops, dict(n_sessions=True)),
]


@pytest.mark.parametrize("gen,kwargs", BAD,
                         ids=[f"{g.__name__}-{'-'.join(k)}" for g, k in BAD])
def test_bad_parameters_raise(gen, kwargs):
    with pytest.raises(ValueError):
        gen(**kwargs)
