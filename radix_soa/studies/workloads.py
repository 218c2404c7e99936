"""Seeded generators of token-sequence workloads with prefix structure.

Every generator is deterministic for a given ``seed`` (one
``np.random.default_rng(seed)`` per call) and returns a list of 1-D int64
NumPy arrays, one per request, in arrival order.

=================================  ==========================================
``shared_prefix`` ("chat")         one of a few system prompts + unique tail
``long_shared_prefix``             cuts of a few very long trunks + short tail
``multi_turn``                     whole-history chat turns, one conversation
                                   after another (kept for the benchmarks)
``few_shot``                       system prompt + first *k* exemplars of a
                                   task's fixed list + unique question
``multi_turn_branching``           interleaved conversations with edits and
                                   regenerations that branch the history
``agent_loops``                    shared system+tools trunk, sessions that
                                   append tool call/result pairs and fork
                                   sub-agents, interleaved in time
=================================  ==========================================

The loaders of real traces (``load_mooncake``, ``load_kvcache_tester``,
``load_token_jsonl``, ``load_trace``; defined in :mod:`radix_soa.studies.traces`) are
available here too, so one module gives every workload.

:data:`GENERATORS` maps short names to generators and :func:`generate` calls
one by name; :func:`as_trace` wraps any list of sequences into a
:class:`radix_soa.studies.traces.Trace` with Poisson arrival times and output
lengths, so replay code can take generated and real traces alike.

The three newer generators (``few_shot``, ``multi_turn_branching``,
``agent_loops``) validate their parameters (``ValueError`` for negative
counts, empty or out-of-bounds ``(low, high)`` ranges, probabilities outside
[0, 1], ...) and take ``return_meta=True`` to also return a dict of per-request
NumPy columns describing how each request was built. In
``multi_turn_branching`` and ``agent_loops`` a request that extends an
earlier one is a *read-only view* of a buffer shared with the requests of
the same branch (this keeps agent contexts of tens of thousands of tokens
from being copied once per step); copy an array before modifying it.
All ranges ``(low, high)`` are inclusive.

>>> seqs = shared_prefix(n_sequences=4, n_prompts=2, prompt_len=8, tail_len=(2, 3))
>>> len(seqs), all(len(s) in (10, 11) for s in seqs)
(4, True)
>>> sorted(GENERATORS)
['agent', 'chat', 'few_shot', 'long_prefix', 'multi_turn']
>>> t = as_trace(generate("few_shot", n_requests=5, system_len=4), "fs", rate=2.0)
>>> len(t), bool((t.timestamps[1:] >= t.timestamps[:-1]).all())
(5, True)
"""

import inspect
import math
from numbers import Integral, Real

import numpy as np

from .._input.validate import check_int
from .traces import (Trace, TraceFormatError, load_kvcache_tester, load_mooncake,  # noqa: F401
                     load_token_jsonl, load_trace)

__all__ = [
    "load_mooncake",
    "load_kvcache_tester",
    "load_token_jsonl",
    "load_trace",
    "TraceFormatError",
    "DEFAULT_VOCAB",
    "shared_prefix",
    "long_shared_prefix",
    "multi_turn",
    "few_shot",
    "multi_turn_branching",
    "agent_loops",
    "as_trace",
    "GENERATORS",
    "SIZE_ARGUMENTS",
    "generate",
]

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


# ----------------------------------------------------------------------------
# parameter checks and small helpers (used by the newer generators only; the
# three generators above are kept byte-for-byte as they were)
# ----------------------------------------------------------------------------

def _count(name, v, minimum=0):
    if isinstance(v, bool) or not isinstance(v, Integral):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return int(v)


