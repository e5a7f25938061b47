"""A delivery checked just before a sweep replaces its try must not run beside the new try."""

from __future__ import annotations

from celery_recovery import TaskState
from celery_recovery.deliveries.redundant_deliveries import drop_if_redundant, was_dropped
from celery_recovery.recovery import recovery_for_app
from tests.builders import make_zombie
from tests.sweeps.test_redelivery_owner import redelivery


def test_a_redelivery_whose_try_a_sweep_replaced_after_the_check_is_dropped(
    client_app, store, monkeypatch
):
    # Given a redelivery of a try whose worker is dead: the check finds it may run,
    recovery = recovery_for_app(client_app)
    make_zombie(store, "t1", job_id="gone", age=60.0)
    read_before_the_sweep = recovery.store.try_recovery.delivery_view("t1", 1)
    # but a sweep publishes the try again before the delivery's claim lands
    # (RabbitMQ hands out a dead worker's messages while sweeps run).
    assert recovery.sweep().republished == 1
    monkeypatch.setattr(
        recovery.store.try_recovery, "delivery_view", lambda *_: read_before_the_sweep
    )

    assert drop_if_redundant(recovery.context, redelivery("t1"), "t1") is True
    assert was_dropped("t1")
    assert [(t["try_number"], t["state"]) for t in store.tries.history("t1")] == [
        (1, TaskState.UP_FOR_RETRY),
        (2, TaskState.QUEUED),
    ]
