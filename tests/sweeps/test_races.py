"""Deterministic races around a sweep: every outcome is one compare-and-set winner.

The zombies here are made directly in the store (a job whose heartbeat is
old, a try running in it); the sweep publishes through real Redis.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from celery_recovery import JobState, JobType, TaskState
from celery_recovery.core.records import Transition
from celery_recovery.core.timeutils import utcnow
from celery_recovery.recovery import recovery_for_app
from tests.builders import live_job, make_zombie
from tests.sweeps.helpers import run_concurrently


@pytest.fixture
def recovery(client_app):
    return recovery_for_app(client_app)


def test_late_success_after_the_reset_keeps_the_new_try_and_records_the_outcome(store, recovery):
    make_zombie(store, "t1")
    report = recovery.sweep()
    assert (report.zombies, report.republished) == (1, 1)
    # The "dead" worker was only paused: it now reports its old try's success.
    now = utcnow()
    store.tries.apply_writes(
        [
            ("transition", Transition("t1", 1, (TaskState.RUNNING,), {"state": "success"})),
            ("late", ("t1", 1, "success", now)),
        ]
    )
    first, second = store.tries.history("t1")
    assert first["state"] == TaskState.UP_FOR_RETRY and first["late_state"] == "success"
    assert second["state"] == TaskState.QUEUED and second["late_state"] is None


def test_success_reported_before_the_reset_wins_and_nothing_is_republished(store, recovery):
    make_zombie(store, "t1")
    zombies = store.try_recovery.find_zombies(utcnow(), recovery.settings.zombie_threshold)
    assert [z["task_id"] for z in zombies] == ["t1"]
    # The postrun write lands between the sweep's find and its reset.
    store.tries.transition("t1", 1, TaskState.RUNNING, TaskState.SUCCESS)
    report = recovery.sweep()
    assert report.republished == 0 and report.errors == 0
    assert [t["state"] for t in store.tries.history("t1")] == [TaskState.SUCCESS]
    assert store.outbox.pending_callbacks() == []


def test_two_sweeps_over_the_same_zombies_handle_each_once(store, recovery):
    for i in range(20):
        make_zombie(store, f"t{i}", job_id=f"dead{i % 3}")
    reports = run_concurrently(recovery.sweep)
    assert sum(r.republished for r in reports) == 20, [str(r.as_dict()) for r in reports]
    assert sum(r.errors for r in reports) == 0
    for i in range(20):
        assert [t["state"] for t in store.tries.history(f"t{i}")] == [
            TaskState.UP_FOR_RETRY,
            TaskState.QUEUED,
        ]


def test_heartbeat_arriving_during_the_sweep_is_not_an_error(store, recovery, monkeypatch):
    make_zombie(store, "t1")
    found = store.try_recovery.find_zombies

    def find_then_beat(*args, **kwargs):
        rows = found(*args, **kwargs)
        store.jobs.heartbeat("deadjob", utcnow())  # the paused worker wakes up now
        return rows

    monkeypatch.setattr(store.try_recovery, "find_zombies", find_then_beat)
    monkeypatch.setattr(recovery.context, "store", store)
    report = recovery.sweep()
    assert report.errors == 0 and report.republished == 1
    assert store.jobs.get_job("deadjob")["state"] == JobState.FAILED


def test_a_redelivery_reclaiming_the_try_first_makes_the_reset_lose(store, recovery):
    make_zombie(store, "t1")
    # acks_late: the broker redelivered the message to a live worker, which claimed it.
    assert store.tries.mark_running(
        {
            "task_id": "t1",
            "try_number": 1,
            "task_name": "lifecycle.add",
            "state": "running",
            "job_id": "livejob",
            "started_at": utcnow(),
            "updated_at": utcnow(),
        }
    )
    store.jobs.add_job(
        {
            "id": "livejob",
            "job_type": JobType.WORKER,
            "hostname": "h",
            "pid": 1,
            "state": JobState.RUNNING,
            "start_date": utcnow(),
            "latest_heartbeat": utcnow(),
        }
    )
    report = recovery.sweep()
    assert report.zombies == 0 and report.republished == 0
    assert store.tries.history("t1")[0]["job_id"] == "livejob"


def test_one_bad_row_does_not_stop_the_others(store, recovery):
    make_zombie(store, "good")
    make_zombie(store, "bad", job_id="dead2", task_name="lifecycle.add")
    real = recovery.app.send_task

    def send_task(name, *args, **kwargs):
        if kwargs.get("task_id") == "bad":
            raise RuntimeError("broker refused this one")
        return real(name, *args, **kwargs)

    recovery.app.send_task = send_task
    try:
        report = recovery.sweep()
    finally:
        recovery.app.send_task = real
    assert report.errors == 1 and report.republished == 1
    # The bad one's next try stays queued: the lost-message sweep publishes it later.
    assert [t["state"] for t in store.tries.history("bad")] == [
        TaskState.UP_FOR_RETRY,
        TaskState.QUEUED,
    ]
    assert [t["state"] for t in store.tries.history("good")] == [
        TaskState.UP_FOR_RETRY,
        TaskState.QUEUED,
    ]


def test_store_errors_mid_pass_are_reported_not_raised(recovery, monkeypatch):
    from celery_recovery.core.errors import StoreUnavailableError

    def down(*args, **kwargs):
        raise StoreUnavailableError("store went away")

    monkeypatch.setattr(recovery.store.try_recovery, "find_zombies", down)
    report = recovery.sweep()
    assert report.errors >= 1


def test_zombies_are_probed_in_one_backend_round_trip(store, recovery, monkeypatch):
    ids = [f"bulk-{uuid.uuid4().hex}" for _ in range(5)]
    for i, task_id in enumerate(ids):
        make_zombie(store, task_id, job_id=f"dead{i}")
    recovery.app.backend.store_result(ids[3], 7, "SUCCESS")
    calls = []
    real_mget = recovery.app.backend.mget
    monkeypatch.setattr(
        recovery.app.backend, "mget", lambda keys: calls.append(len(keys)) or real_mget(keys)
    )
    report = recovery.sweep()
    assert calls == [5]
    assert (report.reconciled, report.republished) == (1, 4)
    assert store.tries.history(ids[3])[0]["state"] == TaskState.SUCCESS


@pytest.mark.parametrize("adopter_claims", [False, True])
def test_started_on_a_live_worker_is_adopted_with_a_deadline(store, recovery, adopter_claims):
    task_id = f"adopt-{uuid.uuid4().hex}"
    make_zombie(store, task_id)
    live_job(store)
    # The backend says a live worker started it (maybe a delivery it then dropped).
    recovery.app.backend.store_result(task_id, {"hostname": "w@alive", "pid": 777}, "STARTED")
    report = recovery.sweep()
    assert (report.adopted, report.republished) == (1, 0)
    (adopted,) = store.tries.history(task_id)
    assert adopted["job_id"] == "livejob" and adopted["adopted_until"] is not None
    assert recovery.sweep().adopted == 0  # adopted once, not again
    if adopter_claims:  # the live worker really runs it: its claim confirms the adoption
        store.tries.mark_running(
            {
                "task_id": task_id,
                "try_number": 1,
                "task_name": "lifecycle.add",
                "state": "running",
                "job_id": "livejob",
                "started_at": utcnow(),
                "updated_at": utcnow(),
            }
        )
    later = adopted["adopted_until"] + timedelta(seconds=1)
    store.jobs.heartbeat("livejob", later)  # the adopter stays alive all along
    report = recovery.sweep(now=later)
    if adopter_claims:
        assert (
            report.republished == 0
            and store.tries.history(task_id)[0]["state"] == TaskState.RUNNING
        )
    else:
        assert report.republished == 1
        assert [t["state"] for t in store.tries.history(task_id)] == [
            TaskState.UP_FOR_RETRY,
            TaskState.QUEUED,
        ]
        assert "adoption by job livejob expired" in store.tries.history(task_id)[0]["state_reason"]
    assert store.jobs.get_job("livejob")["state"] == JobState.RUNNING