def _range(name, r, minimum=0):
    try:
        lo, hi = r
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (low, high) pair of integers, got {r!r}") from None
    for v in (lo, hi):
        if isinstance(v, bool) or not isinstance(v, Integral):
            raise ValueError(f"{name} must be a (low, high) pair of integers, got {r!r}")
    if lo > hi:
        raise ValueError(f"{name} is an empty range: low {lo} > high {hi}")
    if lo < minimum:
        raise ValueError(f"{name} must have low >= {minimum}, got {r!r}")
    return int(lo), int(hi)


def _real(name, v, *, positive=False, at_most=None):
    if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    if v < 0 or (positive and v == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {v}")
    if at_most is not None and v > at_most:
        raise ValueError(f"{name} must be <= {at_most}, got {v}")
    return float(v)


def _vocab(vocab):
    # >= 2 so that an edited message can be made to differ from the original
    return _count("vocab", vocab, minimum=2)


def _tokens(rng, n, vocab):
    return rng.integers(0, vocab, size=n, dtype=np.int64)


def _uniform(rng, r):
    return int(rng.integers(r[0], r[1] + 1))


def _log_uniform(rng, r):
    """An int in ``r`` whose logarithm is uniform: most draws are short, a
    few are long (tool outputs: a status line, sometimes a whole file)."""
    lo, hi = r
    x = int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))
    return min(max(x, lo), hi)


def _zipf(n, a):
    """Popularity weights ``1 / rank**a`` for ranks 1..n, normalised."""
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** a
    return w / w.sum()


class _Branch:
    """One linear token history, built by appending chunks; requests on it
    are prefixes ``buf[:end]``. Forking copies the chunk list (references),
    not the tokens; :meth:`buffer` concatenates once, read-only."""

    __slots__ = ("chunks", "length", "_buf")

    def __init__(self, chunks=()):
        self.chunks = list(chunks)
        self.length = sum(len(c) for c in self.chunks)
        self._buf = None

    def append(self, *parts):
        for p in parts:
            self.chunks.append(p)
            self.length += len(p)

    def offset(self, i):
        """Tokens before chunk ``i``."""
        return sum(len(c) for c in self.chunks[:i])

    def buffer(self):
        if self._buf is None:
            buf = (np.concatenate(self.chunks) if self.chunks
                   else np.zeros(0, dtype=np.int64))
            buf.setflags(write=False)
            self._buf = buf
        return self._buf


class _Log:
    """Requests as they are generated (each session in causal order), then
    merged by time into arrival order."""

    def __init__(self, columns):
        self.time, self.branch, self.end, self.parent = [], [], [], []
        self.cols = {c: [] for c in columns}

    def add(self, time, branch, parent, **cols):
        """Record a request ``branch[:branch.length]``; returns its id."""
        self.time.append(time)
        self.branch.append(branch)
        self.end.append(branch.length)
        self.parent.append(parent)
        for k, v in cols.items():
            self.cols[k].append(v)
        return len(self.time) - 1

    def end_of(self, rid):
        return self.end[rid]

    def finish(self, return_meta):
        n = len(self.time)
        times = np.asarray(self.time, dtype=np.float64).reshape(n)
        # stable: ties keep generation order, so a request never precedes
        # the request it extends
        order = np.argsort(times, kind="stable")
        seqs = [self.branch[i].buffer()[:self.end[i]] for i in order.tolist()]
        if not return_meta:
            return seqs
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n, dtype=np.int64)
        parent = np.asarray(self.parent, dtype=np.int64).reshape(n)[order]
        parent = np.where(parent >= 0, rank[np.maximum(parent, 0)], -1) if n else parent
        meta = {}
        for k, v in self.cols.items():
            a = np.asarray(v) if k == "kind" else np.asarray(v, dtype=np.int64)
            meta[k] = a.reshape(n)[order] if n else a.reshape(0)
        meta["parent"] = parent
        meta["time"] = times[order]
        return seqs, meta


# ----------------------------------------------------------------------------
# few-shot prompting
# ----------------------------------------------------------------------------

