"""A redelivery of a try that runs in a job with a fresh heartbeat: alive or dead?

A fresh heartbeat alone does not tell (RabbitMQ requeues a dead worker's
message within milliseconds), so the check waits until the owner beats again
(alive: drop the copy) or stops beating for two intervals (dead: run it).
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from celery_recovery.core.timeutils import utcnow
from celery_recovery.deliveries.redundant_deliveries import drop_if_redundant, was_dropped
from celery_recovery.recovery import recovery_for_app
from tests.builders import make_zombie
from tests.conftest import FAST_SETTINGS

pytestmark = pytest.mark.compat

INTERVAL = FAST_SETTINGS["heartbeat_interval"]


def redelivery(task_id: str) -> SimpleNamespace:
    request = SimpleNamespace(
        id=task_id,
        retries=0,
        delivery_info={"redelivered": True},
        args=[1, 2],
        kwargs={},
        callbacks=None,
        errbacks=None,
        chain=None,
        chord=None,
        eta=None,
        expires=None,
        hostname="w@here",
    )
    return SimpleNamespace(name="lifecycle.add", request=request)


@pytest.mark.parametrize("owner_alive", [True, False], ids=["alive", "dead"])
def test_redelivery_waits_for_the_owner_to_prove_alive_or_dead(client_app, store, owner_alive):
    recovery = recovery_for_app(client_app)
    make_zombie(store, "t1", job_id="owner", age=0.0)  # running, last beat just now
    stop = threading.Event()

    def beat():
        while not stop.wait(INTERVAL):
            store.jobs.heartbeat("owner", utcnow())

    beater = threading.Thread(target=beat, daemon=True)
    if owner_alive:
        beater.start()
    began = time.monotonic()
    try:
        dropped = drop_if_redundant(recovery.context, redelivery("t1"), "t1")
    finally:
        stop.set()
    took = time.monotonic() - began
    assert dropped is owner_alive
    assert was_dropped("t1") is owner_alive
    # Alive: settled by its next beat.  Dead: by two intervals without one.
    assert took <= (1.5 if owner_alive else 3) * INTERVAL + 0.5, took
