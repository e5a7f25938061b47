"""Is a worker's consumer stalled?  The judgement, apart from how its facts are gathered.

A worker that stops consuming (a half-open broker connection, a reconnect
that never completes) keeps its process, its pool and its heartbeats; only
its consumer says it is stuck.  Its main process samples the consumer's
facts every heartbeat interval and asks the broker how many messages wait in
its queues, but only when it has free slots and has received nothing for a
while, so a busy worker never pays for it.  :class:`StallJudge` turns those
facts into a verdict; everything here is pure and takes ``now`` (monotonic
seconds) as an argument.

A worker is stalled when, for ``timeout`` seconds:

- its consumer's broker connection has been down, or the broker has not
  answered it (no message received and every probe failed); or
- it had free slots, received nothing, and two probes at least a probe
  interval apart found ready messages in its queues, no fewer the second
  time (a healthy consumer takes a ready message within milliseconds; a queue
  that shrinks is being consumed by someone).

An idle worker whose queues are empty is never stalled, however long it idles.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Shortest wait between two probes of the broker, and before the first one.
MIN_PROBE_INTERVAL = 1.0
#: Longest a probe may wait for the broker's answer.
MAX_PROBE_TIMEOUT = 5.0


def probe_interval(timeout: float) -> float:
    """Seconds between two probes of an idle worker's queues: four per ``timeout``."""
    return max(MIN_PROBE_INTERVAL, timeout / 4)


def probe_timeout(timeout: float) -> float:
    """Seconds a probe waits for the broker before it counts as unanswered."""
    return max(1.0, min(MAX_PROBE_TIMEOUT, timeout / 4))


@dataclass(frozen=True)
class ConsumerFacts:
    """What the worker's main process sees of its consumer at one moment (monotonic times)."""

    connected: bool
    #: Since when the connection has been up (or down).
    connection_since: float
    #: When it last received a message (its consumer's start before the first one).
    last_received: float
    #: Messages it holds (received, not finished) and runs.
    reserved: int
    active: int
    #: Pool slots with no message held for them.
    free_slots: int


@dataclass(frozen=True)
class QueueProbe:
    """The answer of one probe of the broker: messages ready in the worker's queues."""

    at: float
    ready: int | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class StallJudge:
    """Remembers the probes of one consumer and judges it at every heartbeat."""

    def __init__(self, timeout: float, started: float) -> None:
        self.timeout = timeout
        self.interval = probe_interval(timeout)
        self.probe_timeout = probe_timeout(timeout)
        self.last_probe: QueueProbe | None = None
        #: When the broker last answered a probe (the consumer's start before that).
        self.last_answer = started
        #: A probe in flight since then (None when none is).
        self.probing_since: float | None = None
        #: First of a run of probes that found ready messages, never fewer, and
        #: nothing received since; with its count.
        self.waiting: QueueProbe | None = None

    def probe_due(self, now: float, facts: ConsumerFacts) -> bool:
        """Ask the broker only for a worker with free slots that received nothing for an
        interval, and at most once an interval: a busy worker never asks."""
        if facts.free_slots <= 0 or self.probing_since is not None:
            return False
        if now - facts.last_received < self.interval:
            return False
        return self.last_probe is None or now - self.last_probe.at >= self.interval

    def probe_started(self, now: float) -> None:
        self.probing_since = now

    def probed(self, probe: QueueProbe, last_received: float) -> None:
        """Take the answer (or failure) of a probe that ended at ``probe.at``."""
        self.probing_since = None
        self.last_probe = probe
        if not probe.ok:
            return
        self.last_answer = probe.at
        ready = probe.ready or 0
        waiting = self.waiting
        if ready <= 0 or (waiting is not None and ready < (waiting.ready or 0)):
            self.waiting = None  # empty, or being consumed
        elif waiting is None or last_received >= waiting.at:
            self.waiting = probe
        # else: still waiting since the first probe that saw them

    def verdict(self, now: float, facts: ConsumerFacts) -> str | None:
        """Why the consumer is stalled, or None."""
        timeout = self.timeout
        if not facts.connected and now - facts.connection_since >= timeout:
            return f"broker connection down for {now - facts.connection_since:.0f}s"
        silent = now - max(facts.last_received, self.last_answer)
        if silent >= timeout and facts.free_slots > 0 and self._unanswered(now):
            error = self.last_probe.error if self.last_probe and self.last_probe.error else None
            cause = f" ({error})" if error else ""
            return f"broker not answering for {silent:.0f}s{cause}"
        waiting = self.waiting
        if waiting is None or facts.free_slots <= 0 or facts.last_received >= waiting.at:
            return None
        last = self.last_probe
        quiet = now - facts.last_received
        if (
            quiet >= timeout
            and last is not None
            and last.ok
            and last.at - waiting.at >= self.interval
        ):
            return (
                f"{last.ready} ready messages in its queues, {facts.free_slots} free slots, "
                f"nothing received for {quiet:.0f}s"
            )
        return None

    def _unanswered(self, now: float) -> bool:
        """A probe has been waiting longer than a probe may, or the last one failed
        lately (an old failure, from before the worker got busy, proves nothing now)."""
        if self.probing_since is not None and now - self.probing_since >= self.probe_timeout:
            return True
        last = self.last_probe
        lately = 2 * self.interval + self.probe_timeout
        return last is not None and not last.ok and now - last.at <= lately


def stalled_reason(consumer: dict | None) -> str | None:
    """The reason a worker recorded for being stalled (its ``jobs.consumer``), or None."""
    if not consumer or not consumer.get("stalled"):
        return None
    return str(consumer.get("stalled_reason") or "stalled")
