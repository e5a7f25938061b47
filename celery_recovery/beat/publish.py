"""Sending one scheduled run: its task id derived from (entry, scheduled time)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from celery.beat import BeatLazyFunc

from celery_recovery.beat.policy import OPTION
from celery_recovery.messages.headers import SCHEDULED_AT_HEADER

#: Namespace of scheduled runs' task ids (uuid5): the same entry and scheduled time
#: give the same id in every beat.
RUN_NAMESPACE = uuid.UUID("4f0c3a52-2b1e-5d8e-9a57-c3b1f0d2e6a1")


def run_task_id(entry_name: str, run_at: datetime) -> str:
    """The task id of entry ``entry_name``'s run scheduled at ``run_at`` (aware UTC)."""
    return str(uuid.uuid5(RUN_NAMESPACE, f"{entry_name}\x00{run_at.isoformat()}"))


def send_run(app: Any, entry: Any, task_id: str, run_at: datetime, producer: Any = None) -> Any:
    """Publish ``entry``'s run scheduled at ``run_at`` as ``task_id``, as Celery's scheduler
    would (its ``celery_beat_task`` header, lazy arguments evaluated), without our options."""
    options = {k: v for k, v in (entry.options or {}).items() if k != OPTION}
    options["headers"] = {
        **(options.get("headers") or {}),
        "celery_beat_task": True,
        SCHEDULED_AT_HEADER: run_at.isoformat(),
    }
    options["task_id"] = task_id
    args = [a() if isinstance(a, BeatLazyFunc) else a for a in (entry.args or ())]
    kwargs = {k: v() if isinstance(v, BeatLazyFunc) else v for k, v in (entry.kwargs or {}).items()}
    task = app.tasks.get(entry.task)
    if task is not None:
        return task.apply_async(args, kwargs, producer=producer, **options)
    return app.send_task(entry.task, args, kwargs, producer=producer, **options)
