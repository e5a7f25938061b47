"""What an operator reads from the metrics after real sweeps on a real store and broker.

Counters live in this process's default registry and grow across tests, so
each test compares values before and after what it does.
"""

from __future__ import annotations

import math
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import insert

from celery_recovery import JobType
from celery_recovery.core.timeutils import utcnow
from celery_recovery.recovery import recovery_for_app
from celery_recovery.runtime.health import StoreHealth
from celery_recovery.store.schema import callbacks
from celery_recovery.telemetry import metrics
from celery_recovery.telemetry.metrics import definitions
from tests.builders import add_history, add_running, job_row, make_queued, make_zombie
from tests.sweeps.helpers import run_concurrently
from tests.telemetry.scrape import local

ACTIONS = "celery_recovery_sweep_actions_total"


@pytest.fixture
def recovery(client_app):
    return recovery_for_app(client_app)


def counters(*keys: tuple[str, dict[str, str]]) -> list[float]:
    return [local(name, **labels) for name, labels in keys]


def test_two_sweeps_on_one_zombie_count_one_republish(store, recovery):
    watched = [
        (ACTIONS, {"cause": "zombie", "action": "republished"}),
        (ACTIONS, {"cause": "zombie", "action": "failed"}),
        ("celery_recovery_zombies_found_total", {}),
        ("celery_recovery_sweep_duration_seconds_count", {}),
    ]
    before = counters(*watched)
    make_zombie(store, f"z-{uuid.uuid4().hex[:8]}")

    reports = run_concurrently(recovery.sweep)

    after = counters(*watched)
    republished, failed, found, sweeps = (a - b for a, b in zip(after, before, strict=True))
    assert (republished, failed) == (1, 0)
    assert found == sum(r.zombies for r in reports) >= 1
    assert sweeps == 2
    assert local("celery_recovery_last_sweep_timestamp_seconds") > 0


def test_lost_message_is_counted_with_its_republish(store, recovery):
    task_id = f"lost-{uuid.uuid4().hex[:8]}"
    make_queued(store, task_id, queue="unused")
    lost_before = local("celery_recovery_lost_messages_total")
    republished_before = local(ACTIONS, cause="lost_message", action="republished")

    later = utcnow() + timedelta(seconds=recovery.settings.queued_timeout + 1)
    report = recovery.sweep(now=later)

    assert report.lost_republished == 1
    assert local("celery_recovery_lost_messages_total") - lost_before == 1
    assert local(ACTIONS, cause="lost_message", action="republished") - republished_before == 1


def test_gauges_show_live_jobs_stalest_heartbeat_and_pending_callbacks(store, recovery):
    now = utcnow()
    for job_id, job_type, age in (("w1", JobType.WORKER, 1.0), ("w2", JobType.WORKER, 2.0)):
        beat_at = now - timedelta(seconds=age)
        store.jobs.add_job(job_row(job_id, beat_at, job_type=job_type))
    # A callback another sweep has claimed (and is still delivering) stays pending.
    with store.transaction() as conn:
        conn.execute(
            insert(callbacks).values(
                task_id="t",
                try_number=1,
                kind="failure",
                payload={},
                created_at=now,
                claimed_by="someone-else",
                claimed_until=now + timedelta(minutes=10),
                attempts=1,
            )
        )

    recovery.sweep(now=now)

    assert local("celery_recovery_jobs_running", job_type="worker") == 2
    assert local("celery_recovery_jobs_running", job_type="beat") == 0
    assert local("celery_recovery_heartbeat_age_seconds", job_type="worker") == pytest.approx(
        2.0, abs=0.01
    )
    beat_age = local("celery_recovery_heartbeat_age_seconds", job_type="beat")
    assert math.isnan(beat_age)
    assert local("celery_recovery_callbacks_pending") == 1


def test_the_overdue_gauge_counts_tries_far_past_their_task_usual_duration(store, recovery):
    now = utcnow()
    add_history(store, "shop.import", now, [100.0] * 20)
    add_running(store, "shop.import", now - timedelta(seconds=400))
    add_running(store, "shop.import", now - timedelta(seconds=100))

    recovery.sweep(now=now)
    assert local("celery_recovery_overdue_tries") == 1

    recovery.sweep(now=now - timedelta(seconds=200))
    assert local("celery_recovery_overdue_tries") == 0