def few_shot(n_requests=5000, n_exemplars=64, exemplar_len=(100, 300), shots=(2, 8),
             system_len=200, question_len=(20, 200), n_tasks=16, task_zipf=1.0,
             exemplar_zipf=1.0, vocab=DEFAULT_VOCAB, seed=0, return_meta=False):
    """Few-shot prompts: one shared system prompt, then the first *k*
    exemplars of the request's task, then a unique question.

    **Exemplar choice (task lists).** There is a pool of ``n_exemplars``
    exemplar blocks (``exemplar_len`` tokens each). Each of ``n_tasks``
    tasks fixes an *ordered* list of ``shots[1]`` distinct exemplars, drawn
    from the pool without replacement with Zipf(``exemplar_zipf``)
    popularity, so popular exemplars appear in many tasks and sometimes
    lead them. A request picks its task with Zipf(``task_zipf``) popularity
    (task 0 the most popular), draws ``k`` uniformly from ``shots`` and uses
    the *first* ``k`` exemplars of its task's list, as prompt templates that
    cut a fixed list at a shot budget do. Requests are independent, in
    arrival order. Sharing is therefore partial: two requests of one task
    share the system prompt plus ``min(k1, k2)`` exemplars; requests of
    different tasks share the system prompt, plus leading exemplars when
    their lists happen to start alike.

    Request length = ``system_len`` + the *k* exemplar lengths +
    ``question_len``. With ``return_meta=True`` also returns a dict of
    per-request int64 arrays: ``task``, ``shots`` (*k*) and ``prefix_len``
    (system prompt + exemplar tokens, i.e. everything but the question).

    >>> seqs, meta = few_shot(n_requests=6, n_exemplars=4, exemplar_len=(3, 5),
    ...                       shots=(1, 3), system_len=8, question_len=(1, 2),
    ...                       n_tasks=2, return_meta=True)
    >>> len(seqs), all((s[:8] == seqs[0][:8]).all() for s in seqs)
    (6, True)
    >>> all(1 <= k <= 3 for k in meta["shots"])
    True
    """
    n_requests = _count("n_requests", n_requests)
    n_exemplars = _count("n_exemplars", n_exemplars)
    exemplar_len = _range("exemplar_len", exemplar_len, minimum=1)
    shots = _range("shots", shots, minimum=0)
    system_len = _count("system_len", system_len)
    question_len = _range("question_len", question_len, minimum=1)
    n_tasks = _count("n_tasks", n_tasks, minimum=1)
    task_zipf = _real("task_zipf", task_zipf)
    exemplar_zipf = _real("exemplar_zipf", exemplar_zipf)
    vocab = _vocab(vocab)
    if shots[1] > n_exemplars:
        raise ValueError(f"shots[1] ({shots[1]}) exceeds n_exemplars ({n_exemplars}); "
                         f"a task lists shots[1] distinct exemplars")

    rng = np.random.default_rng(seed)
    system = _tokens(rng, system_len, vocab)
    ex_lens = rng.integers(exemplar_len[0], exemplar_len[1] + 1, size=n_exemplars)
    pool = np.split(_tokens(rng, int(ex_lens.sum()), vocab), np.cumsum(ex_lens)[:-1]) \
        if n_exemplars else []
    ex_p = _zipf(n_exemplars, exemplar_zipf) if n_exemplars else None
    task_prefix, task_ends = [], []
    for _ in range(n_tasks):
        lst = rng.choice(n_exemplars, size=shots[1], replace=False, p=ex_p).tolist() \
            if shots[1] else []
        task_prefix.append(np.concatenate([system] + [pool[e] for e in lst]))
        task_ends.append((system_len + np.concatenate(
            [[0], np.cumsum(ex_lens[lst], dtype=np.int64)])).tolist())
    which = rng.choice(n_tasks, size=n_requests, p=_zipf(n_tasks, task_zipf))
    ks = rng.integers(shots[0], shots[1] + 1, size=n_requests)
    qlens = rng.integers(question_len[0], question_len[1] + 1, size=n_requests)
    questions = _tokens(rng, int(qlens.sum()), vocab)
    out, prefix_len = [], []
    pos = 0
    for w, k, n in zip(which.tolist(), ks.tolist(), qlens.tolist()):
        end = task_ends[w][k]
        out.append(np.concatenate([task_prefix[w][:end], questions[pos:pos + n]]))
        prefix_len.append(end)
        pos += n
    if not return_meta:
        return out
    return out, {"task": which.astype(np.int64), "shots": ks.astype(np.int64),
                 "prefix_len": np.asarray(prefix_len, dtype=np.int64).reshape(n_requests)}


