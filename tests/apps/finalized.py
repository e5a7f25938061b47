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


class CountsItsStarts(app.Task):
    """A base class whose ``before_start`` calls ``super()``, as shared bases do."""

    def before_start(self, task_id, args, kwargs):
        self.request.starts = getattr(self.request, "starts", 0) + 1
        super().before_start(task_id, args, kwargs)


@app.task(bind=True, base=CountsItsStarts, name="finalized.late")
def late(self):
    """Registered on the finalized app, after Recovery hooked the app's tasks."""
    return self.request.starts


class Parent(CountsItsStarts):
    name = "finalized.parent"

    def run(self):
        return self.request.starts


class Child(Parent):
    """A task class whose parent is a task too: both classes are hooked."""

    name = "finalized.child"


app.register_task(Parent())
app.register_task(Child())
