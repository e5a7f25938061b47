"""Claims on failure-callback rows: a delivering process that died holds nothing."""

from __future__ import annotations

from celery_recovery import JobState, TaskState
from celery_recovery.core.records import OutboxedTransition, Transition
from celery_recovery.core.timeutils import utcnow
from tests.builders import job_row, queued

LEASE = 130.0


def _callback_row(store) -> None:
    store.tries.apply_writes([("queued", queued("t1"))])
    change = Transition("t1", 1, (TaskState.QUEUED,), {"state": TaskState.FAILED})
    row = {"task_id": "t1", "try_number": 1, "kind": "failure", "payload": {}}
    assert store.tries.apply_outboxed([OutboxedTransition(change, {**row, "created_at": utcnow()})])


def _job(store, job_id: str, pid: int) -> None:
    store.jobs.add_job(job_row(job_id, utcnow(), node_name="w@h", pid=pid))


def _claimed_by(store, holder: str) -> list[int]:
    return [r["id"] for r in store.outbox.claim_callbacks(utcnow(), holder, LEASE)]


def test_a_row_claimed_by_a_live_process_waits_out_its_lease(store):
    _callback_row(store)
    _job(store, "sweeper", 7)
    assert len(_claimed_by(store, "h:7")) == 1
    assert _claimed_by(store, "h:8") == []


def test_a_row_claimed_by_a_process_whose_job_ended_is_claimed_again_at_once(store):
    # A pool process sweeping in a thread is killed mid-delivery (its hung try is
    # stopped): its job is failed by the next sweep, which takes the row over.
    _callback_row(store)
    _job(store, "sweeper", 7)
    [row] = _claimed_by(store, "h:7")
    assert store.jobs.end_job("sweeper", JobState.FAILED, utcnow())
    assert _claimed_by(store, "h:8") == [row]
    [pending] = store.outbox.pending_callbacks()
    assert (pending["claimed_by"], pending["attempts"]) == ("h:8", 2)
    # The dead holder's late delete (had it woken) no longer owns the row.
    assert not store.outbox.delete_callback(row, "h:7")


def test_a_reused_process_id_keeps_the_claim_of_its_live_job(store):
    _callback_row(store)
    _job(store, "old", 7)
    assert store.jobs.end_job("old", JobState.FAILED, utcnow())
    _job(store, "new", 7)  # the same pid, a new process, now sweeping
    assert len(_claimed_by(store, "h:7")) == 1
    assert _claimed_by(store, "h:8") == []