# ----------------------------------------------------------------------------
# multi-turn chat with edits and regenerations
# ----------------------------------------------------------------------------

def multi_turn_branching(n_conversations=500, turns=(2, 12), system_len=400, turn_len=(20, 300),
                         edit_prob=0.1, regenerate_prob=0.1, n_system_prompts=8,
                         arrival_rate=1.0, think_time=30.0, vocab=DEFAULT_VOCAB, seed=0,
                         return_meta=False):
    """Chat conversations whose histories branch, interleaved in time.

    Each conversation starts with one of ``n_system_prompts`` system prompts
    (``system_len`` tokens) and makes ``turns`` requests (drawn uniformly);
    every message, user or assistant, is ``turn_len`` tokens. The first
    request is system + first user message. Each later request is, with
    probability

    * ``edit_prob`` -- an **edit**: the user rewrites one of the user
      messages of the current history (chosen uniformly, the latest
      included). The request is the history *before* that message plus the
      new message, whose first token differs from the old one's, so it
      shares a strict prefix of the previous request and branches there; the
      conversation continues on the new branch;
    * ``regenerate_prob`` -- a **regeneration**: the previous request is sent
      again, token for token. The discarded reply never appears in a
      request (it was output only); the next turn carries a fresh reply, so
      the history branches at the reply;
    * otherwise a **turn**: the history plus the assistant's reply plus a new
      user message, extending the previous request.

    **Interleaving.** Conversations start as a Poisson process of
    ``arrival_rate`` conversations per second; within a conversation
    consecutive requests are separated by exponential think times of mean
    ``think_time`` seconds. All requests are merged by time (a stable sort,
    so a request never precedes the one it extends). With the defaults a
    conversation lasts minutes and about a hundred are active at once.

    With ``return_meta=True`` also returns a dict of per-request arrays
    (arrival order): ``conversation``; ``kind`` (``"new"``, ``"turn"``,
    ``"edit"``, ``"regenerate"``); ``parent``, the index of the previous
    request of the same conversation (-1 for ``"new"``); ``shared``, the
    tokens shared with ``parent`` by construction (its whole length except
    for edits, where it is the branch point; 0 for ``"new"``); ``time``
    (seconds).

    >>> seqs, meta = multi_turn_branching(n_conversations=3, turns=(2, 4), system_len=5,
    ...                                   turn_len=(1, 3), return_meta=True)
    >>> all(meta["parent"][i] < i for i in range(len(seqs)))
    True
    >>> sorted(set(meta["kind"].tolist()) - {"new", "turn", "edit", "regenerate"})
    []
    """
    n_conversations = _count("n_conversations", n_conversations)
    turns = _range("turns", turns, minimum=1)
    system_len = _count("system_len", system_len)
    turn_len = _range("turn_len", turn_len, minimum=1)
    edit_prob = _real("edit_prob", edit_prob, at_most=1.0)
    regenerate_prob = _real("regenerate_prob", regenerate_prob, at_most=1.0)
    if edit_prob + regenerate_prob > 1.0:
        raise ValueError(f"edit_prob + regenerate_prob must be <= 1, got "
                         f"{edit_prob} + {regenerate_prob}")
    n_system_prompts = _count("n_system_prompts", n_system_prompts, minimum=1)
    arrival_rate = _real("arrival_rate", arrival_rate, positive=True)
    think_time = _real("think_time", think_time)
    vocab = _vocab(vocab)

    rng = np.random.default_rng(seed)
    systems = _tokens(rng, (n_system_prompts, system_len), vocab)
    starts = np.cumsum(rng.exponential(1.0 / arrival_rate, size=n_conversations)).tolist()
    log = _Log(("conversation", "kind", "shared"))

    def msg():
        return _tokens(rng, _uniform(rng, turn_len), vocab)

    for c in range(n_conversations):
        t = starts[c]
        branch = _Branch([systems[int(rng.integers(n_system_prompts))], msg()])
        user_chunks = [1]  # chunk index of each user message on the branch
        prev = log.add(t, branch, -1, conversation=c, kind="new", shared=0)
        for _ in range(1, _uniform(rng, turns)):
            t += float(rng.exponential(think_time)) if think_time > 0 else 0.0
            x = rng.random()
            if x < edit_prob:
                j = int(rng.integers(len(user_chunks)))
                ci = user_chunks[j]
                new = msg()
                old_first = int(branch.chunks[ci][0])
                new[0] = (old_first + 1 + int(rng.integers(vocab - 1))) % vocab
                shared = branch.offset(ci)
                branch = _Branch(branch.chunks[:ci])
                branch.append(new)
                user_chunks = user_chunks[:j] + [ci]
                kind = "edit"
            elif x < edit_prob + regenerate_prob:
                shared = log.end_of(prev)
                kind = "regenerate"
            else:
                shared = log.end_of(prev)
                branch.append(msg(), msg())  # assistant reply, next user message
                user_chunks.append(len(branch.chunks) - 1)
                kind = "turn"
            prev = log.add(t, branch, prev, conversation=c, kind=kind, shared=shared)
    return log.finish(return_meta)


