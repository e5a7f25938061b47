"""Acceptance: after a SIGKILLed worker's task is recovered, the scraped metrics say so exactly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from celery_recovery import TaskState
from celery_recovery.recovery import recovery_for_app
from tests.conftest import FAST_SETTINGS, app_env
from tests.services import free_port
from tests.telemetry.scrape import scrape, value
from tests.workers import ROOT, wait_for

pytestmark = pytest.mark.slow

ZOMBIE = FAST_SETTINGS["zombie_threshold"]
SWEEP = FAST_SETTINGS["sweep_interval"]


@pytest.fixture
def start_sweeper(pg_url, broker_urls, queue, tmp_path):
    """``celery-recovery sweep --loop --metrics-port P`` as its own process; stopped at teardown."""
    procs: list[subprocess.Popen] = []

    def start(port: int) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(ROOT), **app_env(pg_url, broker_urls, queue)}
        command = [sys.executable, "-m", "celery_recovery.cli", "--app", "tests.apps.lifecycle"]
        command += ["sweep", "--loop", "--metrics-port", str(port)]
        with open(tmp_path / "sweeper.log", "ab") as log:
            procs.append(
                subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            )
        return procs[-1]

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def test_zombie_recovery_shows_in_the_scraped_metrics(
    pg_url, make_client_app, start_worker, start_sweeper, tmp_path
):
    app = make_client_app(pg_url)
    store = recovery_for_app(app).store
    doomed = start_worker(store_url=pg_url, name="doomed", concurrency=1)
    port = free_port()
    start_sweeper(port)

    # Given a sweeping process serving metrics that has seen nothing yet,
    before = wait_for(lambda: scrape(port), 20, what="the sweeper's metrics page")
    assert value(before, "celery_recovery_zombies_found_total") == 0

    # when the worker running a task is SIGKILLed,
    result = app.send_task("lifecycle.ledger_sleep", (str(tmp_path / "ledger"), 30))
    wait_for(
        lambda: any(t["state"] == TaskState.RUNNING for t in store.tries.history(result.id)),
        15,
        what="the task to run",
    )
    # (its main process, which takes the messages, and its one pool process)
    wait_for(
        lambda: value(scrape(port) or {}, "celery_recovery_jobs_running", job_type="worker") == 2,
        10,
        what="a sweep to see the live worker",
    )
    doomed.kill()

    # then the sweep's metrics count one zombie, published again as try 2.
    def republished():
        samples = scrape(port) or {}
        done = value(
            samples, "celery_recovery_sweep_actions_total", cause="zombie", action="republished"
        )
        # Actions count as they happen, the found counters when the sweep pass ends.
        finished = value(samples, "celery_recovery_zombies_found_total")
        return samples if done and finished else None

    after = wait_for(republished, ZOMBIE + SWEEP + 15, interval=0.2, what="the republish metric")
    actions = {
        action: value(after, "celery_recovery_sweep_actions_total", cause=cause, action=action)
        for cause in ("zombie", "reserved", "lost_message")
        for action in ("republished", "failed", "adopted", "reconciled")
        if value(after, "celery_recovery_sweep_actions_total", cause=cause, action=action)
    }
    assert actions == {"republished": 1}
    assert value(after, "celery_recovery_zombies_found_total") == 1
    assert value(after, "celery_recovery_lost_messages_total") == 0
    assert value(after, "celery_recovery_sweep_errors_total") == 0
    assert value(after, "celery_recovery_sweep_duration_seconds_count") >= 1
    assert value(after, "celery_recovery_jobs_running", job_type="worker") == 0
    assert [(t["try_number"], t["state"]) for t in store.tries.history(result.id)] == [
        (1, TaskState.UP_FOR_RETRY),
        (2, TaskState.QUEUED),
    ]
