"""The Celery app the chaos run's workers, beat and triggerer import (``-A tests.chaos.app``).

Configured from the environment like ``tests.apps.lifecycle``
(``RECOVERY_TEST_BROKER``, ``RECOVERY_TEST_BACKEND``, ``RECOVERY_TEST_QUEUE``,
``CELERY_RECOVERY_*``, e.g. ``CELERY_RECOVERY_PRESET=aggressive``) plus
``CHAOS_LEDGER_DSN``; ``CHAOS_BEAT=1`` schedules the sweep with the
``aggressive`` preset (in the beat process).
"""

from __future__ import annotations

import os

from tests.chaos.tasks import create_chaos_app

app = create_chaos_app(
    os.environ.get("RECOVERY_TEST_BROKER", "redis://127.0.0.1:6379/9"),
    os.environ.get("RECOVERY_TEST_BACKEND", "redis://127.0.0.1:6379/10"),
    os.environ.get("RECOVERY_TEST_QUEUE", "celery"),
    {},
    acks_late=os.environ.get("RECOVERY_TEST_ACKS_LATE") == "1",
)
if os.environ.get("CHAOS_BEAT") == "1":
    from celery_recovery.beat_schedules import recovery_beat_schedule

    app.conf.beat_schedule = recovery_beat_schedule("aggressive")
app.set_current()
