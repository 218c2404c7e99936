"""The rules of one worker's KV-event stream, without sockets.

A vLLM publisher numbers its batches from 0 on a PUB socket (which may
drop, and after an engine restart counts from 0 again) and keeps its last
batches behind a replay socket, which answers a request "from seq n" with
every batch it still holds from n on and an end marker. ``StreamRules``
judges, for one worker, what each arrival means: it takes

- ``on_start()``: the subscription begins (the worker's pages are cleared
  and its stream asked from 0: ask, don't wait);
- ``on_batch(seq, payload)``: a batch off the PUB socket;
- ``on_replay(seq, payload)``, ``on_replay_end()``,
  ``on_replay_timeout()``: a replay's replies, its end marker, or its
  silence for too long;
- ``on_reconnect()``: the PUB socket reconnected (an engine restarted, or
  the network): the stream is checked by a replay from the last batch
  applied, which must repeat it;
- ``on_quiet()``: no batch for a while: a probe asks the replay from the
  last batch applied, so a dropped tail or an idle restarted engine shows
  (the only replay that leaves an exact worker exact while it runs: a quiet
  worker is probed every few seconds);
- ``on_refused(seq, message)``: the index refused a batch applied;

and returns the ``Action`` list the I/O carries out in order: ``apply``
(seq, payload, decoded), ``clear`` (drop the worker's pages: a new
stream), ``ask`` (a replay from ``seq``), ``drop_replay`` (replies to the
request under way are no longer wanted: a fresh replay socket),
``degrade`` (``data``: why; the pages stay, the worker is not exact until
a clear). ``syncing`` (None, or why not yet confirmed) and ``degraded``
(None, or the first problem since the last clear) say where it stands;
``stats`` counts.

The judgements: a seq below the highest seen on the PUB socket, or equal
with another payload, is a restart (cleared, asked from 0); equal with the
same payload, a duplicate (skipped). A seq past the next one expected is a
gap: the batches held meanwhile, the replay is asked from the last batch
applied, which it must repeat with the payload applied (another payload, or
nothing from there on while it answers: the engine restarted; the batches
after it but not it: a restart cannot be ruled out, degraded). A payload that
cannot be decoded is asked again of the replay socket; only what no replay
gives degrades (a batch gone from the publisher's buffer, or unreadable
there too). A replay that never answers leaves the worker ``syncing``,
unless batches held had to be applied unverified (degraded).

>>> r = StreamRules("w")
>>> [a.kind for a in r.on_start()], r.syncing is not None
(['clear', 'ask'], True)
>>> r.on_batch(1, b"b1")          # 0 not seen yet: held while the replay runs
[]
>>> r.on_replay(0, b"b0")
[Action(kind='apply', seq=0, data=b'b0', decoded=b'b0')]
>>> [a.seq for a in r.on_replay(1, b"b1")], [a.kind for a in r.on_replay_end()]
([1], [])
>>> r.syncing, r.last
(None, 1)
"""

from typing import Callable, NamedTuple, Optional

__all__ = ["StreamRules", "Action", "STATS"]

STATS = ("gaps", "replayed", "replay_timeouts", "restarts", "duplicates", "errors",
         "reconnects", "probes", "unreadable")


class Action(NamedTuple):
    """What the I/O does next: ``kind`` is ``apply`` (``seq``, ``data`` the
    payload, ``decoded`` what ``decode`` made of it), ``clear``, ``ask``
    (from ``seq``), ``drop_replay`` or ``degrade`` (``data``: why)."""
    kind: str
    seq: Optional[int] = None
    data: object = None
    decoded: object = None


class _Ask:
    """A replay request under way."""
    __slots__ = ("start", "verify", "purpose", "reached", "unverified", "applied", "retry")

    def __init__(self, start, verify, purpose):
        self.start, self.verify, self.purpose = start, verify, purpose
        self.reached = False     # a reply at or past ``verify`` arrived
        self.unverified = False  # the first such reply was past it
        self.applied = False     # a batch was applied while it ran
        self.retry = None        # the hole it asks again for (once: no loop)


