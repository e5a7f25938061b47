"""Helpers for sweep tests: run sweeps like beat would, read ledgers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from celery_recovery.recovery import recovery_for_app
from tests.workers import wait_for


def ledger_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def count(path: Path, prefix: str) -> int:
    return sum(1 for line in ledger_lines(path) if line.startswith(prefix))


def sweep_until(app, condition, timeout: float, what: str):
    """Run a sweep every recovery_sweep_interval (as beat would) until ``condition()``."""
    recovery = recovery_for_app(app)
    interval = recovery.settings.sweep_interval
    last = [0.0]

    def step():
        if time.monotonic() - last[0] >= interval:
            recovery.sweep()
            last[0] = time.monotonic()
        return condition()

    return wait_for(step, timeout, interval=0.1, what=what)


def sweep_for(app, seconds: float) -> None:
    """Sweep as beat would for ``seconds``: long enough for every dead job to be judged."""
    deadline = time.monotonic() + seconds
    sweep_until(app, lambda: time.monotonic() > deadline, seconds + 10, "the sweeps")


def restore_unacked(app, visibility: float) -> None:
    """Put Redis messages unacknowledged for longer than ``visibility`` seconds back in
    their queues now, as a worker's kombu does on its own timer.

    kombu 5.7 runs that timer every second with the tests' transport options; kombu 5.5
    has no such options and restores every ~100 s, past the tests' deadlines, so there
    the test restores them itself (any client may: the unacked messages live in Redis).
    """
    import kombu

    if kombu.VERSION >= (5, 7) or not app.conf.broker_url.startswith("redis"):
        return
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        channel.visibility_timeout = visibility
        channel.qos.restore_visible(num=100)


def run_concurrently(func, times: int = 2) -> list:
    """Call ``func`` from ``times`` threads released at the same instant; their results."""
    barrier = threading.Barrier(times)
    results: list = []

    def run():
        barrier.wait()
        results.append(func())

    threads = [threading.Thread(target=run) for _ in range(times)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def try_started(store, task_id: str, try_number: int) -> bool:
    return any(
        t["try_number"] == try_number and t["state"] != "queued"
        for t in store.tries.history(task_id)
    )


def running_try(store, task_id: str) -> dict:
    """Wait until a try of ``task_id`` is recorded running; that try."""
    from celery_recovery import TaskState

    return wait_for(
        lambda: next(
            (t for t in store.tries.history(task_id) if t["state"] == TaskState.RUNNING), None
        ),
        15,
        what=f"{task_id} to be running",
    )


def succeeded_tries(store, task_id: str, timeout: float = 10.0) -> list:
    """Wait until the last try of ``task_id`` is recorded ``success``; all its tries."""
    from celery_recovery import TaskState

    return wait_for(
        lambda: (t := store.tries.history(task_id)) and t[-1]["state"] == TaskState.SUCCESS and t,
        timeout,
        what=f"the last try of {task_id} to succeed",
    )


def sweep_counting(app, condition, timeout: float, what: str):
    """Sweep every recovery_sweep_interval (as beat would) until ``condition()``; the
    sums of the sweeps' reports, and when the last sweep ran (monotonic seconds)."""
    from celery_recovery.core.records import SweepReport

    recovery = recovery_for_app(app)
    interval = recovery.settings.sweep_interval
    total = SweepReport()
    last = [0.0]

    def step():
        if time.monotonic() - last[0] >= interval:
            report = recovery.sweep()
            last[0] = time.monotonic()
            for name, value in report.as_dict().items():
                if isinstance(value, int):
                    setattr(total, name, getattr(total, name) + value)
        return condition()

    wait_for(step, timeout, interval=0.1, what=what)
    return total, last[0]


def reserved_ids(store) -> set[str]:
    """The task ids of every reservation row (received by a worker, whether started since)."""
    from sqlalchemy import select

    from celery_recovery.store.schema import reservations

    with store.transaction() as conn:
        return {row.task_id for row in conn.execute(select(reservations.c.task_id))}
