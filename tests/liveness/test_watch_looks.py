"""The marker watch's looks at set instants, on a real store, with real processes and locks.

Each test calls :meth:`MarkerWatch.look` with the monotonic time it chooses, so what
the watch has seen, and when, is decided rather than hoped for: a death, a cut lock
taken back, a holder that beat after its lock vanished, two watches at once.
"""

from __future__ import annotations

import os

import psycopg
import pytest
from sqlalchemy import update

from celery_recovery.core.process_id import HOSTNAME
from celery_recovery.core.states import JobState
from celery_recovery.liveness.process import process_marker
from celery_recovery.recovery import recovery_for_app
from celery_recovery.store.schema import jobs
from celery_recovery.sweeps.marker_watch import MarkerWatch
from tests.builders import add_job
from tests.telemetry.scrape import local
from tests.workers import wait_for

pytestmark = pytest.mark.compat

TIMING = {"heartbeat_interval": 5.0, "zombie_threshold": 30.0, "health_check_threshold": 30.0}


def marked_job(store, pid=None, marker=None, lock=None, parent_pid=None) -> str:
    job_id = add_job(store, "worker", hostname=HOSTNAME)
    with store.transaction() as conn:
        conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values(pid=pid or 4242, process_marker=marker, marker_lock=lock, parent_pid=parent_pid)
        )
    return job_id


def state(store, job_id) -> str:
    return store.jobs.get_job(job_id)["state"]


@pytest.fixture
def context(make_client_app, store_url):
    return recovery_for_app(make_client_app(store_url, **TIMING)).context


def hold(store_url: str, key: int) -> psycopg.Connection:
    """An advisory lock on a connection of its own in the store's database, as a process's
    marker holder takes it."""
    conn = psycopg.connect(store_url.replace("+psycopg", ""), autocommit=True)
    (got,) = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
    assert got
    return conn


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
def test_a_gone_process_is_a_death_at_its_first_look_and_two_watches_fail_it_once(
    context, store_url, dead_pid
):
    store = context.store
    dead = marked_job(store, *dead_pid)
    alive = marked_job(store, os.getpid(), process_marker())
    elsewhere = marked_job(store, dead_pid[0], "other-boot/pid:[1]/123")
    first, second = MarkerWatch(context), MarkerWatch(context)
    found = local("celery_recovery_marker_deaths_total", found_by="watch", marker="process")

    # Both looked before either failed it; each fails it only if it is still running.
    assert first.look(at=0.0) + second.look(at=0.0) == 1
    assert local("celery_recovery_marker_deaths_total", found_by="watch", marker="process") == (
        found + 1
    )
    assert state(store, dead) == JobState.FAILED
    assert state(store, alive) == JobState.RUNNING
    assert state(store, elsewhere) == JobState.RUNNING, "another host's process is unknown"


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_dead_pool_process_under_a_live_parent_is_left_to_the_parent(
    context, store_url, dead_pid
):
    store = context.store
    marked_job(store, os.getpid(), process_marker())
    child = marked_job(store, *dead_pid, parent_pid=os.getpid())
    assert MarkerWatch(context).look(at=0.0) == 0
    assert state(store, child) == JobState.RUNNING


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_lock_gone_for_the_confirmation_is_a_death(context, store_url):
    store = context.store
    holder = hold(store_url, 900_001)
    job = marked_job(store, lock=900_001)
    watch = MarkerWatch(context)
    assert watch.look(at=0.0) == 0  # seen held
    holder.close()  # the holder dies: the server frees its lock
    assert watch.look(at=0.5) == 0  # missing: not yet
    assert state(store, job) == JobState.RUNNING
    assert watch.look(at=1.0) == 0
    found = local("celery_recovery_marker_deaths_total", found_by="watch", marker="lock")
    assert watch.look(at=1.6) == 1
    assert state(store, job) == JobState.FAILED
    assert local("celery_recovery_marker_deaths_total", found_by="watch", marker="lock") == (
        found + 1
    )


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_lock_taken_again_or_a_heartbeat_after_it_vanished_is_a_live_holder(context, store_url):
    store = context.store
    cut = hold(store_url, 900_002)
    beating = hold(store_url, 900_003)
    cut_job = marked_job(store, lock=900_002)
    beating_job = marked_job(store, lock=900_003)
    watch = MarkerWatch(context)
    assert watch.look(at=0.0) == 0
    cut.close()
    beating.close()
    assert watch.look(at=0.5) == 0
    # One holder reconnects and takes its key again; the other beats through another
    # connection (its marker connection is still being replaced).
    back = hold(store_url, 900_002)
    assert store.jobs.heartbeat(beating_job, context.clock())
    assert watch.look(at=2.0) == 0
    assert state(store, cut_job) == JobState.RUNNING
    assert state(store, beating_job) == JobState.RUNNING
    back.close()


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_lock_the_watch_never_saw_held_is_left_to_the_heartbeat(context, store_url):
    store = context.store
    job = marked_job(store, lock=900_004)  # recorded, but no session holds it
    watch = MarkerWatch(context)
    for at in (0.0, 0.5, 1.0, 2.0, 5.0):
        assert watch.look(at=at) == 0
    assert state(store, job) == JobState.RUNNING


def test_each_installation_watches_with_its_own_store_and_closing_it_stops_its_watch(
    make_client_app, sqlite_url, tmp_path
):
    # Two apps with celery-recovery in one process (each its own store): two watches.
    first = recovery_for_app(make_client_app(sqlite_url, **TIMING))
    second = recovery_for_app(make_client_app(f"sqlite:///{tmp_path / 'other.sqlite3'}", **TIMING))
    a, b = first.watch_markers(), second.watch_markers()
    assert a is not None and b is not None and a is not b
    assert (a.context, b.context) == (first.context, second.context)
    assert first.watch_markers() is a, "one watch per installation"
    assert a.running and b.running

    first.close()
    wait_for(lambda: not a._thread.is_alive(), 5, what="the closed installation's watch to end")
    assert b.running, "the other installation's watch goes on"
