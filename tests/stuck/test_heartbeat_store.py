"""Task heartbeats in the store (SQLite and PostgreSQL): the fence between a stale try
and the try that replaced it, as a deterministic race."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from celery_recovery.core.records import ResetPlan
from celery_recovery.core.states import TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.store import EncodedJSON
from celery_recovery.store.schema import task_heartbeats
from tests.builders import add_job, add_try
from tests.cli.helpers import run, run_json
from tests.sweeps.helpers import run_concurrently
from tests.web.helpers import console_client


def _details(text: str) -> EncodedJSON:
    return EncodedJSON(f'{{"at": "{text}"}}')


def _give_up(store, task_id: str) -> bool:
    """What a hung-try or zombie reset does: try 1 up_for_retry, try 2 queued, one commit."""
    now = utcnow()
    plan = ResetPlan(
        task_id=task_id,
        try_number=1,
        expected_state=TaskState.RUNNING,
        expected_job_id="job-1",
        new_state=TaskState.UP_FOR_RETRY,
        reason="hung: no heartbeat for 3 s; retried as try 2",
        next_record={
            "task_id": task_id,
            "try_number": 2,
            "task_name": "shop.import",
            "state": TaskState.QUEUED.value,
            "queued_at": now,
            "updated_at": now,
        },
    )
    won, _ = store.try_recovery.apply_reset(plan, now)
    return won


def test_a_beat_is_written_for_a_running_try_and_read_by_the_next(store):
    task_id = add_try(store, "running", job_id="job-1", task_name="shop.import")
    assert store.task_heartbeats.beat(task_id, 1, utcnow(), _details("step 3")) is True
    assert (
        store.task_heartbeats.beat(task_id, 1, utcnow(), None) is True
    )  # a beat keeps the details
    assert store.task_heartbeats.last_details(task_id, 2) == {"at": "step 3"}
    assert store.task_heartbeats.last_details("unknown", 2) is None


def test_a_try_without_a_record_yet_is_not_refused_but_nothing_is_written(store):
    assert store.task_heartbeats.beat("not-claimed-yet", 1, utcnow(), _details("x")) is None
    assert store.task_heartbeats.last_details("not-claimed-yet", 1) is None


def test_a_stale_try_is_refused_once_a_later_try_replaced_it(store):
    task_id = add_try(store, "running", job_id="job-1", task_name="shop.import")
    store.task_heartbeats.beat(task_id, 1, utcnow(), _details("step 3"))
    assert _give_up(store, task_id)
    # The given-up try wakes up and beats: refused, and its details are not taken
    assert store.task_heartbeats.beat(task_id, 1, utcnow(), _details("step 4")) is False
    assert store.task_heartbeats.last_details(task_id, 2) == {"at": "step 3"}


def test_a_beat_racing_the_reset_either_lands_before_it_or_is_refused(store):
    # Given a running try that beat once, When its late beat and its reset run at the
    # same instant, many times: Then the next try reads the late details exactly when
    # the late beat was accepted (two tries never both own the progress)
    for round_number in range(15):
        task_id = add_try(store, "running", job_id="job-1", task_name="shop.import")
        store.task_heartbeats.beat(task_id, 1, utcnow(), _details("early"))
        outcomes: dict[str, object] = {}
        roles = ["beat", "reset"]
        lock = threading.Lock()

        def race(task_id=task_id, outcomes=outcomes, roles=roles, lock=lock):
            with lock:
                role = roles.pop()
            if role == "reset":
                outcomes[role] = _give_up(store, task_id)
            else:
                outcomes[role] = store.task_heartbeats.beat(task_id, 1, utcnow(), _details("late"))

        run_concurrently(race)
        assert outcomes["reset"] is True, round_number
        read = store.task_heartbeats.last_details(task_id, 2)
        assert read == ({"at": "late"} if outcomes["beat"] else {"at": "early"}), outcomes
        assert store.task_heartbeats.beat(task_id, 1, utcnow(), _details("later")) is False


def test_inspect_tasks_shows_a_running_trys_last_beat_and_details(store):
    task_id = add_try(store, "running", job_id="job-1", task_name="shop.import")
    add_try(store, "running", job_id="job-1", task_name="shop.quiet")
    store.task_heartbeats.beat(task_id, 1, utcnow(), _details("step 3"))

    rows = {r["task_id"]: r for r in run_json(store.url, "inspect", "tasks")}
    beating = rows[task_id]
    assert beating["beat_details"] == {"at": "step 3"} and 0 <= beating["beat_age"] < 60
    quiet = next(r for r in rows.values() if r["task_name"] == "shop.quiet")
    assert quiet["last_beat"] is None and quiet["beat_details"] is None
    assert "LAST BEAT" in run(store.url, "inspect", "tasks").output


def test_db_clean_keeps_the_beats_a_task_may_still_resume_from(store):
    old = utcnow() - timedelta(days=40)
    finished = add_try(store, "failed", job_id="job-1", task_name="shop.import")
    retried = add_try(store, "running", job_id="job-1", task_name="shop.import")
    with store.transaction() as conn:  # both beat 40 days ago (one try then failed)
        for task_id in (finished, retried):
            conn.execute(
                task_heartbeats.insert().values(
                    task_id=task_id, try_number=1, beat_at=old, details=_details("old")
                )
            )

    result = run(store.url, "db", "clean", "--before", "30d", "--yes")

    assert result.exit_code == 0, result.output
    assert "task_heartbeats 0" not in result.output
    assert store.task_heartbeats.of_task(finished) == []
    assert store.task_heartbeats.last_details(retried, 2) == {"at": "old"}


@pytest.mark.parametrize("show_args", [False, True])
def test_the_consoles_task_page_shows_each_trys_last_beat(store, show_args):
    task_id = add_try(store, "running", job_id="job-1", task_name="shop.import")
    store.task_heartbeats.beat(task_id, 1, utcnow(), _details("step 3"))

    with console_client(store.url, show_args=show_args) as client:
        beat = client.get(f"/api/tasks/{task_id}").json()["tries"][0]["heartbeat"]
        page = client.get(f"/tasks/{task_id}").text

    assert beat["beat_at"]
    # The details are the task's data: hidden like its arguments unless asked for
    if show_args:
        assert beat["details"] == {"at": "step 3"} and "step 3" in page
    else:
        assert beat["details"].startswith("hidden") and "step 3" not in page
    assert "last heartbeat" in page


def test_the_consoles_jobs_page_shows_a_stalled_worker(store):
    job_id = add_job(store, hostname="pod-3")
    reason = "3 ready messages in its queues, 2 free slots, nothing received for 10s"
    store.jobs.heartbeat(job_id, utcnow(), {"stalled": True, "stalled_reason": reason})
    healthy = add_job(store, hostname="pod-4")
    store.jobs.heartbeat(healthy, utcnow(), {"stalled": False, "stalled_reason": None})

    with console_client(store.url) as client:
        rows = {r["id"]: r for r in client.get("/api/jobs").json()["rows"]}
        page = client.get("/jobs").text

    assert rows[job_id]["consumer"]["stalled_reason"] == reason
    assert "stalled" in page and reason in page and "consuming" in page


def test_jobs_check_fails_for_a_live_worker_that_says_it_is_stalled(store):
    reason = "broker connection down for 12s"
    main = add_job(store, hostname="pod-3")
    add_job(store, hostname="pod-3")  # a pool process: no consumer of its own
    store.jobs.heartbeat(main, utcnow(), {"stalled": True, "stalled_reason": reason})

    stalled = run(store.url, "jobs", "check", "--job-type", "worker", "--hostname", "celery@pod-3")
    assert stalled.exit_code == 1
    assert stalled.output.startswith(f"FAIL: stalled: {reason}: worker celery@pod-3 (job {main}")

    # Once it consumes again, it passes
    store.jobs.heartbeat(main, utcnow(), {"stalled": False, "stalled_reason": None})
    ok = run(store.url, "jobs", "check", "--job-type", "worker", "--hostname", "celery@pod-3")
    assert ok.exit_code == 0, ok.output