# ----------------------------------------------------------------------------
# agent loops
# ----------------------------------------------------------------------------

def agent_loops(n_sessions=200, system_len=2000, tools_len=1500, steps=(5, 40),
                call_len=(20, 120), result_len=(50, 2000), fork_prob=0.1, task_len=(50, 500),
                sub_steps=(2, 10), arrival_rate=0.2, step_time=5.0, vocab=DEFAULT_VOCAB, seed=0,
                return_meta=False):
    """Tool-using agent sessions over one shared trunk, interleaved in time.

    Every request starts with the same trunk: a system prompt
    (``system_len`` tokens) followed by tool definitions (``tools_len``).
    A session appends its task (``task_len``) and sends its first request;
    then each of its remaining ``steps - 1`` requests (``steps`` drawn
    uniformly) appends the model's tool call (``call_len``, uniform) and the
    tool's result (``result_len``, *log*-uniform: mostly short, sometimes
    long) to the context, each request being the whole context.

    **Sub-agents.** Before a step, with probability ``fork_prob``, the
    model's tool call spawns a sub-agent: the sub-agent's first request is
    the current context plus that call (a branch of the parent's context),
    and it then runs ``sub_steps`` requests in all, appending call/result
    pairs like its parent. Sub-agents do not fork further. The parent
    waits for it (as a synchronous task tool does) and then appends the
    same call plus the sub-agent's report (``result_len``) as its step.

    **Interleaving.** Sessions start as a Poisson process of
    ``arrival_rate`` sessions per second; consecutive requests of one agent
    are separated by exponential gaps of mean ``step_time`` seconds (model
    latency plus tool time), a sub-agent starts one gap after its parent's
    last request and the parent resumes one gap after the sub-agent's last.
    All requests are merged by time (stable, so causal order is kept).

    With ``return_meta=True`` also returns a dict of per-request arrays
    (arrival order): ``session``; ``agent`` (a unique id per main agent or
    sub-agent); ``kind`` (``"new"``: a session's first request, ``"fork"``:
    a sub-agent's first request, ``"step"``); ``parent`` (the request this
    one extends: the agent's previous request, or for ``"fork"`` the
    parent agent's latest request; -1 for ``"new"``); ``shared``
    (``len(parent)``, 0 for ``"new"``); ``time`` (seconds).

    >>> seqs = agent_loops(n_sessions=3, system_len=6, tools_len=4, steps=(2, 5),
    ...                    call_len=(1, 3), result_len=(1, 9), task_len=(1, 2))
    >>> all((s[:10] == seqs[0][:10]).all() for s in seqs)
    True
    >>> seqs[0].flags.writeable
    False
    """
    n_sessions = _count("n_sessions", n_sessions)
    system_len = _count("system_len", system_len)
    tools_len = _count("tools_len", tools_len)
    steps = _range("steps", steps, minimum=1)
    call_len = _range("call_len", call_len, minimum=1)
    result_len = _range("result_len", result_len, minimum=1)
    fork_prob = _real("fork_prob", fork_prob, at_most=1.0)
    task_len = _range("task_len", task_len, minimum=1)
    sub_steps = _range("sub_steps", sub_steps, minimum=1)
    arrival_rate = _real("arrival_rate", arrival_rate, positive=True)
    step_time = _real("step_time", step_time)
    vocab = _vocab(vocab)

    rng = np.random.default_rng(seed)
    system = _tokens(rng, system_len, vocab)
    tools = _tokens(rng, tools_len, vocab)
    starts = np.cumsum(rng.exponential(1.0 / arrival_rate, size=n_sessions)).tolist()
    log = _Log(("session", "agent", "kind", "shared"))
    n_agents = 0

    def gap():
        return float(rng.exponential(step_time)) if step_time > 0 else 0.0

    def call():
        return _tokens(rng, _uniform(rng, call_len), vocab)

    def result():
        return _tokens(rng, _log_uniform(rng, result_len), vocab)

    for s in range(n_sessions):
        t = starts[s]
        me, n_agents = n_agents, n_agents + 1
        branch = _Branch([system, tools, _tokens(rng, _uniform(rng, task_len), vocab)])
        prev = log.add(t, branch, -1, session=s, agent=me, kind="new", shared=0)
        for _ in range(1, _uniform(rng, steps)):
            t += gap()
            c = call()
            if rng.random() < fork_prob:
                sub_id, n_agents = n_agents, n_agents + 1
                sub = _Branch(branch.chunks)
                sub.append(c)
                sp = log.add(t, sub, prev, session=s, agent=sub_id, kind="fork",
                             shared=log.end_of(prev))
                for _ in range(1, _uniform(rng, sub_steps)):
                    t += gap()
                    shared = sub.length
                    sub.append(call(), result())
                    sp = log.add(t, sub, sp, session=s, agent=sub_id, kind="step",
                                 shared=shared)
                t += gap()
            shared = branch.length
            branch.append(c, result())
            prev = log.add(t, branch, prev, session=s, agent=me, kind="step", shared=shared)
    return log.finish(return_meta)


