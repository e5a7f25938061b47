"""When an entry's runs fall: scheduled times computed from the last decided one.

Celery's own scheduler asks ``schedule.is_due(last_run_at)`` with the time a
run was *sent*, so a late beat shifts every later run.  Here the scheduled
times are a pure function of the last *scheduled* time stored for the entry:
every beat that reads the same row computes the same next time, which is what
lets a run be claimed by (entry, scheduled time) once.  ``now`` is always a
parameter, never read from a clock.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from celery.schedules import schedule as interval_schedule

#: Scheduled times enumerated at most for one entry in one pass; a longer gap is
#: crossed in one jump (intervals) or re-anchored at the window's start (others).
MAX_ENUMERATED = 10_000


def next_after(sched: Any, last: datetime, now: datetime) -> datetime:
    """The first scheduled time of ``sched`` after ``last`` (aware UTC), seen at ``now``.

    Intervals (``timedelta`` or a number of seconds) add their period to
    ``last`` exactly.  Crontab, solar and any schedule with a
    ``remaining_estimate`` are asked with their clock frozen at ``now``, in the
    schedule's own time zone, so the answer does not depend on when it is
    asked.  A schedule that only answers ``is_due`` is due at ``now`` (its
    runs then follow the time they were found due, as in Celery).
    """
    if type(sched) is interval_schedule and not sched.relative:
        return last + sched.run_every
    frozen = copy.copy(sched)
    tz = _tz_of(sched)
    local_now = now.astimezone(tz)
    frozen.nowfun = lambda: local_now
    try:
        remaining = frozen.remaining_estimate(last.astimezone(tz))
    except NotImplementedError:
        due, next_seconds = frozen.is_due(last.astimezone(tz))
        remaining = timedelta(0) if due else timedelta(seconds=float(next_seconds))
    found = (local_now + remaining).astimezone(UTC)
    if found <= last:
        # A schedule whose estimate does not move past ``last`` would be due
        # again at once, for ever: count it due one second later instead.
        return last + timedelta(seconds=1)
    return found


@dataclass(frozen=True)
class DueTimes:
    """An entry's scheduled times up to ``now``, seen from its last decided one."""

    #: Due times after the window's start, oldest first (the newest
    #: :data:`MAX_ENUMERATED` at most).
    listed: tuple[datetime, ...]
    #: How many due times were passed over without being listed (at least 1 when a
    #: gap too long to walk was crossed), and the newest of them.
    passed: int
    passed_last: datetime | None
    #: The first scheduled time after ``now``.
    next: datetime


def due_times(sched: Any, last: datetime, now: datetime, since: datetime) -> DueTimes:
    """The scheduled times of ``sched`` after ``last`` up to ``now``; those at or before
    ``since`` (the catch-up window's start) are only counted."""
    listed: deque[datetime] = deque(maxlen=MAX_ENUMERATED)
    passed, passed_last = 0, None
    current = last
    if since > last:
        current, passed = _skip_to(sched, last, since)
        passed_last = current if passed else None
    while True:
        upcoming = next_after(sched, current, now)
        if upcoming > now:
            return DueTimes(tuple(listed), passed, passed_last, upcoming)
        if len(listed) == MAX_ENUMERATED:
            passed, passed_last = passed + 1, listed[0]  # the oldest listed one drops out
        listed.append(upcoming)
        current = upcoming


def _skip_to(sched: Any, last: datetime, since: datetime) -> tuple[datetime, int]:
    """Move from ``last`` to the last scheduled time at or before ``since`` without
    listing the ones in between; returns it and how many were passed."""
    if type(sched) is interval_schedule and not sched.relative:
        period = sched.run_every
        passed = int((since - last) / period)
        return last + passed * period, passed
    current, passed = last, 0
    for _ in range(MAX_ENUMERATED):
        upcoming = next_after(sched, current, since)
        if upcoming > since:
            return current, passed
        current, passed = upcoming, passed + 1
    # Even the gap before the window is too long to walk: start at its edge.
    return since, max(passed, 1)


def _tz_of(sched: Any) -> Any:
    try:
        return sched.tz
    except Exception:  # a schedule with no app: Celery's default zone
        return UTC