def test_unreachable_store_counts_store_and_sweep_errors(make_client_app):
    app = make_client_app("postgresql+psycopg://postgres@127.0.0.1:1/nowhere")
    store_errors = local("celery_recovery_store_errors_total", error="unavailable")
    sweep_errors = local("celery_recovery_sweep_errors_total")

    report = recovery_for_app(app).sweep()

    assert report.errors >= 1
    assert local("celery_recovery_sweep_errors_total") - sweep_errors == report.errors
    assert local("celery_recovery_store_errors_total", error="unavailable") > store_errors


def test_store_health_counts_failures_and_dropped_writes():
    from celery_recovery.core.errors import StoreSchemaError

    health = StoreHealth("test")
    schema = local("celery_recovery_store_errors_total", error="schema")
    dropped = local("celery_recovery_dropped_writes_total")
    health.record_failure(StoreSchemaError("no tables"), "testing")
    health.record_dropped(3, 10)
    assert local("celery_recovery_store_errors_total", error="schema") - schema == 1
    assert local("celery_recovery_dropped_writes_total") - dropped == 3


def test_a_broken_metric_does_not_stop_the_sweep(store, recovery, monkeypatch):
    class Broken:
        def labels(self, *args):
            raise RuntimeError("metrics are broken")

    monkeypatch.setattr(definitions, "SWEEP_ACTIONS", Broken())
    make_zombie(store, f"z-{uuid.uuid4().hex[:8]}")

    report = recovery.sweep()

    assert (report.zombies, report.republished, report.errors) == (1, 1, 0)


def test_triggerer_functions_set_their_series():
    events = local("celery_recovery_trigger_events_total", kind="resumed")
    blocked = local("celery_recovery_triggerer_blocked_loop_warnings_total")

    metrics.triggers_running("job-a", 3)
    metrics.trigger_event("resumed")
    metrics.trigger_event("not-a-kind")  # a caller's mistake is logged, never raised
    metrics.blocked_loop()

    assert local("celery_recovery_triggers_running", triggerer="job-a") == 3
    assert local("celery_recovery_trigger_events_total", kind="resumed") - events == 1
    assert local("celery_recovery_trigger_events_total", kind="not-a-kind") == 0
    assert local("celery_recovery_triggerer_blocked_loop_warnings_total") - blocked == 1
    metrics.triggerer_stopped("job-a")
    metrics.triggerer_stopped("job-a")
    assert local("celery_recovery_triggers_running", triggerer="job-a") == 0


def test_a_failing_step_is_counted_by_name_and_its_sweep_is_not_clean(store, recovery, monkeypatch):
    from celery_recovery.core.records import CLEAN_SWEEP
    from celery_recovery.sweeps.runner import STEPS

    assert {name for name, _ in STEPS} < set(definitions.SWEEP_STEPS)
    failures = ("celery_recovery_sweep_step_failures_total", {"step": "zombies"})
    (before,) = counters(failures)
    make_zombie(store, f"z-{uuid.uuid4().hex[:8]}")

    def down(task_id):
        raise ConnectionError("backend down")

    # The result backend cannot be asked: the zombie step fails, and says why.
    monkeypatch.setattr(recovery.app.backend, "get_task_meta", down)
    report = recovery.sweep()
    assert report.failing_steps == ["zombies"]
    assert report.first_error == "the result backend did not answer (ConnectionError: backend down)"
    assert counters(failures) == [before + 1]
    assert store.checkins.last_completed(CLEAN_SWEEP) is None
    assert store.checkins.last("sweep")[1]["failing_steps"] == ["zombies"]

    # Once it answers, the pass is clean again.
    monkeypatch.undo()
    report = recovery.sweep()
    assert (report.failing_steps, report.republished) == ([], 1)
    assert store.checkins.last_completed(CLEAN_SWEEP) is not None
    assert local("celery_recovery_last_clean_sweep_timestamp_seconds") > 0
