"""Triggers that wait for a moment in time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

from celery_recovery.core.timeutils import as_utc, utcnow
from celery_recovery.triggers.base import (
    BaseTrigger,
    Event,
    TaskSuccessEvent,
    TriggerEvent,
    classpath_of,
)

#: Longest single sleep, so a clock change is noticed within this many seconds.
_MAX_SLEEP = 60.0


class DateTimeTrigger(BaseTrigger):
    """Fire at ``moment`` (an aware datetime, or an ISO 8601 string).

    Yields ``TriggerEvent({"moment": iso})`` to resume on a worker, or with
    ``end_from_trigger=True`` completes the task with ``result`` (no worker).
    """

    def __init__(
        self,
        moment: datetime | str,
        *,
        result: Any = None,
        end_from_trigger: bool = False,
    ) -> None:
        parsed = as_utc(moment)
        if parsed is None or (isinstance(moment, datetime) and moment.tzinfo is None):
            raise ValueError(
                f"DateTimeTrigger moment={moment!r} must be an aware datetime or an ISO 8601 "
                "string with a time zone"
            )
        self.moment = parsed
        self.result = result
        self.end_from_trigger = bool(end_from_trigger)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs: dict[str, Any] = {"moment": self.moment.isoformat()}
        if self.end_from_trigger:
            kwargs.update(end_from_trigger=True, result=self.result)
        return classpath_of(DateTimeTrigger), kwargs

    async def run(self) -> AsyncIterator[Event]:
        while (left := (self.moment - utcnow()).total_seconds()) > 0:
            await asyncio.sleep(min(left, _MAX_SLEEP))
        if self.end_from_trigger:
            yield TaskSuccessEvent(self.result)
        else:
            yield TriggerEvent({"moment": self.moment.isoformat()})


class TimeDeltaTrigger(DateTimeTrigger):
    """Fire ``delta`` (seconds or a timedelta) after the moment the task deferred.

    The due time is fixed when the trigger is made, so a triggerer restart
    or a move to another triggerer does not start the wait again.
    """

    def __init__(
        self,
        delta: float | timedelta,
        *,
        result: Any = None,
        end_from_trigger: bool = False,
    ) -> None:
        if isinstance(delta, bool) or not isinstance(delta, int | float | timedelta):
            raise ValueError(f"TimeDeltaTrigger delta={delta!r} must be seconds or a timedelta")
        if not isinstance(delta, timedelta):
            delta = timedelta(seconds=delta)
        super().__init__(utcnow() + delta, result=result, end_from_trigger=end_from_trigger)
