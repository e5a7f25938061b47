"""Triggers: what a deferred task waits for, run by the triggerer's asyncio loop."""

from celery_recovery.triggers.base import (
    BaseTrigger,
    TaskFailedEvent,
    TaskSuccessEvent,
    TriggerEvent,
)
from celery_recovery.triggers.results import TaskResultTrigger
from celery_recovery.triggers.temporal import DateTimeTrigger, TimeDeltaTrigger

__all__ = [
    "BaseTrigger",
    "DateTimeTrigger",
    "TaskFailedEvent",
    "TaskResultTrigger",
    "TaskSuccessEvent",
    "TimeDeltaTrigger",
    "TriggerEvent",
]
