"""The demo's Celery app: a ``filesystem://`` broker, an SQLite result backend and store.

The worker subprocesses import it (``-A celery_recovery.demo.app``); the
folder comes from ``RECOVERY_DEMO_DIR``.  The filesystem transport
acknowledges a message when a worker takes it, so a SIGKILLed worker's task
is simply gone, exactly what plain Celery does with Redis and early ack.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery import Celery

from celery_recovery import Recovery

DEMO_DIR = Path(os.environ.get("RECOVERY_DEMO_DIR", ".celery-recovery-demo")).resolve()
BROKER_DIR = DEMO_DIR / "broker"
CONTROL_DIR = DEMO_DIR / "control"

app = Celery(
    "demo",
    broker="filesystem://",
    backend=f"db+sqlite:///{DEMO_DIR / 'results.sqlite3'}",
    set_as_current=True,
)
app.conf.update(
    broker_transport_options={
        "data_folder_in": str(BROKER_DIR),
        "data_folder_out": str(BROKER_DIR),
        "control_folder": str(CONTROL_DIR),
    },
    worker_prefetch_multiplier=1,
    task_track_started=True,
    broker_connection_retry_on_startup=True,
    recovery_database_url=f"sqlite:///{DEMO_DIR / 'celery_recovery.sqlite3'}",
    recovery_preset="aggressive",
    recovery_queued_timeout=10,
)
recovery = Recovery(app)


@app.task(name="demo.charge_order", bind=True, max_retries=3)
def charge_order(self, order_id: int, seconds: float) -> str:
    """Pretend to charge an order: takes a few seconds, like real work."""
    time.sleep(seconds)
    return f"order {order_id} charged by pid {os.getpid()} (try {self.request.retries + 1})"
