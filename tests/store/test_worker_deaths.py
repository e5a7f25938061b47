"""Deaths of a try's runs, and transitions written with their callback row (both stores)."""

from __future__ import annotations

import os
import threading
import time

from celery_recovery import TaskState
from celery_recovery.core.records import OutboxedTransition, Transition
from celery_recovery.core.timeutils import utcnow
from celery_recovery.deliveries.worker_lost import runs_allowed
from tests.builders import queued, running


def test_a_claim_that_finds_its_try_still_running_counts_one_death(store):
    assert store.tries.claim_counting_deaths(running(job_id="job-a")) == 0
    # Redelivered after job-a's process died: its try is still recorded running.
    assert store.tries.claim_counting_deaths(running(job_id="job-b")) == 1
    assert store.tries.claim_counting_deaths(running(job_id="job-c")) == 2
    [only] = store.tries.history("t1")
    assert (only["job_id"], only["deaths"]) == ("job-c", 2)
    # A finished try is not claimed again.
    assert store.tries.transition(
        "t1", 1, TaskState.RUNNING, TaskState.SUCCESS, updated_at=utcnow()
    )
    assert store.tries.claim_counting_deaths(running(job_id="job-d")) is None


def test_a_second_claim_by_the_same_job_is_no_death(store):
    # A delivery checked as possibly stale is claimed once by the check, then again
    # by the death-counting claim of the same process: one run, no death.
    store.tries.apply_writes([("queued", queued())])
    assert store.tries.mark_running(running(job_id="job-a"))
    assert store.tries.claim_counting_deaths(running(job_id="job-a")) == 0
    assert store.tries.claim_counting_deaths(running(job_id="job-b")) == 1


def test_a_first_run_of_a_published_try_is_no_death(store):
    store.tries.apply_writes([("queued", queued())])
    assert store.tries.claim_counting_deaths(running()) == 0
    # The buffered claim counts the same way.
    store.tries.apply_writes([("running", running(job_id="job-b"))])
    assert store.tries.history("t1")[0]["deaths"] == 1


def _requeue_of_dead_run(pid: int) -> Transition:
    """The worker's main process's record of Celery's requeue after pool process ``pid`` died."""
    values = {"state": TaskState.QUEUED, "job_id": None, "state_reason": "requeued by Celery"}
    return Transition("t1", 1, (TaskState.RUNNING,), values, died_in_pid=pid)


def test_a_requeue_recorded_before_the_redelivery_counts_the_death_once(store):
    assert store.tries.claim_counting_deaths(running(job_id="job-a", worker_pid=101)) == 0
    store.tries.apply_writes([("transition", _requeue_of_dead_run(101))])
    [row] = store.tries.history("t1")
    assert (row["state"], row["job_id"], row["deaths"]) == (TaskState.QUEUED, None, 1)
    # The redelivery finds it queued: no second death for the same one.
    assert store.tries.claim_counting_deaths(running(job_id="job-b", worker_pid=102)) == 1


def test_a_requeue_recorded_after_the_redelivery_leaves_its_claim_alone(store):
    assert store.tries.claim_counting_deaths(running(job_id="job-a", worker_pid=101)) == 0
    # The redelivery claimed first (and counted the death); the late record of the
    # requeue must neither send the new run's try back to queued nor count again.
    assert store.tries.claim_counting_deaths(running(job_id="job-b", worker_pid=102)) == 1
    store.tries.apply_writes([("transition", _requeue_of_dead_run(101))])
    [row] = store.tries.history("t1")
    assert (row["state"], row["job_id"], row["deaths"]) == (TaskState.RUNNING, "job-b", 1)


def test_an_outboxed_transition_writes_its_callback_only_when_it_wins(store):
    store.tries.apply_writes([("queued", queued("t1")), ("queued", queued("t2"))])
    store.tries.transition("t2", 1, TaskState.QUEUED, TaskState.REVOKED, updated_at=utcnow())
    now = utcnow()

    def failing(task_id: str) -> OutboxedTransition:
        change = Transition(
            task_id, 1, (TaskState.QUEUED, TaskState.RUNNING), {"state": TaskState.FAILED}
        )
        row = {
            "task_id": task_id,
            "try_number": 1,
            "kind": "failure",
            "payload": {"pid": os.getpid()},
        }
        return OutboxedTransition(change, {**row, "created_at": now})

    assert store.tries.apply_outboxed([failing("t1"), failing("t2")]) == 1
    store.tries.apply_writes([("outboxed", failing("t1"))])  # lost: already failed
    assert [(c["task_id"], c["kind"]) for c in store.outbox.pending_callbacks()] == [
        ("t1", "failure")
    ]
    assert [t["state"] for t in store.tries.history("t2")] == [TaskState.REVOKED]


def test_each_run_that_dies_counts_as_one_of_the_tasks_retries():
    assert runs_allowed(max_retries=2, retries=0, unbounded_cap=4) == 3
    assert runs_allowed(max_retries=2, retries=2, unbounded_cap=4) == 1  # the last try
    assert runs_allowed(max_retries=0, retries=0, unbounded_cap=4) == 1
    assert runs_allowed(max_retries=None, retries=7, unbounded_cap=4) == 4


def test_a_fork_waits_for_the_store_calls_in_progress(store):
    # A prefork worker forks a new pool process while its writer thread records the
    # death of the old one: the child must not inherit a lock held mid-call.
    inside, left = threading.Event(), []

    def write() -> None:
        with store.transaction():
            inside.set()
            time.sleep(0.3)
        left.append(time.monotonic())

    thread = threading.Thread(target=write)
    thread.start()
    inside.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: its own store calls work
        code = 0 if store.tries.history("t1") == [] else 1
        os._exit(code)
    forked = time.monotonic()
    thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert left and forked >= left[0]
