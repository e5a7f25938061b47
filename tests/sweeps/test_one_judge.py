"""A death has one judge: a pool process killed under a live worker is its parent's to record.

The worker's main process sees the death within about a second and records
Celery's verdict; a sweep running meanwhile (every 0.2 s here, heartbeats a
second apart) must not reset the same try: the body would run twice and both
``on_retry`` and ``on_failure`` would fire.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from celery_recovery import TaskState
from celery_recovery.recovery import recovery_for_app
from celery_recovery.sweeps.parents import PARENT_VERDICT_GRACE
from tests.apps.lifecycle import log_failure_listeners
from tests.sweeps.helpers import count, ledger_lines
from tests.workers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.compat]

REPETITIONS = 20
#: The issue's timing: heartbeats a second apart, so a sweep sees a killed pool
#: process late (and gone) while its parent is still recording it.
TIMING = {"heartbeat_interval": 1.0, "zombie_threshold": 3.0, "health_check_threshold": 3.0}


@contextmanager
def sweeping(app, every: float = 0.2) -> Iterator[None]:
    """Sweep in the background as eagerly as a busy deployment's beat and workers would."""
    recovery = recovery_for_app(app)
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every):
            recovery.sweep()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


def _run_each_until_failed(
    app, sends: list[tuple[str, Path]], timeout: float, timing: dict[str, float] = TIMING
) -> list:
    """Send each (task name, ledger) with sweeps running, until each ran its ``on_failure``
    and the sweeps had the time to judge every dead process; the results."""
    with sweeping(app):
        results = [app.send_task(name, (str(path),)) for name, path in sends]
        wait_for(
            lambda: all(count(path, "on_failure") for _, path in sends),
            timeout,
            interval=0.2,
            what="on_failure of every task",
        )
        _judging_window_passes(timing["zombie_threshold"])
    return results


def _judging_window_passes(zombie_threshold: float) -> None:
    """Let the sweeps run long enough to have judged every dead process (threshold and
    the parent's grace), had they been going to."""
    deadline = time.monotonic() + zombie_threshold + PARENT_VERDICT_GRACE + 1
    wait_for(
        lambda: time.monotonic() > deadline,
        zombie_threshold + 30,
        interval=0.2,
        what="the judging window",
    )


def _worker_env(heard, timing: dict[str, float] = TIMING) -> dict[str, str]:
    return {
        "RECOVERY_TEST_LISTENER_LOG": str(heard),
        **{f"CELERY_RECOVERY_{k.upper()}": str(v) for k, v in timing.items()},
    }


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_pool_process_killed_under_a_live_worker_is_failed_once_not_run_again(
    make_client_app, store_url, store, start_worker, tmp_path
):
    app = make_client_app(store_url, **TIMING)
    heard = tmp_path / "listeners"
    log_failure_listeners(app, str(heard))
    start_worker(concurrency=4, env=_worker_env(heard))
    ledgers = [tmp_path / f"self_kill-{i}" for i in range(REPETITIONS)]
    results = _run_each_until_failed(app, [("lifecycle.self_kill", p) for p in ledgers], 90)

    for path, result in zip(ledgers, results, strict=True):
        lines = ledger_lines(path)
        assert count(path, "start") == 1, lines  # never run again
        assert count(path, "on_failure WorkerLostError") == 1, lines
        assert count(path, "on_retry") == 0, lines
        [only] = store.tries.history(result.id)
        assert only["state"] == TaskState.FAILED, only
        assert only["state_reason"].startswith("its pool process died"), only["state_reason"]
        assert only["recovered_at"] is None, only
        assert result.state == "FAILURE"
    assert sorted(ledger_lines(heard)) == sorted(
        f"failure {r.id} try=1 WorkerLostError" for r in results
    )


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_task_that_always_kills_its_process_runs_max_retries_plus_one_times_each(
    make_client_app, store_url, store, start_worker, tmp_path
):
    # acks_late + task_reject_on_worker_lost: Celery requeues each killed run; the
    # poison bound stops it after max_retries + 1 runs, with no sweep's run besides.
    app = make_client_app(store_url, **TIMING)
    heard = tmp_path / "listeners"
    start_worker(concurrency=4, env=_worker_env(heard))
    ledgers = [tmp_path / f"poison-{i}" for i in range(REPETITIONS)]
    results = _run_each_until_failed(app, [("lifecycle.poison", p) for p in ledgers], 120)

    runs = [count(path, "start") for path in ledgers]
    print(f"\nruns of each poison task: {runs}")
    for path, result in zip(ledgers, results, strict=True):
        lines = ledger_lines(path)
        assert count(path, "start") == 3, lines  # max_retries=2
        assert count(path, "on_failure WorkerLostError") == 1, lines
        assert count(path, "on_retry") == 0, lines
        [only] = store.tries.history(result.id)
        assert (only["state"], only["deaths"]) == (TaskState.FAILED, 3), only
        assert result.state == "FAILURE"


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_requeued_try_waiting_longer_than_the_sweeps_bound_is_not_published_again(
    make_client_app, store_url, store, start_worker, tmp_path
):
    # Celery requeues a killed acks_late run (task_reject_on_worker_lost) and says
    # nothing of it; here its redelivery waits behind a 12 s task on the only
    # process, far past the sweep's bound for a dead process (threshold and grace).
    # The worker's main process records the requeue, so no sweep publishes a try 2
    # beside the message Celery put back.
    app = make_client_app(store_url, **TIMING)
    start_worker(concurrency=1, env=_worker_env(tmp_path / "listeners"))
    poison, long = tmp_path / "poison", tmp_path / "long"
    with sweeping(app):
        result = app.send_task("lifecycle.poison", (str(poison),))
        app.send_task("lifecycle.ledger_sleep", (str(long), 12))

        def requeued():
            rows = store.tries.history(result.id)  # empty until the publisher's write lands
            started = count(poison, "start") and count(long, "start")
            return started and rows and rows[0]["state"] == TaskState.QUEUED and rows[-1]

        row = wait_for(requeued, 30, interval=0.1, what="the requeue recorded, the long task on")
        assert "requeued by Celery" in row["state_reason"], row["state_reason"]
        assert (row["deaths"], count(poison, "start")) == (1, 1), row
        # The sweeps' whole judging window passes while the redelivery waits.
        _judging_window_passes(TIMING["zombie_threshold"])
        assert count(long, "start") == 1 and count(long, "done") == 0, "the wait is over early"
        [row] = store.tries.history(result.id)
        assert (row["state"], row["recovered_at"]) == (TaskState.QUEUED, None), row
        wait_for(lambda: count(poison, "on_failure"), 90, interval=0.2, what="on_failure")
        _judging_window_passes(TIMING["zombie_threshold"])

    lines = ledger_lines(poison)
    assert count(poison, "start") == 3, lines
    assert count(poison, "on_failure WorkerLostError") == 1, lines
    assert count(poison, "on_retry") == 0, lines
    [only] = store.tries.history(result.id)
    assert (only["state"], only["deaths"], only["recovered_at"]) == (TaskState.FAILED, 3, None)
    assert result.state == "FAILURE"
