"""No dead ends: a try whose result backend reads RETRY gets its next try when none
was ever sent.

The zombie is made in the store, the RETRY stored in the real Redis result backend
(as Celery 5.5.3 leaves a cold shutdown's running task), and the sweeps run at
chosen times; the next try is published through real Redis and counted there.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from sqlalchemy import select

from celery_recovery import TaskState
from celery_recovery.core.states import RETRY_RECONCILED_REASON
from celery_recovery.core.timeutils import utcnow
from celery_recovery.recovery import recovery_for_app
from celery_recovery.store.schema import audit_log
from tests.builders import make_queued, make_zombie
from tests.sweeps.helpers import run_concurrently

QUEUED_TIMEOUT = 30.0


@pytest.fixture
def app(make_client_app, store_url):
    return make_client_app(store_url, queued_timeout=QUEUED_TIMEOUT)


@pytest.fixture
def published(app):
    client = redis.Redis.from_url(app.conf.broker_url)
    client.delete("unused")  # the queue make_zombie's tries were published to
    yield client
    client.delete("unused")


def _states(store, task_id):
    return [(t["try_number"], t["state"]) for t in store.tries.history(task_id)]


def _audit(store, task_id):
    with store.transaction() as conn:
        return conn.execute(
            select(audit_log.c.action, audit_log.c.reason, audit_log.c.detail)
            .where(audit_log.c.task_id == task_id)
            .order_by(audit_log.c.id)
        ).all()


def test_a_retry_the_backend_reads_but_nobody_sent_runs_the_task_again(app, store, published):
    # Given a dead worker's try whose backend reads RETRY (Celery's cold shutdown stores
    # it for the tasks it terminates) and no try 2 recorded,
    make_zombie(store, "t1")
    app.backend.store_result("t1", None, "RETRY")

    # when two sweeps judge it at once, one publishes try 2, once,
    reports = run_concurrently(recovery_for_app(app).sweep)
    assert sum(r.republished for r in reports) == 1
    assert sum(r.reconciled for r in reports) == 0
    assert _states(store, "t1") == [(1, TaskState.UP_FOR_RETRY), (2, TaskState.QUEUED)]
    assert published.llen("unused") == 1
    # and the reason says why.
    reason = store.tries.history("t1")[0]["state_reason"]
    assert "the result backend reads RETRY, but no try 2 was ever recorded" in reason
    assert _audit(store, "t1")[0][:2] == ("republished", "worker_lost")


def test_a_retry_that_was_sent_is_reconciled_and_left_alone(app, store, published):
    make_zombie(store, "t1")
    app.backend.store_result("t1", None, "RETRY")
    now = utcnow()
    make_queued(store, "t1", try_number=2, at=now)  # the worker's retry published try 2, which ran
    store.tries.transition("t1", 2, (TaskState.QUEUED,), TaskState.SUCCESS)
    recovery = recovery_for_app(app)
    assert recovery.sweep(now).reconciled == 1
    assert store.tries.history("t1")[0]["state_reason"] == RETRY_RECONCILED_REASON
    later = recovery.sweep(now + timedelta(seconds=QUEUED_TIMEOUT + 1))
    assert later.lost_republished == 0
    assert _states(store, "t1")[0] == (1, TaskState.UP_FOR_RETRY)
    assert published.llen("unused") == 0


def test_a_retry_reconciled_whose_next_try_vanished_is_sent_after_the_queued_timeout(
    app, store, published
):
    # Given a try reconciled from a real retry, whose next try's record then vanished
    # (its publisher died with it in its buffer, say: no later try in the store),
    make_zombie(store, "t1")
    decided = utcnow()
    assert store.tries.transition(
        "t1",
        1,
        TaskState.RUNNING,
        TaskState.UP_FOR_RETRY,
        state_reason=RETRY_RECONCILED_REASON,
        recovered_at=decided,
    )
    recovery = recovery_for_app(app)

    # nothing is sent within the queued timeout,
    recovery.sweep(decided + timedelta(seconds=QUEUED_TIMEOUT - 1))
    assert _states(store, "t1") == [(1, TaskState.UP_FOR_RETRY)]
    assert published.llen("unused") == 0

    # and once it passed, two sweeps at once publish try 2 once,
    later = decided + timedelta(seconds=QUEUED_TIMEOUT + 1)
    reports = run_concurrently(lambda: recovery.sweep(later))
    assert sum(r.lost_republished for r in reports) == 1
    assert sum(r.errors for r in reports) == 0
    assert _states(store, "t1") == [(1, TaskState.UP_FOR_RETRY), (2, TaskState.QUEUED)]
    assert published.llen("unused") == 1
    first = store.tries.history("t1")[0]
    assert first["state_reason"].startswith(
        "no try 2 appeared within 30s of the result backend's RETRY (the retry was never sent)"
    )
    # with an audit row, and no on_retry owed (the stored retry ran it, or none).
    assert [(a, r, d) for a, r, d in _audit(store, "t1")] == [
        ("republished", "message_lost", first["state_reason"])
    ]
    assert store.outbox.pending_callbacks() == []
    assert recovery.sweep(later + timedelta(seconds=QUEUED_TIMEOUT)).lost_republished == 0
    assert published.llen("unused") == 1


@pytest.mark.slow
@pytest.mark.compat
def test_the_tries_own_message_coming_back_runs_it(
    make_client_app, store_url, store, start_worker, tmp_path
):
    from tests.sweeps.helpers import count, ledger_lines
    from tests.workers import flush_publisher, wait_for

    queued_timeout = 3.0  # a delivery published longer ago than half of it is checked
    app = make_client_app(store_url, queued_timeout=queued_timeout)
    ledger = tmp_path / "ledger"
    # Given a try whose message waits in the queue while a sweep made it up_for_retry
    # from the backend's RETRY, and no try 2 was ever sent (Celery 5.5.3's cold shutdown),
    result = app.send_task("lifecycle.ledger_sleep", (str(ledger), 0.1))
    flush_publisher(app)
    assert store.tries.transition(
        result.id,
        1,
        TaskState.QUEUED,
        TaskState.UP_FOR_RETRY,
        state_reason=RETRY_RECONCILED_REASON,
        recovered_at=utcnow(),
    )
    wait_for(
        lambda: (
            (utcnow() - store.tries.history(result.id)[0]["queued_at"]).total_seconds()
            > queued_timeout / 2
        ),
        10,
        what="the message to be old enough to be checked",
    )

    # when a worker takes that message, it runs it, once, and the try ends in success.
    worker = start_worker(
        concurrency=1, env={"CELERY_RECOVERY_QUEUED_TIMEOUT": str(queued_timeout)}
    )
    assert result.get(timeout=20) == 0.1
    assert (count(ledger, "start"), count(ledger, "done")) == (1, 1), ledger_lines(ledger)
    wait_for(
        lambda: _states(store, result.id) == [(1, TaskState.SUCCESS)],
        10,
        what=f"the try's success: {_states(store, result.id)}",
    )
    assert "the retry the result backend read was never sent; run" in worker.log
    with store.transaction() as conn:
        actions = (
            conn.execute(select(audit_log.c.action).where(audit_log.c.task_id == result.id))
            .scalars()
            .all()
        )
    assert actions == ["delivery_run"]
