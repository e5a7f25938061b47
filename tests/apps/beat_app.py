"""The lifecycle app with a beat schedule from the environment, for the HA beat tests.

``RECOVERY_TEST_BEAT_SCHEDULE`` is JSON: entry name -> ``{"task", "every"
(seconds) or "crontab" (kwargs), "args", "kwargs", "options"}``.
"""

from __future__ import annotations

import json
import os

from celery.schedules import crontab

from tests.apps.lifecycle import app

_entries = json.loads(os.environ.get("RECOVERY_TEST_BEAT_SCHEDULE") or "{}")
app.conf.beat_schedule = {
    **app.conf.beat_schedule,
    **{
        name: {
            "task": spec["task"],
            "schedule": crontab(**spec["crontab"]) if "crontab" in spec else spec["every"],
            "args": spec.get("args", ()),
            "kwargs": spec.get("kwargs", {}),
            "options": spec.get("options", {}),
        }
        for name, spec in _entries.items()
    },
}
app.conf.beat_scheduler = "celery_recovery.beat:Scheduler"

__all__ = ["app"]


@app.task(shared=False, name="beat.ledger", bind=True)
def ledger(self, path):
    """Writes its task id and scheduled time to ``path``: a worker-side count of runs."""
    with open(path, "a") as handle:
        handle.write(f"{self.request.id} {self.request.get('recovery_scheduled_at')}\n")


@app.task(shared=False, name="beat.span", bind=True)
def span(self, path, seconds):
    """Runs ``seconds`` and writes its task id, scheduled time, start and end to ``path``."""
    import time

    started = time.time()
    time.sleep(seconds)
    with open(path, "a") as handle:
        scheduled = self.request.get("recovery_scheduled_at")
        handle.write(f"{self.request.id} {scheduled} {started} {time.time()}\n")
