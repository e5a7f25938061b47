"""A killed worker's prefetched and ETA messages run on another worker, exactly once, within
a few sweep intervals (not ``recovery_queued_timeout`` later)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from celery_recovery import TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.recovery import recovery_for_app
from tests.conftest import FAST_SETTINGS
from tests.sweeps.helpers import (
    count,
    ledger_lines,
    reserved_ids,
    restore_unacked,
    running_try,
    sweep_until,
)
from tests.workers import flush_publisher, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.compat]

ZOMBIE = FAST_SETTINGS["zombie_threshold"]
SWEEP = FAST_SETTINGS["sweep_interval"]
#: Seconds from publishing the countdown task to its ETA: past the time the sweep
#: publishes it again (at most ZOMBIE + 3 * SWEEP + 4 after the kill, a few seconds
#: after the publish), so the new message must still wait for it.
COUNTDOWN = 13.0
#: Redis restores the dead worker's originals this long after it took them (the
#: PostgreSQL case): they must be dropped, not run a second time.
VISIBILITY = 9.0


@pytest.mark.parametrize(
    "store_url,broker",
    [("sqlite", "redis"), ("postgresql", "redis"), ("postgresql", "rabbitmq")],
    indirect=["store_url"],
)
def test_a_killed_workers_reserved_and_eta_tasks_run_once_on_another_worker(
    client_app, store, start_worker, tmp_path, broker, store_url
):
    # Prefetch multiplier 4 (Celery's default), concurrency 1: one task runs, the
    # next four wait in the worker, and the countdown task waits there for its ETA.
    env = {"RECOVERY_TEST_PREFETCH": "4"}
    restores = broker == "redis" and store_url.startswith("postgresql")
    if restores:
        env["RECOVERY_TEST_VISIBILITY"] = str(VISIBILITY)
    recovery = recovery_for_app(client_app)
    assert recovery.settings.queued_timeout >= 600  # the net for unreserved messages: not used
    doomed = start_worker(name="doomed", concurrency=1, env=env)
    running = client_app.send_task("lifecycle.slow_first_try", (60, 0.1))
    running_try(store, running.id)
    eta = utcnow() + timedelta(seconds=COUNTDOWN)
    later = client_app.send_task("lifecycle.ledger_sleep", (str(tmp_path / "later"), 0.1), eta=eta)
    waiting = [
        client_app.send_task("lifecycle.ledger_sleep", (str(tmp_path / f"waiting{i}"), 0.1))
        for i in range(4)
    ]
    reserved = [later, *waiting]
    wait_for(
        lambda: reserved_ids(store) >= {r.id for r in reserved}, 15, what="doomed to reserve them"
    )

    # Its worker is alive: a sweep leaves what it holds alone.  (A worker commits its
    # reservations sooner than the publisher its records: wait for those too.)
    flush_publisher(client_app)
    assert recovery.sweep().reserved == 0
    for result in reserved:
        assert [(t["try_number"], t["state"]) for t in store.tries.history(result.id)] == [
            (1, TaskState.QUEUED)
        ]

    survivor = start_worker(name="survivor", concurrency=1, env=env)
    doomed.kill()
    killed = time.monotonic()
    sweep_until(
        client_app,
        lambda: all(r.ready() for r in waiting),
        ZOMBIE + 5 * SWEEP + 15,
        "the reserved tasks to finish on the survivor",
    )
    took = time.monotonic() - killed
    print(f"\n{broker}/{store.dialect}: kill to last reserved task finished: {took:.1f}s")
    assert took <= ZOMBIE + 3 * SWEEP + 4, took

    sweep_until(client_app, later.ready, COUNTDOWN + 15, "the countdown task")
    assert later.get(timeout=5) == 0.1
    done = wait_for(
        lambda: next(
            (t for t in store.tries.history(later.id) if t["state"] == TaskState.SUCCESS), None
        ),
        5,
        what=f"the countdown task's success to be recorded: {store.tries.history(later.id)}",
    )
    assert done["started_at"] >= eta, (done["started_at"], eta)
    if broker == "redis":
        # Redis keeps the originals: each was published again by the sweep as try 2.
        for result in reserved:
            tries = store.tries.history(result.id)
            assert [(t["try_number"], t["state"]) for t in tries] == [
                (1, TaskState.UP_FOR_RETRY),
                (2, TaskState.SUCCESS),
            ], tries
            assert "reserved by dead worker job" in tries[0]["state_reason"]
    if restores:
        # The originals come back after the visibility timeout: all dropped.
        def dropped() -> bool:
            restore_unacked(client_app, VISIBILITY)
            return survivor.log.count("dropping stale delivery") >= len(reserved)

        wait_for(
            dropped,
            VISIBILITY + 15,
            what="the restored originals to be dropped",
        )
    for name in ("later", *(f"waiting{i}" for i in range(4))):
        ledger = tmp_path / name
        assert count(ledger, "start") == 1 and count(ledger, "done") == 1, ledger_lines(ledger)
