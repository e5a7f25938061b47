"""Durable failure callbacks: once normally, and what happens when the sweeper dies."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta

from celery_recovery import TaskState
from celery_recovery.recovery import recovery_for_app
from celery_recovery.sweeps.callbacks import MAX_ATTEMPTS
from tests.builders import make_zombie
from tests.sweeps.helpers import count, ledger_lines
from tests.workers import ROOT


def test_listeners_and_on_failure_run_once_outside_the_sweep_transaction(
    client_app, store, tmp_path
):
    ledger = tmp_path / "ledger"
    recovery = recovery_for_app(client_app)
    seen = []

    @recovery.add_failure_listener
    def record(**event):
        # A listener may use the store: no transaction of the sweep is open.
        seen.append(
            (event["task_id"], event["kind"], store.tries.history(event["task_id"])[0]["state"])
        )

    make_zombie(store, "t1", task_name="lifecycle.ledger_sleep_once", args=(str(ledger), 1))
    report = recovery.sweep()
    assert report.failed == 1 and report.callbacks_delivered == 1
    assert seen == [("t1", "failure", TaskState.FAILED)]
    assert count(ledger, "on_failure LostWorkerError") == 1
    recovery.sweep()
    assert len(seen) == 1 and store.outbox.pending_callbacks() == []


def test_a_slow_or_raising_callback_does_not_hold_up_the_others(client_app, store, monkeypatch):
    recovery = recovery_for_app(client_app)
    monkeypatch.setattr(recovery.settings.__class__, "callback_timeout", 0.5, raising=False)
    object.__setattr__(recovery.settings, "callback_timeout", 0.5)
    calls = []

    @recovery.add_failure_listener
    def slow(**event):
        if event["task_id"] == "slow":
            time.sleep(5)
        calls.append(event["task_id"])

    @recovery.add_failure_listener
    def raising(**event):
        raise RuntimeError("listener bug")

    for name in ("slow", "fast"):
        make_zombie(
            store,
            name,
            job_id=f"dead-{name}",
            task_name="lifecycle.ledger_sleep_once",
            args=("/dev/null", 1),
        )
    started = time.monotonic()
    report = recovery.sweep()
    assert time.monotonic() - started < 4
    assert "fast" in calls and report.failed == 2
    assert report.callbacks_failed == 2  # each row had a raising listener
    assert store.outbox.pending_callbacks() == []


def test_sweeper_killed_mid_delivery_redelivers_after_the_claim_expires(
    client_app, store, store_url, broker_urls, queue, tmp_path
):
    ledger = tmp_path / "ledger"
    make_zombie(store, "t1", task_name="lifecycle.ledger_sleep_once", args=(str(ledger), 1))
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests/sweeps/sweep_and_die.py"),
            store_url,
            *broker_urls,
            queue,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == -9, done.stderr
    # on_failure ran in the killed sweeper; its outbox row is still claimed.
    assert count(ledger, "on_failure") == 1
    (row,) = store.outbox.pending_callbacks()
    assert row["attempts"] == 1 and row["claimed_until"] is not None

    recovery = recovery_for_app(client_app)
    assert recovery.sweep().callbacks_delivered == 0  # the claim still holds
    later = row["claimed_until"] + timedelta(seconds=1)
    assert recovery.sweep(now=later).callbacks_delivered == 1
    # At least once: the callback ran a second time, documented in sweeps/callbacks.py.
    assert count(ledger, "on_failure") == 2, ledger_lines(ledger)
    assert store.outbox.pending_callbacks() == []
    assert MAX_ATTEMPTS >= 2
