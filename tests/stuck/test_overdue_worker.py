"""Overdue tries with a real worker: the history its runs leave makes a slow try of the
same task overdue while it runs, and no longer once it has finished."""

from __future__ import annotations

import pytest

from celery_recovery.core.overdue import OverduePolicy
from celery_recovery.core.states import TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.store import Store
from tests.workers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis]

#: Judged after 3 runs, and after 1 s at least (the task usually takes milliseconds).
POLICY = OverduePolicy(factor=3.0, min_runs=3, min_seconds=1.0)


def test_a_slow_try_of_a_quick_task_is_overdue_while_it_runs(start_worker, make_client_app, pg_url):
    # Given a worker, and three quick runs of a task recorded by it
    start_worker(pg_url)
    app = make_client_app(pg_url)
    store = Store(pg_url)
    for _ in range(3):
        assert app.send_task("lifecycle.sleep_for", (0.01,)).get(timeout=20) == 0.01

    def successes() -> int:
        tries = store.tries.list_tries(
            state=TaskState.SUCCESS.value, task_name="lifecycle.sleep_for"
        )
        return len(tries)

    wait_for(lambda: successes() == 3, 10, what="three successful runs in the store")

    # When a run of the same task takes 6 s
    slow = app.send_task("lifecycle.sleep_for", (6,))

    # Then it is overdue after a second, with the bound and the usual duration it came from
    def overdue() -> list:
        return store.overdue.find(utcnow(), POLICY)

    [row] = wait_for(overdue, 10, what="the slow try flagged as overdue")
    assert (row["task_id"], row["task_name"], row["runs"]) == (slow.id, "lifecycle.sleep_for", 3)
    assert row["bound"] == 1.0 and row["usual"] < 1.0 and row["age"] >= 1.0
    # ... nothing was done to it: it finishes, and is overdue no more
    assert slow.get(timeout=20) == 6
    wait_for(lambda: successes() == 4, 10, what="the slow run recorded")
    assert overdue() == []
    store.dispose()
