"""Run one sweep whose failure listener SIGKILLs the sweeping process mid-delivery.

Used by tests/sweeps/test_callbacks.py: argv is store URL, broker, backend, queue.
"""

from __future__ import annotations

import os
import signal
import sys

from celery_recovery.recovery import recovery_for_app
from tests.apps.lifecycle import create_app

store_url, broker, backend, queue = sys.argv[1:5]
app = create_app(broker, backend, queue, {"database_url": store_url})
recovery = recovery_for_app(app)


@recovery.add_failure_listener
def die(**_):
    # After the task's on_failure ran, before the outbox row is deleted.
    os.kill(os.getpid(), signal.SIGKILL)


recovery.sweep()
