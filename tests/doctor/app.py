"""The app the doctor's command-line and worker tests run, configured from the
environment: ``DOCTOR_TEST_BROKER``, ``DOCTOR_TEST_BACKEND`` (empty: none) and the
package's own ``CELERY_RECOVERY_*`` variables.  ``DOCTOR_TEST_INSTALL=1`` installs
celery-recovery, as a worker's app does."""

from __future__ import annotations

import os

from celery import Celery

from celery_recovery import Recovery

app = Celery(
    "doctor_app",
    broker=os.environ["DOCTOR_TEST_BROKER"],
    backend=os.environ.get("DOCTOR_TEST_BACKEND") or None,
)
app.conf.task_default_queue = os.environ.get("DOCTOR_TEST_QUEUE", "celery")

if os.environ.get("DOCTOR_TEST_INSTALL") == "1":
    Recovery(app)


@app.task(name="doctor.add")
def add(x: int, y: int) -> int:
    return x + y
