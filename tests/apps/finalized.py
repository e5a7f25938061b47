"""An app whose tasks are finalized when its module is imported, before a worker starts.

Apps do this when they read ``app.tasks`` at import (to list or check their
tasks, as some Django projects do): celery-recovery then wraps the tasks before
the worker installs Celery's own optimised ``Task.__call__``.  Configured from
``RECOVERY_TEST_BROKER``, ``RECOVERY_TEST_BACKEND``, ``RECOVERY_TEST_QUEUE`` and
the package's ``CELERY_RECOVERY_*`` variables; ``RECOVERY_TEST_PLAIN=1`` runs it
without celery-recovery.
"""

from __future__ import annotations

import os

from celery import Celery

app = Celery("finalized", set_as_current=False)
app.conf.update(
    broker_url=os.environ.get("RECOVERY_TEST_BROKER", "redis://127.0.0.1:6379/9"),
    result_backend=os.environ.get("RECOVERY_TEST_BACKEND", "redis://127.0.0.1:6379/10"),
    task_default_queue=os.environ.get("RECOVERY_TEST_QUEUE", "celery"),
    broker_connection_retry_on_startup=True,
)
if os.environ.get("RECOVERY_TEST_PLAIN") != "1":
    from celery_recovery import Recovery

    recovery = Recovery(app)


@app.task(bind=True, name="finalized.requests")
def requests(self):
    """What the body sees: how many requests are on the stack, and its own."""
    return {
        "stack": len(self.request_stack.stack),
        "id": self.request.id,
        "retries": self.request.retries,
    }


TASK_NAMES = sorted(app.tasks)  # finalizes the app now, at import
