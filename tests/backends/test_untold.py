"""Sweeps that cannot ask the result backend still recover, and say so.

With no result backend (Celery's default) or ``rpc://`` nothing but the store
can tell what became of a dead worker's try.  The zombies and queued tries
here are made directly in the store; the sweeps publish through real Redis
(or RabbitMQ) and the decision is read back from the store and its audit log.
"""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import select

from celery_recovery import TaskState
from celery_recovery.recovery import recovery_for_app
from celery_recovery.store.schema import audit_log, task_records
from tests.builders import make_queued, make_zombie

pytestmark = pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)

NO_BACKEND = "the result backend cannot be asked (no result backend is configured)"
RPC = "the result backend cannot be asked (the rpc:// result backend answers only the process"


def _audit(store, task_id: str) -> list[tuple[str, str]]:
    with store.transaction() as conn:
        rows = conn.execute(
            select(audit_log.c.action, audit_log.c.detail)
            .where(audit_log.c.task_id == task_id)
            .order_by(audit_log.c.id)
        )
        return [(row.action, row.detail) for row in rows]


def _states(store, task_id: str) -> list[tuple[int, str]]:
    return [(t["try_number"], t["state"]) for t in store.tries.history(task_id)]


@pytest.mark.parametrize(
    "result_backend,broker,says",
    [("none", "redis", NO_BACKEND), ("rpc", "redis", RPC)],
)
def test_a_zombie_runs_again_when_the_backend_cannot_be_asked(
    store, client_app, caplog, says, broker
):
    make_zombie(store, "t1")
    recovery = recovery_for_app(client_app)
    with caplog.at_level(logging.WARNING, logger="celery_recovery"):
        report = recovery.sweep()
        again = recovery.sweep()

    assert (report.zombies, report.republished, report.errors) == (1, 1, 0)
    assert again.errors == 0
    assert _states(store, "t1") == [(1, TaskState.UP_FOR_RETRY), (2, TaskState.QUEUED)]
    reason = store.tries.history("t1")[0]["state_reason"]
    assert says in reason and "so it runs again in case it had not finished" in reason
    assert _audit(store, "t1")[0] == ("republished", reason)
    # No backend was asked, so none failed to answer: no warning per task per sweep.
    assert not [r for r in caplog.records if "did not answer" in r.getMessage()]


@pytest.mark.parametrize("result_backend", ["none"])
def test_a_lost_message_is_published_again(store, make_client_app, store_url):
    app = make_client_app(store_url, queued_timeout=3.0)
    make_queued(store, "lost")  # queued 5 s ago
    report = recovery_for_app(app).sweep()
    assert (report.lost_messages, report.lost_republished, report.errors) == (1, 1, 0)
    assert _states(store, "lost") == [(1, TaskState.UP_FOR_RETRY), (2, TaskState.QUEUED)]
    reason = store.tries.history("lost")[0]["state_reason"]
    assert reason.startswith("message lost: not started within 3s of being queued in the store")
    assert NO_BACKEND in reason


@pytest.mark.parametrize("result_backend", ["none"])
def test_the_app_can_fail_an_untold_zombie_instead_of_running_it_twice(
    store, make_client_app, store_url
):
    app = make_client_app(store_url, unknown_outcome="fail")
    make_zombie(store, "t1")
    report = recovery_for_app(app).sweep()
    assert (report.zombies, report.republished, report.failed) == (1, 0, 1)
    (only,) = store.tries.history("t1")
    assert only["state"] == TaskState.FAILED
    assert NO_BACKEND in only["state_reason"]
    assert "not run again: recovery_unknown_outcome is 'fail'" in only["state_reason"]
    assert _audit(store, "t1")[0] == ("failed", only["state_reason"])
    assert store.outbox.pending_callbacks() == []  # on_failure delivered by the same sweep


@pytest.mark.parametrize("result_backend", ["none"])
def test_a_task_attribute_overrides_the_apps_choice(store, client_app):
    client_app.tasks["lifecycle.add"].recovery_unknown_outcome = "fail"
    try:
        make_zombie(store, "t1")
        make_zombie(store, "t2", job_id="deadjob2", task_name="lifecycle.ledger_sleep")
        recovery_for_app(client_app).sweep()
    finally:
        del client_app.tasks["lifecycle.add"].recovery_unknown_outcome
    assert _states(store, "t1") == [(1, TaskState.FAILED)]
    assert _states(store, "t2") == [(1, TaskState.UP_FOR_RETRY), (2, TaskState.QUEUED)]


def test_a_task_that_stores_no_result_is_said_to_be_untold(store, client_app):
    # A Redis backend that can be asked, but the message asked it to keep nothing.
    make_zombie(store, "t1")
    recovery = recovery_for_app(client_app)
    with store.transaction() as conn:
        conn.execute(
            task_records.update()
            .where(task_records.c.task_id == "t1")
            .values(headers={"ignore_result": True})
        )
    recovery.sweep()
    reason = store.tries.history("t1")[0]["state_reason"]
    assert "the task stores no result (ignore_result)" in reason
    assert _states(store, "t1") == [(1, TaskState.UP_FOR_RETRY), (2, TaskState.QUEUED)]


@pytest.mark.parametrize("result_backend", ["none"])
def test_a_bad_task_attribute_is_logged_once_and_the_app_setting_applies(store, client_app, caplog):
    client_app.tasks["lifecycle.add"].recovery_unknown_outcome = "maybe"
    try:
        make_zombie(store, "t1")
        with caplog.at_level(logging.ERROR, logger="celery_recovery"):
            recovery_for_app(client_app).sweep()
    finally:
        del client_app.tasks["lifecycle.add"].recovery_unknown_outcome
    assert _states(store, "t1") == [(1, TaskState.UP_FOR_RETRY), (2, TaskState.QUEUED)]
    (logged,) = [
        r.getMessage() for r in caplog.records if "recovery_unknown_outcome" in r.getMessage()
    ]
    assert "lifecycle.add.recovery_unknown_outcome='maybe'" in logged
    assert "rerun" in logged and "fail" in logged
