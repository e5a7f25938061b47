"""Which advisory-lock markers vanished for good: the judgement of the marker watch.

A lock leaves ``pg_locks`` when its holder dies, and also, for a moment, when
a live holder loses its connection (a terminated session, a server restart or
failover, a pooler) and takes the lock again on a new one.  Three rules tell
the two apart without waiting for a late heartbeat:

- Only a key seen held counts: a job whose holder never took its lock (or
  took it while the watch was not looking) is left to the heartbeat.
- A key must stay missing for :attr:`LockAbsences.confirm` seconds over at
  least two looks: a live holder reconnects at once and retries a lock still
  held by its old session every fraction of a second, so it is back well
  within that.
- Every look is on one server: a look that failed, or a server that started
  again (a restart, a failover to another server), forgets everything seen,
  so a restart's mass disappearance is never a death.  Holders that never
  come back after it are found by the heartbeat, as without the watch.

Pure: the watch feeds it what it read and when (monotonic seconds).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class Vanished:
    """A lock seen held, then missing since ``missing_since`` (the store's clock)."""

    key: int
    missing_since: datetime


@dataclass
class LockAbsences:
    """What one watcher has seen of the held lock keys, look after look."""

    confirm: float
    #: The server of the previous look (its start time); None before the first.
    server: object | None = None
    held: set[int] = field(default_factory=set)
    #: Key -> (monotonic time, store time) of the first look that found it missing.
    missing: dict[int, tuple[float, datetime]] = field(default_factory=dict)

    def forget(self) -> None:
        """A look failed: nothing seen so far can be compared with the next one."""
        self.server = None
        self.held.clear()
        self.missing.clear()

    def look(
        self, server: object, held: Iterable[int], at: float, store_now: datetime
    ) -> list[Vanished]:
        """Record one look at the held keys; the keys confirmed gone by it (each once)."""
        now_held = set(held)
        if server != self.server:
            self.forget()
            self.server = server
            self.held = now_held
            return []
        gone: list[Vanished] = []
        for key in self.held - now_held:
            first = self.missing.get(key)
            if first is None:
                self.missing[key] = (at, store_now)
            elif at - first[0] >= self.confirm:
                gone.append(Vanished(key, first[1]))
                del self.missing[key]
        for key in list(self.missing):
            if key in now_held:
                del self.missing[key]  # taken again: a live holder that reconnected
        # A confirmed key is no longer watched; a missing one is kept until judged.
        self.held = now_held | set(self.missing)
        return gone
