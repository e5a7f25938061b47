"""The worker runs ``celery-recovery doctor``'s checks once when it is ready
(``recovery_doctor_at_start``), in a thread that logs the findings."""

from __future__ import annotations

from typing import Any

from celery.signals import worker_ready

from celery_recovery.runtime.context import context_for_app
from celery_recovery.signals.guard import never_raises


@never_raises
def on_worker_ready(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    context = context_for_app(app) if app is not None else None
    if context is None or not context.settings.doctor_at_start:
        return
    from celery_recovery.doctor import at_start  # talks to servers: loaded only here

    at_start.start(context.app, context.settings, context.store)


def connect() -> None:
    worker_ready.connect(on_worker_ready, weak=False, dispatch_uid=__name__ + ".ready")
