"""Reservations in the store: which dead job's queued tries the reserved sweep may publish."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from celery_recovery import JobState, JobType, TaskState
from celery_recovery.core.records import Transition
from celery_recovery.core.timeutils import utcnow
from celery_recovery.store import RESUME, Firing
from celery_recovery.store.schema import reservations
from tests.builders import job_row

THRESHOLD = 3.0


def add_job(store, job_id: str, heartbeat_age: float, state: JobState = JobState.RUNNING) -> None:
    beat = utcnow() - timedelta(seconds=heartbeat_age)
    store.jobs.add_job(job_row(job_id, beat, node_name="w@h", state=state))


def queue_try(store, task_id: str, try_number: int = 1) -> None:
    now = utcnow()
    store.tries.apply_writes(
        [
            (
                "queued",
                {
                    "task_id": task_id,
                    "try_number": try_number,
                    "task_name": "lifecycle.add",
                    "state": "queued",
                    "queued_at": now,
                    "updated_at": now,
                },
            )
        ]
    )


def found(store) -> set[str]:
    return {
        r["task_id"] for r in store.reservations.find_reserved_by_dead_jobs(utcnow(), THRESHOLD)
    }


def test_only_unstarted_tries_of_dead_jobs_are_found(store):
    add_job(store, "live", 0.0)
    add_job(store, "stale", 10.0)
    add_job(store, "failed", 0.0, JobState.FAILED)
    add_job(store, "ended", 10.0, JobState.SUCCESS)  # a warm shutdown hands messages back
    for task_id in ("on-live", "on-stale", "on-failed", "on-ended", "started", "unpublished"):
        if task_id != "unpublished":
            queue_try(store, task_id)
    now = utcnow()
    store.tries.apply_writes(
        [
            ("reserved", ("on-live", 1, "live", now)),
            ("reserved", ("on-stale", 1, "stale", now - timedelta(seconds=10))),
            ("reserved", ("on-failed", 1, "failed", now)),
            ("reserved", ("on-ended", 1, "ended", now - timedelta(seconds=10))),
            ("reserved", ("started", 1, "stale", now - timedelta(seconds=10))),
            ("reserved", ("unpublished", 1, "stale", now - timedelta(seconds=10))),
        ]
    )
    store.tries.mark_running(
        {
            "task_id": "started",
            "try_number": 1,
            "task_name": "lifecycle.add",
            "state": "running",
            "updated_at": now,
        }
    )
    assert found(store) == {"on-stale", "on-failed"}


def test_a_redelivery_moves_the_reservation_to_the_live_job(store):
    add_job(store, "dead", 10.0)
    add_job(store, "live", 0.0)
    queue_try(store, "t1")
    now = utcnow()
    store.tries.apply_writes([("reserved", ("t1", 1, "dead", now - timedelta(seconds=10)))])
    assert found(store) == {"t1"}
    store.tries.apply_writes([("reserved", ("t1", 1, "live", now))])
    assert found(store) == set()


def test_receptions_after_the_job_could_be_judged_dead_are_not_its_own(store):
    # Judged dead while paused, the process takes messages before it notices and
    # carries on as a new job: those it keeps and runs itself.
    add_job(store, "paused", 0.0, JobState.FAILED)
    queue_try(store, "before")
    queue_try(store, "after")
    now = utcnow()
    store.tries.apply_writes(
        [
            ("reserved", ("before", 1, "paused", now)),
            ("reserved", ("after", 1, "paused", now + timedelta(seconds=THRESHOLD + 1))),
        ]
    )
    assert found(store) == {"before"}


def test_a_reservation_superseded_by_the_same_batchs_claim_is_not_written(store):
    queue_try(store, "t1")
    now = utcnow()
    claim = {
        "task_id": "t1",
        "try_number": 1,
        "task_name": "lifecycle.add",
        "state": "running",
        "job_id": "solo",
        "updated_at": now,
    }
    store.tries.apply_writes([("reserved", ("t1", 1, "solo", now)), ("running", claim)])
    with store.transaction() as conn:
        assert conn.execute(select(reservations)).all() == []
    assert store.tries.history("t1")[0]["state"] == "running"


def test_a_try_held_by_a_live_worker_is_never_lost_one_held_by_a_dead_one_is(store):
    # A prefetched message waits behind long tasks in a live worker: not lost, however old.
    add_job(store, "live", 0.0)
    add_job(store, "stale", 10.0)
    for task_id in ("held-by-live", "held-by-stale", "held-by-nobody"):
        queue_try(store, task_id)
    now = utcnow()
    store.tries.apply_writes(
        [
            ("reserved", ("held-by-live", 1, "live", now)),
            ("reserved", ("held-by-stale", 1, "stale", now - timedelta(seconds=10))),
        ]
    )
    later = now + timedelta(seconds=3600)  # far past any queued timeout
    lost = {
        r["task_id"]
        for r in store.try_recovery.find_lost(later, 600, live_threshold=3600 + THRESHOLD)
    }
    assert lost == {"held-by-stale", "held-by-nobody"}


def started_and_waiting_in_live_worker(store, started: str, waiting: str):
    """Two tries a live worker received; it started the first.  The time it did."""
    add_job(store, "live", 0.0)
    queue_try(store, started)
    queue_try(store, waiting)
    now = utcnow()
    store.tries.apply_writes(
        [("reserved", (started, 1, "live", now)), ("reserved", (waiting, 1, "live", now))]
    )
    claim = {"task_id": started, "try_number": 1, "task_name": "lifecycle.add"}
    assert store.tries.mark_running(
        {**claim, "state": "running", "job_id": "live", "updated_at": now}
    )
    return now


def test_a_try_sent_back_to_the_queue_is_no_longer_held_by_its_live_reserver(store):
    # A live worker reserved the message, started it, then handed it back (a postponed
    # duplicate of a held idempotency key, or Reject(requeue=True)).  Whoever receives
    # the new message may die before recording it: the lost-message sweep must then
    # find the try, not take it for one the first worker still holds.
    now = started_and_waiting_in_live_worker(store, "postponed", "prefetched")
    assert store.tries.transition(
        "postponed", 1, TaskState.RUNNING, TaskState.QUEUED, queued_at=now, updated_at=now
    )
    later = now + timedelta(seconds=3600)
    lost = {
        r["task_id"]
        for r in store.try_recovery.find_lost(later, 600, live_threshold=3600 + THRESHOLD)
    }
    assert lost == {"postponed"}


def test_a_batched_requeue_drops_the_reservation_only_when_it_wins(store):
    now = started_and_waiting_in_live_worker(store, "requeued", "still-queued")
    back = {"state": TaskState.QUEUED, "queued_at": now, "updated_at": now}
    store.tries.apply_writes(
        [
            ("transition", Transition("requeued", 1, (TaskState.RUNNING,), back)),
            # Not running: this requeue loses, and the live worker keeps its reservation.
            ("transition", Transition("still-queued", 1, (TaskState.RUNNING,), back)),
        ]
    )
    with store.transaction() as conn:
        held = {r.task_id for r in conn.execute(select(reservations))}
    assert held == {"still-queued"}


def test_a_resumed_try_is_no_longer_held_by_the_live_worker_that_reserved_it_before(store):
    # A live worker reserved the first delivery and started it; the try deferred, and a
    # redundant copy was reserved (and dropped) while it waited.  The resume message is
    # new: whoever receives it may die before recording it, and the lost-message sweep
    # must then find the try.
    now = started_and_waiting_in_live_worker(store, "deferring", "prefetched")
    record = {"task_id": "deferring", "try_number": 1, "task_name": "lifecycle.add"}
    trigger = {"classpath": "m.T", "kwargs": {}, "queue": "default", "created_at": now}
    assert store.triggers.defer_try({**record, "updated_at": now}, trigger, now) == (True, None)
    store.tries.apply_writes([("reserved", ("deferring", 1, "live", now))])
    store.jobs.add_job(
        {
            "id": "triggerer",
            "job_type": JobType.TRIGGERER,
            "hostname": "h",
            "pid": 2,
            "state": JobState.RUNNING,
            "start_date": now,
            "latest_heartbeat": now,
        }
    )
    [row] = store.triggers.claim_triggers("triggerer", None, 10, now, 30)
    header = ("recovery_resume", {"method": None, "kwargs": {}, "event": 1})
    _, publish = store.triggers.fire_triggers(
        "triggerer", [Firing(row["id"], "deferring", 1, RESUME, 1, header)], now
    )
    assert list(publish) == [row["id"]]
    later = now + timedelta(seconds=3600)
    lost = {
        r["task_id"]
        for r in store.try_recovery.find_lost(later, 600, live_threshold=3600 + THRESHOLD)
    }
    assert lost == {"deferring"}


def test_a_reservation_written_after_its_try_was_started_and_sent_back_does_not_hold_it(store):
    # The worker's main process received the message at t0 and commits its reservation
    # a moment later; meanwhile the pool process started the try and, Celery having
    # failed before the body (its result backend refused STARTED), sent it back to the
    # queue, deleting the reservation that was not written yet.  The late row must not
    # keep the lost-message sweep off the try for as long as the worker lives.
    add_job(store, "live", 0.0)
    queue_try(store, "never-ran")
    received = utcnow()
    started = received + timedelta(milliseconds=30)
    record = {"task_id": "never-ran", "try_number": 1, "task_name": "lifecycle.add"}
    assert store.tries.mark_running(
        {
            **record,
            "state": "running",
            "job_id": "pool",
            "started_at": started,
            "updated_at": started,
        }
    )
    back = {"state": TaskState.QUEUED, "queued_at": started, "updated_at": started}
    store.tries.apply_writes(
        [("transition", Transition("never-ran", 1, (TaskState.RUNNING,), back))]
    )
    store.tries.apply_writes([("reserved", ("never-ran", 1, "live", received))])
    # A reception after that start (a redelivery of the same try) holds it again.
    queue_try(store, "redelivered")
    assert store.tries.mark_running(
        {
            **record,
            "task_id": "redelivered",
            "state": "running",
            "started_at": started,
            "updated_at": started,
        }
    )
    store.tries.apply_writes(
        [("transition", Transition("redelivered", 1, (TaskState.RUNNING,), back))]
    )
    store.tries.apply_writes(
        [("reserved", ("redelivered", 1, "live", started + timedelta(seconds=1)))]
    )
    later = received + timedelta(seconds=3600)
    lost = {
        r["task_id"]
        for r in store.try_recovery.find_lost(later, 600, live_threshold=3600 + THRESHOLD)
    }
    assert lost == {"never-ran"}
