"""A steady stream of tasks to keep running through a fault, and worker bookkeeping."""

from __future__ import annotations

import threading
import time
from typing import Any

from celery_recovery import TaskState
from celery_recovery.core.errors import StoreUnavailableError
from tests.sweeps.helpers import sweep_until
from tests.workers import WorkerProcess, wait_for


class TaskStream:
    """Publishes ``lifecycle.add`` every ``period`` seconds from a thread until stopped."""

    def __init__(self, app: Any, period: float = 0.05) -> None:
        self.app = app
        self.period = period
        self.results: list[Any] = []
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TaskStream:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(self.period):
            try:
                self.results.append(self.app.send_task("lifecycle.add", (i, 1)))
            except Exception:
                self.refused += 1  # the publisher saw it fail: not ours to lose
            i += 1

    def completed(self) -> int:
        try:
            return sum(1 for r in list(self.results) if r.ready())
        except Exception:
            return 0  # the result backend itself is the one restarting

    def wait_completed(self, more: int, timeout: float, what: str) -> None:
        """Wait until ``more`` further tasks completed: the workers are still processing."""
        target = self.completed() + more
        wait_for(lambda: self.completed() >= target, timeout, interval=0.1, what=what)


def final_states(store: Any, task_ids: list[str]) -> dict[str, str]:
    """The state of each task's latest try ('missing' when there is no record)."""
    states = {}
    for task_id in task_ids:
        try:
            tries = store.tries.history(task_id)
        except StoreUnavailableError:
            # The pool does not ping: after a restart, each stale connection fails once.
            tries = [{"state": "unreadable"}]
        states[task_id] = tries[-1]["state"] if tries else "missing"
    return states


def wait_all_succeeded(
    store: Any, task_ids: list[str], timeout: float, sweep_app: Any = None
) -> float:
    """Wait until every task's latest try is ``success`` in the store; seconds taken.

    With ``sweep_app``, sweep as beat would meanwhile (lost messages are re-sent).
    """
    began = time.monotonic()
    pending = list(task_ids)

    def done() -> bool:
        states = final_states(store, pending)
        pending[:] = [t for t, s in states.items() if s != TaskState.SUCCESS]
        return not pending

    try:
        if sweep_app is None:
            wait_for(done, timeout, interval=0.25, what="every task's record to be final")
        else:
            sweep_until(sweep_app, done, timeout, "every task's record to be final")
    except AssertionError:
        history = {
            t: [(r["try_number"], r["state"], r["state_reason"]) for r in store.tries.history(t)]
            for t in pending[:5]
        }
        raise AssertionError(f"{len(pending)} not final: {history}") from None
    return time.monotonic() - began


def worker_running(store: Any, task_id: str, workers: list[WorkerProcess]) -> WorkerProcess:
    """The worker whose job runs ``task_id``'s current try."""

    def find() -> WorkerProcess | None:
        if final_states(store, [task_id])[task_id] != TaskState.RUNNING:
            return None
        running = [t for t in store.tries.history(task_id) if t["state"] == TaskState.RUNNING]
        if not running or running[-1]["job_id"] is None:
            return None
        job = store.jobs.get_job(running[-1]["job_id"])
        node = (job or {}).get("node_name") or ""
        return next((w for w in workers if w.owns(node)), None)

    return wait_for(find, 20, what=f"{task_id} to run on one of the workers")
