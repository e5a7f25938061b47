"""Schedules that survive beat: ``celery -A proj beat -S celery_recovery.beat:Scheduler``.

See :mod:`celery_recovery.beat.scheduler` and docs/beat.md.
"""

from celery_recovery.beat.policy import OPTION, CatchUp, EntryPolicy
from celery_recovery.beat.publish import run_task_id
from celery_recovery.beat.scheduler import Scheduler

__all__ = ["OPTION", "CatchUp", "EntryPolicy", "Scheduler", "run_task_id"]
