"""Time helpers: every timestamp the package stores is timezone-aware UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def utcnow() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(UTC)


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
