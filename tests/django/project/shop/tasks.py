"""The project's tasks, found by ``app.autodiscover_tasks()``."""

import os
import time
from datetime import UTC

from celery import Task, shared_task

from shop.models import BodyRun, FailureSeen


class RecordsFailures(Task):
    """A task class whose ``on_failure`` writes through Django's ORM: it runs only
    where Django is set up and this module imported."""

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        FailureSeen.objects.create(task_id=task_id, exception=repr(exc), pid=os.getpid())


@shared_task(bind=True, acks_late=True, base=RecordsFailures)
def work(self, label: str, seconds: float = 0.0, first_seconds: float | None = None) -> str:
    """Record the start of the body, sleep, return ``label``.  The task's first run sleeps
    ``first_seconds`` instead when given: long enough to be killed mid-run however slow
    the machine, while the run after it is short."""
    first = not BodyRun.objects.filter(task_id=self.request.id).exists()
    BodyRun.objects.create(task_id=self.request.id, label=label, pid=os.getpid())
    time.sleep(first_seconds if first and first_seconds is not None else seconds)
    return label


@shared_task(bind=True, base=RecordsFailures, max_retries=0)
def once(self, label: str, seconds: float = 0.0) -> str:
    """Like ``work``, but never run again: a killed run is failed by the sweep, and its
    ``on_failure`` runs there."""
    BodyRun.objects.create(task_id=self.request.id, label=label, pid=os.getpid())
    time.sleep(seconds)
    return label


@shared_task(bind=True)
def wait_for_ready(self, seconds: float) -> None:
    """Defer to the triggerer, which ends the task with a success of its own."""
    from datetime import datetime, timedelta

    from celery_recovery import defer
    from shop.triggers import Ready

    at = datetime.now(UTC) + timedelta(seconds=seconds)
    defer(Ready(at.isoformat()), timeout=60)
