"""A worker cut off from the store alone is partitioned, not dead: its task runs once.

The worker reaches PostgreSQL through a TCP proxy that the test freezes (sockets
open, no bytes: a partition, a pooler restart) for longer than the zombie
threshold, while its broker and result backend stay fine; the sweep, with a
direct connection, sees its heartbeats stop.  Asked over the broker, the worker
answers that it holds the try: nothing runs twice.  A worker that cannot answer
(SIGSTOPped) is judged as before: its try runs again on another worker.
"""

from __future__ import annotations

import signal
import time

import pytest
from sqlalchemy import select

from celery_recovery import JobType, TaskState
from celery_recovery.recovery import recovery_for_app
from celery_recovery.store.schema import audit_log
from tests.conftest import FAST_SETTINGS
from tests.proxy import TcpProxy
from tests.sweeps.helpers import (
    count,
    ledger_lines,
    running_try,
    sweep_counting,
    sweep_until,
)
from tests.workers import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("store_url", ["postgresql"], indirect=True),
]

ZOMBIE = FAST_SETTINGS["zombie_threshold"]
SWEEP = FAST_SETTINGS["sweep_interval"]
#: Longer than the zombie threshold by several sweeps.
CUT_OFF = ZOMBIE + 4 * SWEEP


@pytest.fixture
def proxy():
    proxy = TcpProxy("127.0.0.1", 5432).start()
    yield proxy
    proxy.thaw()


def test_a_worker_cut_off_from_the_store_alone_runs_its_task_once(
    client_app, store, store_url, start_worker, proxy, tmp_path
):
    ledger = tmp_path / "ledger"
    behind = store_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    worker = start_worker(store_url=behind, name="cut", concurrency=1)
    result = client_app.send_task("lifecycle.ledger_sleep", (str(ledger), CUT_OFF + 3, 0.1))
    first = running_try(store, result.id)
    # Started once the task runs on the cut worker, or it could have taken the task.
    start_worker(name="other", concurrency=1)  # would take a re-run
    # (each worker's main process and its pool process)
    wait_for(lambda: len(store.jobs.list_jobs(JobType.WORKER)) == 4, 15, what="the jobs")

    # Given its store connections freeze for longer than the zombie threshold,
    proxy.freeze()
    frozen_at = time.monotonic()
    total, _ = sweep_counting(
        client_app,
        lambda: time.monotonic() - frozen_at > CUT_OFF,
        CUT_OFF + 10,
        "the cut-off",
    )
    proxy.thaw()

    # then the sweeps found it partitioned (it answered over the broker), not dead,
    assert total.partitioned >= 1, total
    assert (total.zombies, total.republished) == (0, 0), total
    # and its task ran once, and every record catches up: the one try ends success.
    assert result.get(timeout=CUT_OFF + 20) == CUT_OFF + 3
    sweep_until(
        client_app,
        lambda: (
            [(t["try_number"], t["state"]) for t in store.tries.history(result.id)]
            == [(1, TaskState.SUCCESS)]
        ),
        20,
        "the try's success, written when the store came back",
    )
    assert (count(ledger, "start"), count(ledger, "done")) == (1, 1), ledger_lines(ledger)
    (only,) = store.tries.history(result.id)
    assert only["job_id"] == first["job_id"] and only["recovered_at"] is None
    with store.transaction() as conn:
        rows = conn.execute(
            select(audit_log.c.action, audit_log.c.detail).where(audit_log.c.task_id == result.id)
        ).all()
    assert [action for action, _ in rows] == ["partitioned"], rows
    assert "answered over the broker and holds the try" in rows[0][1]
    assert "was marked failed while this process was alive" not in worker.log


def test_a_paused_worker_that_cannot_answer_is_judged_as_before(
    client_app, store, start_worker, tmp_path
):
    ledger = tmp_path / "ledger"
    paused = start_worker(name="paused", concurrency=1)
    result = client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 30, 0.1))
    running_try(store, result.id)
    # Started once the task runs on the paused worker, or it could have taken the task.
    start_worker(name="other", concurrency=1)

    paused.signal(signal.SIGSTOP)
    try:
        total, _ = sweep_counting(
            client_app,
            lambda: any(t["try_number"] == 2 for t in store.tries.history(result.id)),
            ZOMBIE + 5 * SWEEP + 10,
            "try 2",
        )
        assert total.partitioned == 0 and total.republished == 1, total
        assert result.get(timeout=20) == 30  # try 2, on the other worker
    finally:
        paused.signal(signal.SIGCONT)
    assert recovery_for_app(client_app).store.tries.history(result.id)[0]["state"] == (
        TaskState.UP_FOR_RETRY
    )