class _Unreadable:
    __slots__ = ("why",)

    def __init__(self, why):
        self.why = why


def _identity(payload):
    return payload


class StreamRules:
    """One worker's stream rules (the module says which); ``worker`` names it
    in messages, ``has_replay`` says whether it has a replay socket,
    ``decode(payload)`` turns a payload into what ``apply`` carries and
    raises ``ValueError`` (``EventError`` is one) for one that cannot be
    read (by default payloads pass as they are).

    >>> r = StreamRules("w", has_replay=False)
    >>> _ = r.on_start(); [a.kind for a in r.on_batch(0, b"x")], r.syncing
    (['apply'], None)
    >>> [a.kind for a in r.on_batch(2, b"z")], r.degraded
    (['degrade', 'apply'], "worker 'w' seq 2: batches 1..1 never arrived")
    """

    def __init__(self, worker="w", *, has_replay=True,
                 decode: Optional[Callable] = None):
        self.worker = worker
        self.has_replay = bool(has_replay)
        self.decode = _identity if decode is None else decode
        self.last = None          # the last seq handled (applied, or lost for good)
        self.last_payload = None  # its payload: a replay of it is compared
        self.high = None          # the highest seq read on the PUB socket
        self.high_payload = None  # and its payload: the same seq with another is a restart
        self.pending: dict = {}   # seq -> (payload, decoded or _Unreadable): held
        self.asking = None        # the replay under way (_Ask) or None
        self.need_verify = False  # a reconnect not yet checked by a replay
        self.syncing = "not started"
        self.degraded = None
        self.stats = dict.fromkeys(STATS, 0)
        self.last_error = None
        self._out: list = []

    # ------------------------------------------------------------ helpers
    @property
    def replaying(self):
        """Whether a replay request is under way."""
        return self.asking is not None

    @property
    def status(self):
        """``"degraded"``, ``"syncing"`` or ``"exact"``."""
        if self.degraded is not None:
            return "degraded"
        return "exact" if self.syncing is None else "syncing"

    def _where(self, seq):
        return f"worker {self.worker!r}" + ("" if seq is None else f" seq {seq}")

    def _error(self, seq, msg):
        self.stats["errors"] += 1
        self.last_error = f"{self._where(seq)}: {msg}"

    def _degrade(self, msg):
        if self.degraded is None:
            self.degraded = msg
        self._out.append(Action("degrade", data=msg))

    def _decode(self, payload):
        try:
            return self.decode(payload)
        except ValueError as exc:
            return _Unreadable(str(exc))

    def _ask(self, start, verify, purpose):
        if self.asking is not None:
            self._out.append(Action("drop_replay"))
        self.asking = _Ask(start, verify, purpose)
        self._out.append(Action("ask", start))

    def _ask_from_last(self, purpose):
        """From the last batch applied, which the replay must repeat (from 0
        at a stream's start)."""
        self._ask(0 if self.last is None else self.last, self.last, purpose)

    def _clear(self):
        """A new stream: the worker's pages go, and what was known of the old."""
        self._out.append(Action("clear"))
        self.last = self.last_payload = None
        self.high = self.high_payload = None
        self.degraded = None
        self.need_verify = False

    def _restart(self, keep_pending):
        self.stats["restarts"] += 1
        if self.asking is not None:
            self._out.append(Action("drop_replay"))
            self.asking = None
        if not keep_pending:
            self.pending = {}
        self._clear()
        if self.has_replay:
            self._ask(0, None, "restart")
            self.syncing = "its engine restarted: its new stream is asked from 0"

    def _take(self, seq, payload, decoded):
        """Handle ``seq`` as the next batch: a gap before it degrades, an
        unreadable payload is lost (degrades) and skipped."""
        expected = 0 if self.last is None else self.last + 1
        if seq > expected:
            self._degrade(f"{self._where(seq)}: batches {expected}..{seq - 1} never arrived")
        self.last, self.last_payload = seq, payload
        if self.asking is not None:
            self.asking.applied = True
        if isinstance(decoded, _Unreadable):
            self._degrade(f"{self._where(seq)}: a batch was lost: its payload cannot be read "
                          f"and no replay gave a readable one: {decoded.why}")
            return
        self._out.append(Action("apply", seq, payload, decoded))

    def _drain_below(self, seq):
        """Apply the batches held below ``seq``, in order."""
        for s in sorted(s for s in self.pending if s < seq):
            payload, decoded = self.pending.pop(s)
            if self.last is None or s > self.last:
                self._take(s, payload, decoded)

    def _done(self):
        out, self._out = self._out, []
        return out

    # ------------------------------------------------------------ arrivals
    def on_start(self, resume=None):
        """The subscription begins: a new stream, asked from 0; or, with
        ``resume`` = ``(last seq applied, its payload)`` (a checkpoint's
        position, the worker's pages kept), the stream asked from that seq,
        which the replay must repeat (``"degraded"`` if the publisher's
        buffer no longer holds it; a restart if it holds another)."""
        self._out = []
        if self.asking is not None:
            self._out.append(Action("drop_replay"))
            self.asking = None
        self.pending = {}
        if resume is not None and self.has_replay:
            self.last, self.last_payload = resume
            self.high = self.high_payload = None
            self.need_verify = True
            self._ask(self.last, self.last, "resume")
            self.syncing = (f"resuming from seq {self.last}: asked of its replay socket, "
                            "no answer yet")
            return self._done()
        self._clear()
        if self.has_replay:
            self._ask(0, None, "start")
            self.syncing = "its stream was asked of its replay socket from 0, no answer yet"
        else:
            self.syncing = "no batch yet"
        return self._done()

    def on_batch(self, seq, payload):
        """A batch off the PUB socket."""
        self._out: list = []
        decoded = self._decode(payload)
        if isinstance(decoded, _Unreadable):
            self.stats["unreadable"] += 1
            self._error(seq, decoded.why)
            if self.last is not None and seq <= self.last:
                return self._done()
            # neither a restart nor a duplicate can be told from it: held as a
            # hole, to be asked again of the replay socket
            if seq not in self.pending:
                self.pending[seq] = (payload, decoded)
            if self.asking is None:
                if self.has_replay:
                    self._ask_from_last("repair")
                    self.syncing = f"seq {seq} could not be read: it is asked again"
                else:
                    self._drain_below(seq)
                    self._take(*((seq,) + self.pending.pop(seq)))
            return self._done()
        if self.high is not None and (seq < self.high or seq == self.high
                                      and payload != self.high_payload):
            self._restart(keep_pending=False)
        elif seq == self.high:
            self.stats["duplicates"] += 1
            return self._done()
        self.high, self.high_payload = seq, payload
        if self.last is not None and seq <= self.last:
            return self._done()  # a replay gave it already
        old = self.pending.get(seq)
        if self.asking is not None:
            if old is None or isinstance(old[1], _Unreadable):
                self.pending[seq] = (payload, decoded)
            return self._done()
        expected = 0 if self.last is None else self.last + 1
        if seq == expected and not self.need_verify and not self.pending:
            self._take(seq, payload, decoded)
            self.syncing = None  # in order on the same connection: confirmed
            return self._done()
        if seq != expected:
            self.stats["gaps"] += 1
        self.pending[seq] = (payload, decoded)
        if self.has_replay:
            self._ask_from_last("gap")
            self.syncing = f"batches from {expected} on are being replayed"
            return self._done()
        self._drain_below(seq + 1)
        self.syncing = None
        return self._done()

    def on_reconnect(self):
        """The PUB socket made a new connection after its first: checked by
        a replay from the last batch applied (or, with no replay socket,
        a restart cannot be ruled out)."""
        self._out: list = []
        self.stats["reconnects"] += 1
        if not self.has_replay:
            if self.last is not None:
                msg = (f"{self._where(self.last)}: the event socket reconnected and there is no "
                       "replay socket to check the stream with: a restart cannot be ruled out")
                self.last_error = msg
                self._degrade(msg)
            return self._done()
        self.need_verify = self.last is not None
        self._ask_from_last("reconnect")
        self.syncing = "its event socket reconnected: the stream is being checked by a replay"
        return self._done()

    def on_quiet(self):
        """No batch for a while: probe the replay from the last batch applied
        (nothing while a replay runs, or without a replay socket)."""
        self._out: list = []
        if self.has_replay and self.asking is None:
            self.stats["probes"] += 1
            self._ask_from_last("probe")
        return self._done()

    def on_replay(self, seq, payload):
        """A reply of the replay socket (ignored when none was asked)."""
        self._out: list = []
        a = self.asking
        if a is None:
            return self._done()
        if a.verify is not None and not a.reached and seq >= a.verify:
            a.reached = True
            if seq == a.verify and payload != self.last_payload:
                self._restart(keep_pending=True)  # another batch under that seq
                return self._done()
            if seq > a.verify:
                a.unverified = True  # judged when the replay ends
                if a.purpose == "resume":  # said before the gap it leaves
                    self.last_error = (f"{self._where(a.verify)}: the engine's replay buffer "
                                       f"no longer holds seq {a.verify}, the last batch the "
                                       "checkpoint applied")
                    self._degrade(self.last_error)
        decoded = self._decode(payload)
        held = self.pending.pop(seq, None)
        if isinstance(decoded, _Unreadable):
            self.stats["unreadable"] += 1
            self._error(seq, "replayed: " + decoded.why)
            if held is not None and not isinstance(held[1], _Unreadable):
                payload, decoded = held
        if self.last is not None and seq <= self.last:
            return self._done()
        self._drain_below(seq)
        self.stats["replayed"] += 1
        self._take(seq, payload, decoded)
        return self._done()

    def on_replay_end(self):
        """The replay's end marker."""
        self._out: list = []
        if self.asking is not None:
            self._finish(True)
        return self._done()

    def on_replay_timeout(self):
        """The replay stayed silent too long: given up (its socket dropped)."""
        self._out: list = []
        if self.asking is not None:
            self.stats["replay_timeouts"] += 1
            self._out.append(Action("drop_replay"))
            self._finish(False)
        return self._done()

    def on_refused(self, seq, message):
        """The index refused batch ``seq`` (another page size, ...): lost."""
        self._out: list = []
        self._error(seq, message)
        self._degrade(f"{self._where(seq)}: a batch was lost: {message}")
        return self._done()

    def _finish(self, answered):
        a, self.asking = self.asking, None
        if answered and a.verify is not None and not a.reached:
            # the publisher holds nothing from the batch applied on: a new
            # stream shorter than the one applied (an engine restarted)
            self._restart(keep_pending=True)
            return
        held = sorted(self.pending.items())
        self.pending = {}
        for i, (seq, (payload, decoded)) in enumerate(held):
            if self.last is not None and seq <= self.last:
                continue
            expected = 0 if self.last is None else self.last + 1
            hole = seq > expected or isinstance(decoded, _Unreadable)
            if hole and answered and (expected > a.start or a.retry != expected):
                # the replay moved the stream on, or answered before the hole
                # was published: ask again from the hole, once
                self.pending = dict(held[i:])
                self._ask(expected, None, a.purpose)
                again = self.asking
                again.retry = expected
                again.verify, again.reached = a.verify, a.reached
                again.unverified, again.applied = a.unverified, a.applied
                return
            self._take(seq, payload, decoded)
            a.applied = True
        if a.verify is not None and (a.unverified or not a.reached and a.applied):
            if a.purpose != "resume" or not a.unverified:  # (a resume's is said already)
                self.last_error = (f"{self._where(a.verify)}: the replay did not repeat the "
                                   "last batch applied, so an engine restart cannot be ruled "
                                   "out")
                self._degrade(self.last_error)
        if answered or a.applied:
            self.need_verify = False
            self.syncing = None
        else:
            self.syncing = "its replay socket did not answer"
