"""The Celery app the real-worker tests run, configured from the environment.

The worker subprocess imports ``app`` from here, configured by
``RECOVERY_TEST_BROKER``, ``RECOVERY_TEST_BACKEND`` and ``RECOVERY_TEST_QUEUE``
plus the package's own ``CELERY_RECOVERY_*`` variables; with
``RECOVERY_TEST_PLAIN=1`` it runs plain Celery.  Tests build their
publishing app with :func:`create_app` so each test has its own store and queue.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from celery_recovery import Recovery


def create_app(
    broker: str, backend: str, queue: str, recovery: dict[str, Any] | None = None
) -> Celery:
    """A lifecycle app; ``recovery`` holds the overrides to install celery-recovery with."""
    app = Celery("lifecycle", set_as_current=False)
    app.conf.update(
        broker_url=broker,
        result_backend=backend,
        task_default_queue=queue,
        task_track_started=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        accept_content=["json", "pickle"],
        result_accept_content=["json", "pickle"],
    )
    _register_tasks(app)
    if recovery is not None:
        Recovery(app, **recovery)
    return app


def _register_tasks(app: Celery) -> None:
    @app.task(shared=False, name="lifecycle.add")
    def add(x, y):
        return x + y

    @app.task(shared=False, name="lifecycle.noop")
    def noop():
        return None

    @app.task(shared=False, name="lifecycle.boom")
    def boom(message="boom"):
        raise ValueError(message)

    @app.task(shared=False, name="lifecycle.retry_once", bind=True, max_retries=3)
    def retry_once(self):
        if self.request.retries == 0:
            raise self.retry(countdown=0, exc=RuntimeError("first try always fails"))
        return self.request.retries

    @app.task(shared=False, name="lifecycle.sleep_for")
    def sleep_for(seconds):
        time.sleep(seconds)
        return seconds

    @app.task(shared=False, name="lifecycle.describe", serializer="pickle")
    def describe(value):
        return repr(value)


app = create_app(
    os.environ.get("RECOVERY_TEST_BROKER", "redis://127.0.0.1:6379/9"),
    os.environ.get("RECOVERY_TEST_BACKEND", "redis://127.0.0.1:6379/10"),
    os.environ.get("RECOVERY_TEST_QUEUE", "celery"),
    None if os.environ.get("RECOVERY_TEST_PLAIN", "1") == "1" else {},
)
app.set_current()
