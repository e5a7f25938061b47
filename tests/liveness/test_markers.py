"""A dead process is found by its liveness marker long before the zombie threshold;
a paused or cut-off one is still judged by the threshold.

The zombie threshold is 30 s here and heartbeats come every second, so a
recovery within a few seconds can only come from a marker.
"""

from __future__ import annotations

import os
import signal
import time

import psycopg
import pytest

from celery_recovery import JobState, TaskState
from celery_recovery.recovery import recovery_for_app
from tests.services import PG_ADMIN_URL
from tests.sweeps.helpers import running_try, succeeded_tries, sweep_until, try_started
from tests.workers import wait_for

pytestmark = pytest.mark.slow

#: Heartbeat every second, zombie threshold 30 s: only a marker can be fast.
SLOW_THRESHOLD = {
    "heartbeat_interval": 1.0,
    "zombie_threshold": 30.0,
    "health_check_threshold": 30.0,
    "sweep_interval": 1.0,
}
SLOW_ENV = {f"CELERY_RECOVERY_{k.upper()}": str(v) for k, v in SLOW_THRESHOLD.items()}
#: One sweep interval plus one heartbeat interval, plus the lock's confirmation and slack
#: for a loaded machine.
FAST_BOUND = 1.0 + 1.0 + 2.0 + 4.0


def admin():
    return psycopg.connect(PG_ADMIN_URL.replace("+psycopg", ""), autocommit=True)


def marker_sessions(conn, label: str) -> list[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s",
        (f"celery-recovery marker {label}%",),
    )
    return [pid for (pid,) in rows]


def forget_process_markers(store, job_ids) -> None:
    """Make the jobs look as they do to a sweep on another host: only the lock is left."""
    from sqlalchemy import update

    from celery_recovery.store.schema import jobs

    with store.transaction() as conn:
        conn.execute(update(jobs).where(jobs.c.id.in_(job_ids)).values(process_marker=None))


def kill_and_recover(client_app, store, worker, result, first) -> float:
    """SIGKILL the worker running try 1 of ``result``; seconds until try 2 started elsewhere."""
    worker.kill()
    killed = time.monotonic()
    sweep_until(client_app, lambda: try_started(store, result.id, 2), 25, "try 2 to start")
    recovered_after = time.monotonic() - killed
    assert result.get(timeout=30) == 2
    assert store.jobs.get_job(first["job_id"])["state"] == JobState.FAILED
    tries = succeeded_tries(store, result.id)
    assert [(t["try_number"], t["state"]) for t in tries] == [
        (1, TaskState.UP_FOR_RETRY),
        (2, TaskState.SUCCESS),
    ]
    return recovered_after


def start_long_task(client_app, store):
    """A task long on its first try (the one the test kills); that running try."""
    result = client_app.send_task("lifecycle.slow_first_try", (60, 0.2))
    return result, running_try(store, result.id)


# The lock's own test below runs on PostgreSQL; here the process marker, on any store.
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_killed_worker_is_recovered_by_its_process_marker(
    make_client_app, store_url, store, start_worker, tmp_path
):
    client_app = make_client_app(store_url, **SLOW_THRESHOLD)
    doomed = start_worker(name="doomed", concurrency=1, env=SLOW_ENV)
    result, first = start_long_task(client_app, store)
    start_worker(name="survivor", concurrency=1, env=SLOW_ENV)
    recovered_after = kill_and_recover(client_app, store, doomed, result, first)
    assert recovered_after < FAST_BOUND, recovered_after


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_killed_worker_is_recovered_by_its_lock_and_a_cut_lock_is_taken_again(
    make_client_app, store_url, store, start_worker, tmp_path
):
    client_app = make_client_app(store_url, **SLOW_THRESHOLD)
    doomed = start_worker(name="doomed", concurrency=2, env=SLOW_ENV)
    with admin() as conn:
        # One marker connection for the whole worker, shared by its pool processes.
        label = f"worker {doomed.node}@"
        sessions = wait_for(lambda: marker_sessions(conn, label), 10, what="its marker session")
        assert len(sessions) == 1, sessions
        # The main process (it reserves messages) and its two pool processes.
        worker_jobs = wait_for(
            lambda: len(store.jobs.list_jobs("worker")) == 3 and store.jobs.list_jobs()
        )
        keys = {job["marker_lock"] for job in worker_jobs}
        assert len(keys) == 1 and None not in keys, worker_jobs
        (key,) = keys
        forget_process_markers(store, [job["id"] for job in worker_jobs])

        # The store cuts the marker's connection, again and again, while the process
        # lives and beats through its other connections: never a death.
        deadline, cuts = time.monotonic() + 4, 0
        while time.monotonic() < deadline:
            cuts += len(
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name LIKE %s",
                    (f"celery-recovery marker {label}%",),
                ).fetchall()
            )
            recovery_for_app(client_app).sweep()
            time.sleep(0.3)
        assert cuts >= 2, "the marker's connection was not cut again after it came back"
        assert {j["state"] for j in store.jobs.list_jobs("worker")} == {JobState.RUNNING}
        # Taken again at once on a new connection.
        wait_for(
            lambda: key in store.liveness.held_marker_locks(),
            5,
            what="the marker lock to be taken again",
        )
        result, first = start_long_task(client_app, store)
        start_worker(name="survivor", concurrency=1, env=SLOW_ENV)
        recovered_after = kill_and_recover(client_app, store, doomed, result, first)
    assert recovered_after < FAST_BOUND, recovered_after


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
def test_paused_worker_keeps_its_markers_and_is_judged_by_the_threshold(
    make_client_app, store_url, store, start_worker, tmp_path
):
    settings = {**SLOW_THRESHOLD, "zombie_threshold": 6.0, "health_check_threshold": 6.0}
    env = {f"CELERY_RECOVERY_{k.upper()}": str(v) for k, v in settings.items()}
    client_app = make_client_app(store_url, **settings)
    paused = start_worker(name="paused", concurrency=1, env=env)
    result, first = start_long_task(client_app, store)
    if store.dialect == "postgresql":
        forget_process_markers(store, [first["job_id"]])  # the lock alone must hold
    os.killpg(paused.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        recovery = recovery_for_app(client_app)
        while time.monotonic() - stopped < 4.5:
            report = recovery.sweep()
            assert report.marker_deaths == 0 and report.dead_jobs == 0, report
            assert store.jobs.get_job(first["job_id"])["state"] == JobState.RUNNING
            time.sleep(0.25)
        assert store.tries.history(result.id)[0]["state"] == TaskState.RUNNING
    finally:
        os.killpg(paused.proc.pid, signal.SIGCONT)
