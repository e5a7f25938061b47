"""Time helpers: every timestamp the package stores is timezone-aware UTC."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

#: The store's clock as this process last read it: (its time, this process's
#: monotonic clock at the middle of the read).  None: this host's clock is used.
_store_clock: tuple[datetime, float] | None = None


def utcnow() -> datetime:
    """The current time as an aware UTC datetime: the store's clock once this process
    has read it (:func:`follow_store_clock`), run on by the monotonic clock, so that
    times written by processes on different hosts compare as one clock's; this host's
    clock until then."""
    synced = _store_clock
    if synced is None:
        return datetime.now(UTC)
    return synced[0] + timedelta(seconds=time.monotonic() - synced[1])


def follow_store_clock(store_now: datetime, asked: float, answered: float) -> None:
    """Take the store's clock, read as ``store_now`` between the monotonic instants
    ``asked`` and ``answered``, as this process's (kept across forks)."""
    global _store_clock
    _store_clock = (store_now.astimezone(UTC), (asked + answered) / 2)


def store_clock_offset() -> float | None:
    """Seconds the store's clock is ahead of this host's (None until read)."""
    synced = _store_clock
    if synced is None:
        return None
    return (utcnow() - datetime.now(UTC)).total_seconds()


def from_timestamp(value: float) -> datetime:
    """A POSIX timestamp (as a message header carries it) as an aware UTC datetime."""
    return datetime.fromtimestamp(value, UTC)


def as_utc(value: datetime | str | None) -> datetime | None:
    """Parse an ISO string or normalise a datetime to aware UTC; ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def seconds(value: float | timedelta) -> float:
    """Seconds from a number of seconds or a ``timedelta``."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(value)