# ----------------------------------------------------------------------------
# traces, registry
# ----------------------------------------------------------------------------

def as_trace(seqs, name, *, rate=1.0, output_len=(20, 300), seed=0, timestamps=None):
    """Wrap sequences (in arrival order) into a :class:`radix_soa.studies.traces.Trace`.

    Arrival times are a Poisson process of ``rate`` requests per second
    starting at 0.0 (exponential gaps), unless ``timestamps`` (one
    non-decreasing, finite, non-negative value per sequence, e.g.
    ``meta["time"]`` of a generator) is given. ``output_len`` is a constant
    int or an inclusive ``(low, high)`` range drawn uniformly per request.
    ``block_size`` is 1 (one id per token) and ``input_tokens`` the lengths.
    Deterministic for ``seed``. The trace stores the tokens flat, so it
    copies them.

    >>> t = as_trace([[1, 2], [1, 2, 3], [4]], "toy", rate=5.0, output_len=7)
    >>> len(t), float(t.timestamps[0]), t.output_tokens.tolist(), t[1].tolist()
    (3, 0.0, [7, 7, 7], [1, 2, 3])
    >>> as_trace([[1]], "toy", rate=0)
    Traceback (most recent call last):
    ...
    ValueError: rate must be > 0, got 0
    """
    n = len(seqs)
    rate = _real("rate", rate, positive=True)
    if isinstance(output_len, Integral) and not isinstance(output_len, bool):
        output_len = (_count("output_len", output_len),) * 2
    else:
        output_len = _range("output_len", output_len)
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=n)
    out = rng.integers(output_len[0], output_len[1] + 1, size=n, dtype=np.int64)
    if timestamps is None:
        ts = np.zeros(n, dtype=np.float64)
        np.cumsum(gaps[:-1], out=ts[1:])
    else:
        ts = np.asarray(timestamps, dtype=np.float64)
        if ts.shape != (n,):
            raise ValueError(f"timestamps must have shape ({n},), got {ts.shape}")
        if n and (not np.isfinite(ts).all() or ts.min() < 0):
            raise ValueError("timestamps must be finite and non-negative")
        if n > 1 and np.any(np.diff(ts) < 0):
            raise ValueError("timestamps must be non-decreasing")
    return Trace.from_sequences(seqs, name=name, timestamps=ts, output_tokens=out)


