"""Triggers: what a deferred task waits for, run by the triggerer's asyncio loop."""

from .base import BaseTrigger, TaskFailedEvent, TaskSuccessEvent, TriggerEvent
from .results import TaskResultTrigger
from .temporal import DateTimeTrigger, TimeDeltaTrigger

__all__ = [
    "BaseTrigger",
    "DateTimeTrigger",
    "TaskFailedEvent",
    "TaskResultTrigger",
    "TaskSuccessEvent",
    "TimeDeltaTrigger",
    "TriggerEvent",
]
