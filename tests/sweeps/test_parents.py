"""The race of the sweep and a dead pool process's live parent, at set instants.

A pool process (a real process, killed) ran a try; its parent (this test
process, alive) has not recorded the death yet.  Each test sweeps "as of" a
chosen moment, so which of the two acts first is decided, not hoped for.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from celery_recovery import TaskState
from celery_recovery.core.process_id import HOSTNAME
from celery_recovery.core.states import JobState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.liveness.process import process_marker
from celery_recovery.recovery import recovery_for_app
from celery_recovery.store.schema import jobs
from celery_recovery.sweeps.parents import PARENT_VERDICT_GRACE
from tests.builders import add_job, add_try

pytestmark = pytest.mark.compat

#: Heartbeats a second apart: the pool process is late (and gone) 1 s after its last beat.
TIMING = {"heartbeat_interval": 1.0, "zombie_threshold": 3.0, "health_check_threshold": 3.0}


def _job(store, now, pid, marker, heartbeat_age, parent_pid=None) -> str:
    job_id = add_job(store, "worker", heartbeat_age=heartbeat_age, hostname=HOSTNAME, now=now)
    with store.transaction() as conn:
        conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values(pid=pid, process_marker=marker, parent_pid=parent_pid)
        )
    return job_id


@pytest.fixture
def world(make_client_app, store_url, dead_pid):
    """A running try on a dead pool process whose parent is this (live) process."""
    app = make_client_app(store_url, **TIMING)
    store = recovery_for_app(app).store
    now = utcnow()
    parent = _job(store, now, *_this_process(), heartbeat_age=0)
    child = _job(store, now, *dead_pid, heartbeat_age=0, parent_pid=_this_process()[0])
    task_id = add_try(store, "running", job_id=child, task_name="lifecycle.add", now=now)
    return app, store, now, parent, child, task_id


def _this_process() -> tuple[int, str]:
    import os

    marker = process_marker()
    assert marker is not None
    return os.getpid(), marker


def _beat(store, job_id, at) -> None:
    assert store.jobs.heartbeat(job_id, at)


def _state(store, task_id) -> list[tuple[int, str]]:
    return [(t["try_number"], t["state"]) for t in store.tries.history(task_id)]


def test_a_dead_pool_process_is_left_to_its_live_parent_which_records_it_first(world):
    app, store, now, parent, child, task_id = world
    recovery = recovery_for_app(app)
    # 1.5 s after the child's last beat: late and gone, the sweep's usual verdict.
    at = now + timedelta(seconds=1.5)
    _beat(store, parent, at)
    recovery.sweep(now=at)
    assert store.jobs.get_job(child)["state"] == JobState.RUNNING
    assert _state(store, task_id) == [(1, TaskState.RUNNING)]

    # The parent records Celery's verdict (as worker_lost does), then sweeps go on.
    assert store.tries.transition(task_id, 1, TaskState.RUNNING, TaskState.FAILED)
    for seconds in (2.5, 3.5, 5.0, 8.0):
        at = now + timedelta(seconds=seconds)
        _beat(store, parent, at)
        recovery.sweep(now=at)
    assert _state(store, task_id) == [(1, TaskState.FAILED)]  # never run again
    assert store.jobs.get_job(child)["state"] == JobState.FAILED  # the job is still judged


def test_a_silent_pool_process_running_a_try_is_not_ended_by_the_dead_jobs_step(world):
    # Past the zombie threshold, within the parent's grace: the zombie step waits for the
    # parent, so the dead-jobs step must not end the job under it (its try would then be
    # a dead job's zombie, run again without asking: seen with a worker cut off from the
    # store, whose main process had beaten later than its pool process).
    app, store, now, parent, child, task_id = world
    at = now + timedelta(seconds=TIMING["zombie_threshold"] + 0.5)
    _beat(store, parent, at)
    report = recovery_for_app(app).sweep(now=at)
    assert report.dead_jobs == 0, report
    assert store.jobs.get_job(child)["state"] == JobState.RUNNING
    assert _state(store, task_id) == [(1, TaskState.RUNNING)]


def test_a_parent_whose_heartbeat_is_only_late_is_still_waited_for(world):
    # A loaded host: the parent's heartbeat is two and a half intervals old, short of the
    # zombie threshold, while it is about to record its pool process's death.
    app, store, now, parent, _child, task_id = world
    at = now + timedelta(seconds=2.5)
    with store.transaction() as conn:
        conn.execute(update(jobs).where(jobs.c.id == parent).values(latest_heartbeat=now))
    recovery_for_app(app).sweep(now=at)
    assert _state(store, task_id) == [(1, TaskState.RUNNING)]
    # It records Celery's verdict: the try is never run again.
    assert store.tries.transition(task_id, 1, TaskState.RUNNING, TaskState.FAILED)
    later = now + timedelta(seconds=TIMING["zombie_threshold"] + PARENT_VERDICT_GRACE + 1)
    _beat(store, parent, later)
    recovery_for_app(app).sweep(now=later)
    assert _state(store, task_id) == [(1, TaskState.FAILED)]


def test_the_sweep_acts_once_the_parents_grace_is_over(world):
    # The parent lives but never records the death (its store writes failed).
    app, store, now, parent, child, task_id = world
    recovery = recovery_for_app(app)
    before = now + timedelta(seconds=1 + PARENT_VERDICT_GRACE - 0.5)
    _beat(store, parent, before)
    recovery.sweep(now=before)
    assert _state(store, task_id) == [(1, TaskState.RUNNING)]
    after = now + timedelta(seconds=TIMING["zombie_threshold"] + PARENT_VERDICT_GRACE + 0.5)
    _beat(store, parent, after)
    recovery.sweep(now=after)
    assert store.jobs.get_job(child)["state"] == JobState.FAILED
    assert _state(store, task_id) == [(1, TaskState.UP_FOR_RETRY), (2, TaskState.QUEUED)]


@pytest.mark.parametrize("parent_is", ["silent", "gone", "unknown"])
def test_the_sweep_acts_at_once_when_the_parent_cannot_record(world, dead_pid, parent_is):
    app, store, now, parent, child, task_id = world
    at = now + timedelta(seconds=1.5)
    if parent_is == "silent":  # paused or cut off: silent past the zombie threshold
        silent = TIMING["zombie_threshold"] + 0.5
        with store.transaction() as conn:
            conn.execute(
                update(jobs)
                .where(jobs.c.id == parent)
                .values(latest_heartbeat=at - timedelta(seconds=silent))
            )
    elif parent_is == "gone":  # killed with its pool process
        pid, marker = dead_pid
        with store.transaction() as conn:
            conn.execute(
                update(jobs).where(jobs.c.id == parent).values(pid=pid, process_marker=marker)
            )
        with store.transaction() as conn:
            conn.execute(update(jobs).where(jobs.c.id == child).values(parent_pid=pid))
    else:  # the child names a parent that is no job of this host
        _beat(store, parent, at)
        with store.transaction() as conn:
            conn.execute(update(jobs).where(jobs.c.id == child).values(parent_pid=1))
    recovery_for_app(app).sweep(now=at)
    assert store.jobs.get_job(child)["state"] == JobState.FAILED
    assert _state(store, task_id) == [(1, TaskState.UP_FOR_RETRY), (2, TaskState.QUEUED)]
