"""The stream rules of radix_soa.integrations.stream_rules, without sockets:
a simulated engine (publisher numbering its batches, a replay buffer,
restarts) and network (PUB messages dropped, sent twice, garbled, replies
interleaved with them, replays unanswered) driven by hypothesis, against
the engine's own stream as the reference: a worker called exact holds a
prefix of one engine stream with no hole, and once everything is delivered
and a probe answered it holds exactly the running engine's stream, exact
unless a batch left the replay buffer or a replay went unanswered."""

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix_soa.integrations.stream_rules import Action, StreamRules

JUNK = b"\xc1junk"


def decode(payload):
    if payload == JUNK:
        raise ValueError("the payload is not msgpack")
    return payload


class World:
    """One engine, its publisher and the wire to one ``StreamRules``."""

    def __init__(self, buffer, has_replay=True):
        self.rules = StreamRules("w", has_replay=has_replay, decode=decode)
        self.epoch, self.n = 0, 0
        self.history = {0: []}          # epoch -> every payload it published
        self.buffer = deque(maxlen=buffer)
        self.overflowed = False         # a batch of the running epoch left the buffer unseen
        self.pub = deque()              # in flight on the PUB socket: (seq, payload) or "reconnect"
        self.request = None             # a replay request not yet served: its start
        self.replies = deque()          # served, in flight
        self.applied = []               # what the index holds: payloads since the last clear
        self.timeouts = 0
        self.run(self.rules.on_start())

    def run(self, actions):
        for a in actions:
            assert isinstance(a, Action)
            if a.kind == "apply":
                assert a.decoded == a.data != JUNK
                self.applied.append(a.data)
            elif a.kind == "clear":
                self.applied = []
            elif a.kind == "ask":
                assert self.rules.has_replay
                self.request, self.replies = a.seq, deque()
            elif a.kind == "drop_replay":
                self.request, self.replies = None, deque()
            else:
                assert a.kind == "degrade" and isinstance(a.data, str)

    # -------------------------------------------------------------- the engine
    def publish(self, fate):
        seq, payload = self.n, f"{self.epoch}:{self.n}".encode()
        self.n += 1
        self.history[self.epoch].append(payload)
        if len(self.buffer) == self.buffer.maxlen:
            self.overflowed = True
        self.buffer.append((seq, payload))
        if fate == "send":
            self.pub.append((seq, payload))
        elif fate == "twice":
            self.pub.extend([(seq, payload)] * 2)
        elif fate == "junk":
            self.pub.append((seq, JUNK))

    def restart(self):
        self.epoch += 1
        self.n = 0
        self.history[self.epoch] = []
        self.buffer.clear()
        self.overflowed = False
        self.pub.append("reconnect")

    # -------------------------------------------------------------- the wire
    def deliver_pub(self):
        if self.pub:
            m = self.pub.popleft()
            self.run(self.rules.on_reconnect() if m == "reconnect" else self.rules.on_batch(*m))

    def serve(self):
        if self.request is not None:
            self.replies = deque([(s, p) for s, p in self.buffer if s >= self.request] + ["end"])
            self.request = None

    def deliver_reply(self):
        if self.replies:
            m = self.replies.popleft()
            self.run(self.rules.on_replay_end() if m == "end" else self.rules.on_replay(*m))

    def timeout(self):
        if self.rules.replaying:
            self.timeouts += 1
            self.run(self.rules.on_replay_timeout())

    def quiet(self):
        self.run(self.rules.on_quiet())

    def settle(self):
        """Deliver everything, then probe until the probe's answer is in."""
        for _ in range(100):
            while self.pub:
                self.deliver_pub()
            if not self.rules.replaying:
                return
            self.serve()
            while self.replies:
                self.deliver_reply()
        raise AssertionError("replays never end")

    # -------------------------------------------------------------- the checks
    def check_sound(self):
        """Exact (or syncing, not degraded): a prefix of one stream, no hole."""
        r = self.rules
        if r.degraded is None:
            assert len(self.applied) == (0 if r.last is None else r.last + 1)
            if self.applied:
                epoch = int(self.applied[0].split(b":")[0])
                assert self.applied == self.history[epoch][:len(self.applied)]


OPS = ["send"] * 6 + ["drop", "twice", "junk", "restart", "pub", "pub", "pub", "serve",
                      "reply", "reply", "reply", "timeout", "quiet"]


@settings(max_examples=400, deadline=None)
@given(ops=st.lists(st.sampled_from(OPS), max_size=80), buffer=st.sampled_from([3, 10, 1000]),
       has_replay=st.booleans())
def test_random_fates_against_the_engines_stream(ops, buffer, has_replay):
    w = World(buffer, has_replay)
    for op in ops:
        if op in ("send", "drop", "twice", "junk"):
            w.publish(op)
        elif op == "restart":
            w.restart()
        elif op == "pub":
            w.deliver_pub()
        elif op == "serve":
            w.serve()
        elif op == "reply":
            w.deliver_reply()
        elif op == "timeout":
            w.timeout()
        else:
            w.quiet()
        w.check_sound()
    w.settle()
    w.run(w.rules.on_quiet())
    w.settle()
    w.check_sound()
    r = w.rules
    lossless = not w.overflowed and w.timeouts == 0
    if not has_replay:
        lost = any(op in ("drop", "junk", "restart") for op in ops)
        if not lost and w.history[w.epoch]:  # with nothing seen, syncing
            assert r.status == "exact" and w.applied == w.history[w.epoch]
        return
    if r.status == "exact":
        assert w.applied == w.history[w.epoch]  # never wrong when called exact
    if lossless:
        assert r.status == "exact", (r.degraded, r.syncing)
        assert w.applied == w.history[w.epoch]
    assert not r.replaying and r.pending == {}


