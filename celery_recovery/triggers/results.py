"""A trigger that waits for another Celery task's result without holding a worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from celery import states

from celery_recovery.core.durations import positive_seconds
from celery_recovery.triggers.base import (
    BaseTrigger,
    Event,
    TaskFailedEvent,
    TaskSuccessEvent,
    TriggerEvent,
    classpath_of,
)


class TaskResultTrigger(BaseTrigger):
    """Fire when the task ``task_id`` is ready in the result backend.

    Polls the backend every ``poll`` seconds in a thread (backends are
    blocking).  Yields ``TriggerEvent({"task_id", "state", "result"})``, where
    ``result`` is the return value or the error's text; with
    ``end_from_trigger=True`` the deferred task instead succeeds with the
    other task's result, or fails when it failed.
    """

    def __init__(self, task_id: str, poll: float = 1.0, end_from_trigger: bool = False) -> None:
        if not isinstance(task_id, str) or not task_id:
            raise ValueError(f"TaskResultTrigger task_id={task_id!r} must be a task id string")
        self.poll = positive_seconds("TaskResultTrigger poll", poll, ValueError)
        self.task_id = task_id
        self.end_from_trigger = bool(end_from_trigger)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(TaskResultTrigger), {
            "task_id": self.task_id,
            "poll": self.poll,
            "end_from_trigger": self.end_from_trigger,
        }

    async def run(self) -> AsyncIterator[Event]:
        if self.app is None:
            from celery import current_app

            self.app = current_app
        result = self.app.AsyncResult(self.task_id)
        while True:
            meta = await asyncio.to_thread(result.backend.get_task_meta, self.task_id)
            state = meta.get("status")
            if state in states.READY_STATES:
                break
            await asyncio.sleep(self.poll)
        value = meta.get("result")
        if isinstance(value, BaseException):
            value = f"{type(value).__name__}: {value}"
        if not self.end_from_trigger:
            yield TriggerEvent({"task_id": self.task_id, "state": state, "result": value})
        elif state == states.SUCCESS:
            yield TaskSuccessEvent(value)
        else:
            yield TaskFailedEvent(f"task {self.task_id} ended {state}: {value}")
