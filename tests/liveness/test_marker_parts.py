"""The parts of liveness markers, against real processes and real stores."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import update

from celery_recovery import JobState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.liveness import Verdict
from celery_recovery.liveness.postgres import MarkerHolder
from celery_recovery.liveness.process import check_process, process_marker
from celery_recovery.recovery import recovery_for_app
from celery_recovery.store.schema import jobs
from tests.builders import add_job
from tests.liveness.test_markers import SLOW_THRESHOLD
from tests.services import PG_ADMIN_URL
from tests.sweeps.helpers import run_concurrently
from tests.telemetry.scrape import local
from tests.workers import wait_for


def test_process_marker_tells_a_live_process_from_a_dead_one():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        marker = process_marker(child.pid)
        assert marker is not None
        assert check_process(marker, child.pid) == Verdict.PRESENT
        assert check_process(process_marker(), child.pid) == Verdict.GONE, "another process"
    finally:
        child.kill()
        child.wait()
    assert check_process(marker, child.pid) == Verdict.GONE


def test_process_marker_from_another_host_or_namespace_is_unknown():
    _, _, ticks = process_marker().rpartition("/")
    assert check_process(f"other-boot/pid:[1]/{ticks}", os.getpid()) == Verdict.UNKNOWN
    assert check_process(None, os.getpid()) == Verdict.UNKNOWN


def test_store_notes_a_missing_marker_once_and_fails_a_job_only_if_still_silent(store):
    job_id = add_job(store, "worker", heartbeat_age=10)
    heartbeat = store.jobs.get_job(job_id)["latest_heartbeat"]
    now = utcnow()
    assert (
        run_concurrently(lambda: store.liveness.note_marker_missing(job_id, now)).count(True) == 1
    )
    assert store.jobs.get_job(job_id)["marker_missing_since"] is not None
    assert store.liveness.note_marker_present(job_id) and not store.liveness.note_marker_present(
        job_id
    )

    store.jobs.heartbeat(job_id, now)  # it beat after the sweep read it: not silent any more
    assert not store.liveness.fail_job_if_silent(job_id, heartbeat, now)
    beat = store.jobs.get_job(job_id)["latest_heartbeat"]
    # Two sweeps judging at once: one fails the job, the other loses the race.
    results = run_concurrently(
        lambda: store.liveness.fail_job_if_silent(job_id, beat, now + timedelta(1))
    )
    assert sorted(results) == [False, True]
    assert store.jobs.get_job(job_id)["state"] == "failed"


def test_held_locks_are_read_from_the_store_database(store):
    if store.dialect != "postgresql":
        assert store.liveness.held_marker_locks() == set()
        return
    holder = MarkerHolder(store.url, 0.5, "test")
    assert holder.acquire()
    holder.start()
    try:
        assert holder.key in store.liveness.held_marker_locks()
    finally:
        holder.stop()
    wait_for(lambda: holder.key not in store.liveness.held_marker_locks(), 5, what="release")


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_forked_child_that_exits_leaves_the_parents_lock_held(store):
    holder = MarkerHolder(store.url, 0.5, "fork-test")
    assert holder.acquire()
    holder.start()
    try:
        session = holder.session_pid
        pid = os.fork()
        if pid == 0:  # the child: forget the inherited connection, then exit normally
            holder.forget_in_child()
            import gc

            del holder
            gc.collect()
            os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.3)  # a goodbye on the shared socket would have ended the session
        assert holder.session_pid == session, "the parent's session was never interrupted"
        assert holder.held and holder.key in store.liveness.held_marker_locks()
    finally:
        holder.stop()


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_terminated_marker_session_is_taken_again_at_once(store):
    holder = MarkerHolder(store.url, 5.0, "terminate-test")
    assert holder.acquire()
    holder.start()
    try:
        with psycopg.connect(PG_ADMIN_URL.replace("+psycopg", ""), autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'celery-recovery marker terminate-test'"
            )
        started = time.monotonic()
        wait_for(lambda: not holder.held or time.monotonic() - started > 1, 2)
        # Back well within one interval (5 s): the holder watches its socket.
        wait_for(lambda: holder.held and holder.key in store.liveness.held_marker_locks(), 2)
    finally:
        holder.stop()


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_missing_lock_kills_a_job_only_once_it_missed_a_whole_beat(make_client_app, store_url):
    # The store cut the marker's connection (so the lock is missing, and was seen
    # missing long enough) while the process lives: a beat a moment late is not death.
    app = make_client_app(store_url, **SLOW_THRESHOLD)
    recovery = recovery_for_app(app)
    store = recovery.store
    now = utcnow()
    job_id = add_job(store, "worker", heartbeat_age=0, now=now)
    with store.transaction() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(marker_lock=987_654_321))
    assert store.liveness.note_marker_missing(job_id, now - timedelta(seconds=5))

    found = local("celery_recovery_marker_deaths_total", found_by="sweep", marker="lock")
    recovery.sweep(now=now + timedelta(seconds=1.5))
    assert store.jobs.get_job(job_id)["state"] == JobState.RUNNING
    report = recovery.sweep(now=now + timedelta(seconds=2.5))
    assert store.jobs.get_job(job_id)["state"] == JobState.FAILED
    assert report.marker_deaths == 1
    # Counted as a marker death found by a sweep (the watch counts its own).
    assert local("celery_recovery_marker_deaths_total", found_by="sweep", marker="lock") == (
        found + 1
    )
