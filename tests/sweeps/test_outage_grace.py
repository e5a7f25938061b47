"""After a gap in sweeping (a store outage), live processes get to beat before anyone is judged."""

from __future__ import annotations

from datetime import timedelta

from celery_recovery import TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.recovery import recovery_for_app
from celery_recovery.sweeps.runner import SWEEP_COMPLETION
from tests.builders import make_zombie
from tests.conftest import FAST_SETTINGS
from tests.workers import wait_for


def test_after_a_gap_only_processes_still_silent_after_the_grace_are_dead(client_app, store):
    recovery = recovery_for_app(client_app)
    # The store was down for ten minutes: no sweep finished, nobody could beat.
    store.checkins.mark_completed(SWEEP_COMPLETION, utcnow() - timedelta(minutes=10))
    make_zombie(store, "survivor-task", job_id="survivor", age=600)
    make_zombie(store, "dead-task", job_id="dead", age=600)

    first = recovery.sweep()
    assert first.heartbeat_grace == 2 * FAST_SETTINGS["heartbeat_interval"]
    assert first.zombies == 0 and first.dead_jobs == 0
    # The surviving worker reaches the store again and beats; the dead one never will.
    assert store.jobs.heartbeat("survivor", utcnow())

    def after_grace():
        store.jobs.heartbeat("survivor", utcnow())  # it keeps beating, as a live worker does
        report = recovery.sweep()
        return report if report.heartbeat_grace == 0 else None

    report = wait_for(after_grace, 10, interval=0.2, what="the end of the grace")
    assert report.zombies == 1
    assert [t["state"] for t in store.tries.history("survivor-task")] == [TaskState.RUNNING]
    assert store.tries.history("dead-task")[0]["state"] in (
        TaskState.UP_FOR_RETRY,
        TaskState.FAILED,
    )


def test_regular_sweeps_start_no_grace(client_app, store):
    recovery = recovery_for_app(client_app)
    recovery.sweep()
    make_zombie(store, "dead-task", job_id="dead", age=600)
    report = recovery.sweep()
    assert report.heartbeat_grace == 0 and report.zombies == 1