def test_a_dropped_tail_is_found_by_a_probe():
    w = World(100)
    w.publish("send"); w.publish("send"); w.settle()
    w.publish("drop")                       # the last batch, lost; the engine then idle
    w.settle()
    assert w.rules.status == "exact" and len(w.applied) == 2  # stale: nothing says otherwise
    w.quiet(); w.settle()
    assert w.applied == w.history[0] and w.rules.stats["probes"] == 1


def test_an_idle_engine_restart_is_found_by_its_reconnect():
    w = World(100)
    for _ in range(3):
        w.publish("send")
    w.settle()
    assert w.applied == w.history[0] and w.rules.status == "exact"
    w.restart()                             # back, and publishing nothing
    w.deliver_pub()
    assert w.rules.status == "syncing"
    w.settle()
    assert w.applied == [] and w.rules.status == "exact" and w.rules.stats["restarts"] == 1


def test_junk_under_the_next_seq_is_asked_again_not_a_restart():
    w = World(100)
    w.publish("send"); w.settle()
    w.publish("junk"); w.publish("send")
    w.settle()
    r = w.rules
    assert w.applied == w.history[0] and r.status == "exact"
    assert r.stats["restarts"] == 0 and r.stats["unreadable"] == 1 and r.stats["errors"] == 1


def test_junk_that_no_replay_repairs_degrades():
    w = World(100)
    w.publish("send"); w.settle()
    w.pub.append((1, JUNK)); w.n = 2      # seq 1 never in the buffer
    w.publish("send")
    w.settle()
    assert w.rules.status == "degraded" and "seq 1" in w.rules.degraded


def test_an_unanswered_start_stays_syncing_and_a_probe_recovers():
    w = World(100)
    w.timeout()
    assert w.rules.status == "syncing" and "did not answer" in w.rules.syncing
    w.quiet(); w.settle()
    assert w.rules.status == "exact"


def test_a_gap_past_the_buffer_degrades_with_the_seqs():
    w = World(2)
    w.publish("send"); w.settle()
    for _ in range(4):
        w.publish("drop")
    w.publish("send"); w.settle()
    assert w.rules.status == "degraded" and "never arrived" in w.rules.degraded


@pytest.mark.parametrize("has_replay", [True, False])
def test_a_refused_batch_degrades(has_replay):
    r = StreamRules("w", has_replay=has_replay)
    r.on_start()
    assert [a.kind for a in r.on_refused(3, "block_size 2")] == ["degrade"]
    assert r.status == "degraded" and "block_size 2" in r.last_error and r.stats["errors"] == 1


def test_a_restart_whose_new_count_passed_the_old_one_is_seen_by_the_payload():
    w = World(100)
    for _ in range(3):
        w.publish("send")
    w.settle()
    w.restart()
    for _ in range(5):
        w.publish("drop")                   # seqs 0..4 of the new stream, unseen
    w.publish("send")
    w.settle()
    r = w.rules
    assert r.stats["restarts"] == 1 and r.status == "exact" and w.applied == w.history[1]


def resumed(w, last, epoch=None):
    """A new ``StreamRules`` for ``w``'s engine, resuming from a checkpoint
    that applied the stream of ``epoch`` (the running one by default) up to
    ``last`` (the pages kept)."""
    stream = w.history[w.epoch if epoch is None else epoch]
    w.rules = StreamRules("w", decode=decode)
    w.request, w.replies = None, deque()
    w.applied = stream[:last + 1]
    w.run(w.rules.on_start(resume=(last, stream[last])))


def test_a_resume_within_the_buffer_is_exact_without_a_replay_from_0():
    w = World(100)
    for _ in range(5):
        w.publish("send")
    w.settle()
    resumed(w, 2)                       # a checkpoint at seq 2; the engine went on to 4
    assert w.rules.status == "syncing" and w.request == 2
    w.publish("send")
    w.settle()
    assert w.rules.status == "exact" and w.applied == w.history[0]
    assert w.rules.stats["replayed"] == 3 and w.rules.stats["restarts"] == 0  # 3, 4, 5


def test_a_resume_past_the_buffer_degrades_saying_so():
    w = World(3)
    for _ in range(8):
        w.publish("send")
    w.settle()
    resumed(w, 2)                       # the buffer holds 5..7 now
    w.settle()
    assert w.rules.status == "degraded" and "no longer holds seq 2" in w.rules.degraded


def test_a_resume_after_the_engine_restarted_clears_it():
    w = World(100)
    for _ in range(5):
        w.publish("send")
    w.settle()
    w.restart()
    w.pub.clear()
    w.publish("send")
    resumed(w, 4, epoch=0)              # the checkpoint is of the old engine
    w.settle()
    assert w.rules.status == "exact" and w.applied == w.history[1]
    assert w.rules.stats["restarts"] == 1
