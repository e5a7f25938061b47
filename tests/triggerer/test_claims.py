"""Store-level races of the triggerer: claims, firing and finishing are each decided once."""

from __future__ import annotations

from datetime import timedelta

import pytest

from celery_recovery.core.states import JobState, JobType, TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.store import FAILURE, RESUME, SUCCESS, Finish, Firing
from tests.builders import job_row
from tests.sweeps.helpers import run_concurrently


def _job(store, job_id: str, age: float = 0.0, state: JobState = JobState.RUNNING) -> str:
    beat = utcnow() - timedelta(seconds=age)
    store.jobs.add_job(job_row(job_id, beat, job_type=JobType.TRIGGERER, state=state))
    return job_id


def _deferred(store, n: int, queue: str = "default") -> list[str]:
    now = utcnow()
    ids = []
    for i in range(n):
        task_id = f"t-{queue}-{i}"
        record = {
            "task_id": task_id,
            "try_number": 1,
            "task_name": "x",
            "state": TaskState.RUNNING,
            "updated_at": now,
            "external_executor_id": task_id,
            "headers": {"custom": 1},
        }
        trigger = {"classpath": "m.T", "kwargs": {}, "queue": queue, "created_at": now}
        assert store.triggers.defer_try(record, trigger, now) == (True, None)
        ids.append(task_id)
    return ids


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql", "pgbouncer"], indirect=True)
def test_two_triggerers_claiming_at_once_never_share_a_trigger(store):
    _deferred(store, 150)
    a, b = _job(store, "a" * 32), _job(store, "b" * 32)
    claims = iter([a, b])
    results = run_concurrently(
        lambda: store.triggers.claim_triggers(next(claims), None, 100, utcnow(), 30), 2
    )
    first, second = ({t["id"] for t in r} for r in results)
    assert not first & second
    assert len(first | second) == 150
    assert sorted(len(r) for r in results) == [50, 100]


def test_only_unassigned_triggers_and_those_of_dead_triggerers_are_claimed(store):
    _deferred(store, 3, "q")
    live, dead, ended = (
        _job(store, "l" * 32),
        _job(store, "d" * 32, age=60),
        _job(store, "e" * 32, state=JobState.SUCCESS),
    )
    [t1, t2, t3] = store.triggers.list_triggers()
    store.triggers.take_triggers([t1["id"]], live, None)
    store.triggers.take_triggers([t2["id"]], dead, None)
    store.triggers.take_triggers([t3["id"]], ended, None)
    me = _job(store, "m" * 32)
    claimed = {t["id"] for t in store.triggers.claim_triggers(me, ["q"], 10, utcnow(), 30)}
    assert claimed == {t2["id"], t3["id"]}
    assert store.triggers.claim_triggers(me, ["other"], 10, utcnow(), 30) == []


def test_an_event_is_decided_once_and_only_by_the_holder(store):
    _deferred(store, 2)
    me, other = _job(store, "m" * 32), _job(store, "o" * 32)
    [t1, t2] = store.triggers.claim_triggers(me, None, 10, utcnow(), 30)
    now = utcnow()
    header = ("recovery_resume", {"method": "m", "kwargs": {}, "event": 1})
    decided, publish = store.triggers.fire_triggers(
        me, [Firing(t1["id"], t1["task_id"], 1, RESUME, {"n": 1}, header)], now
    )
    assert decided == {t1["id"]: (RESUME, {"n": 1})}
    [record] = store.tries.history(t1["task_id"])
    assert record["state"] == TaskState.QUEUED
    assert record["headers"] == {"custom": 1, "recovery_resume": header[1]}
    assert publish[t1["id"]]["task_id"] == t1["task_id"]
    # Firing again (a retry after a store error) keeps the first event.
    again, _ = store.triggers.fire_triggers(
        me, [Firing(t1["id"], t1["task_id"], 1, FAILURE, "x")], now
    )
    assert again == {t1["id"]: (RESUME, {"n": 1})}
    # A triggerer that does not hold the row decides nothing.
    assert store.triggers.fire_triggers(
        other, [Firing(t2["id"], t2["task_id"], 1, SUCCESS, 2)], now
    ) == (
        {},
        {},
    )


def test_finishing_is_a_compare_and_set_and_writes_one_failure_callback(store):
    [ok_task, failed_task, revoked_task] = _deferred(store, 3)
    me = _job(store, "m" * 32)
    rows = {t["task_id"]: t for t in store.triggers.claim_triggers(me, None, 10, utcnow(), 30)}
    assert store.tries.transition(revoked_task, 1, TaskState.DEFERRED, TaskState.REVOKED)
    finishes = [
        Finish(rows[ok_task]["id"], ok_task, 1, SUCCESS, "completed by its trigger"),
        Finish(rows[failed_task]["id"], failed_task, 1, FAILURE, "failed", "boom", "E"),
        Finish(rows[revoked_task]["id"], revoked_task, 1, FAILURE, "failed", "late", "E"),
    ]
    assert store.triggers.finish_triggers(me, finishes, utcnow()) == 2
    assert store.triggers.finish_triggers(me, finishes, utcnow()) == 0
    states = {t: store.tries.history(t)[0]["state"] for t in (ok_task, failed_task, revoked_task)}
    assert states == {ok_task: "success", failed_task: "failed", revoked_task: "revoked"}
    [callback] = store.outbox.pending_callbacks()
    assert callback["task_id"] == failed_task
    assert callback["payload"]["exception"] == "E" and callback["payload"]["reason"] == "boom"
    assert store.triggers.list_triggers() == []


def test_a_try_that_is_not_running_cannot_be_deferred(store):
    [task_id] = _deferred(store, 1)
    now = utcnow()
    record = {"task_id": task_id, "try_number": 1, "task_name": "x", "updated_at": now}
    trigger = {"classpath": "m.T", "kwargs": {}, "queue": "default", "created_at": now}
    assert store.triggers.defer_try(record, trigger, now) == (False, "deferred")
    assert len(store.triggers.list_triggers()) == 1