#: Workload generators by traffic shape, for :func:`generate`.
GENERATORS = {
    "chat": shared_prefix,
    "few_shot": few_shot,
    "multi_turn": multi_turn_branching,
    "agent": agent_loops,
    "long_prefix": long_shared_prefix,
}


#: Each generator's own name for its size (sequences, requests,
#: conversations or sessions), which :func:`generate` takes as ``n``.
SIZE_ARGUMENTS = {
    "chat": "n_sequences",
    "few_shot": "n_requests",
    "multi_turn": "n_conversations",
    "agent": "n_sessions",
    "long_prefix": "n_sequences",
}


def generate(name, n=None, **kwargs):
    """Call the generator registered under ``name`` in :data:`GENERATORS`.

    ``n`` is the workload's size in the generator's own unit (sequences for
    ``chat`` and ``long_prefix``, requests for ``few_shot``, conversations
    for ``multi_turn``, sessions for ``agent``: :data:`SIZE_ARGUMENTS`); the
    generator's own name for it works too, but not both at once. Other
    keyword arguments go to the generator; one it does not take is a
    ``TypeError`` naming it.

    >>> len(generate("chat", n=3, prompt_len=4))
    3
    >>> len(generate("chat", n_sequences=3, prompt_len=4))
    3
    >>> len(generate("multi_turn", n=2, turns=(1, 1), system_len=4, turn_len=(1, 2)))
    2
    >>> generate("multi_turn", n_sessions=150)
    Traceback (most recent call last):
    ...
    TypeError: generate('multi_turn') got an unexpected keyword argument 'n_sessions'; its size is n= (or n_conversations=)
    >>> generate("rag")
    Traceback (most recent call last):
    ...
    ValueError: unknown workload 'rag'; expected one of chat, few_shot, multi_turn, agent, long_prefix
    """
    try:
        gen = GENERATORS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown workload {name!r}; expected one of "
                         f"{', '.join(GENERATORS)}") from None
    size = SIZE_ARGUMENTS[name]
    known = inspect.signature(gen).parameters
    for key in kwargs:
        if key not in known:
            raise TypeError(f"generate({name!r}) got an unexpected keyword argument {key!r}; "
                            f"its size is n= (or {size}=)")
    if n is not None:
        if size in kwargs:
            raise TypeError(f"generate({name!r}) got both n and {size}; give one")
        kwargs[size] = check_int("n", n, minimum=0)
    return gen(**kwargs)
