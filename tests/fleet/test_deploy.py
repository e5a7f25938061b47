"""No dead ends after a deploy: however a worker is stopped, every task ends SUCCESS.

A prefork worker runs two tasks and holds four more (prefetched) when it is stopped
as a rolling deploy or an orchestrator would: SIGTERM then SIGKILL after a grace
period, SIGTERM alone (a warm shutdown that waits for the running tasks), or a
cold shutdown (SIGQUIT: running tasks terminated, unacknowledged messages restored).
A second worker is up.  Each way, with ``acks_late`` and without, on every Celery of
the matrix: every task's result reaches the caller, a body stopped mid-run runs at
most twice, the others once.  (Celery 5.5.3's cold shutdown stores RETRY for a
running task without sending a retry: tests/sweeps/test_dead_ends.py.)
"""

from __future__ import annotations

import signal
import time

import pytest

from celery_recovery import TaskState
from tests.conftest import FAST_SETTINGS
from tests.sweeps.helpers import count, ledger_lines, reserved_ids, running_try, sweep_until
from tests.workers import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.compat,
    pytest.mark.parametrize("store_url", ["postgresql"], indirect=True),
]

ZOMBIE = FAST_SETTINGS["zombie_threshold"]
SWEEP = FAST_SETTINGS["sweep_interval"]
#: The running tasks' first run: longer than the grace period, short enough for a
#: warm shutdown to wait for.
LONG = 4.0
GRACE = 1.0


@pytest.mark.parametrize("acks_late", [False, True], ids=["early-ack", "acks-late"])
@pytest.mark.parametrize("stop", ["term-then-kill", "term", "cold"])
def test_every_task_of_a_stopped_worker_ends_success(
    client_app, store, start_worker, tmp_path, stop, acks_late
):
    env = {"RECOVERY_TEST_PREFETCH": "4"}
    if acks_late:
        env["RECOVERY_TEST_ACKS_LATE"] = "1"
    deployed = start_worker(name="old", concurrency=2, env=env)
    long_ledgers = [tmp_path / f"long{i}" for i in range(2)]
    short_ledgers = [tmp_path / f"short{i}" for i in range(4)]
    running = [
        client_app.send_task("lifecycle.slow_first_start", (str(ledger), LONG, 0.2))
        for ledger in long_ledgers
    ]
    for result in running:
        running_try(store, result.id)
    waiting = [
        client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 0.2))
        for ledger in short_ledgers
    ]
    wait_for(lambda: reserved_ids(store) >= {r.id for r in waiting}, 15, what="old to reserve them")
    start_worker(name="new", concurrency=2, env=env)

    # When the old worker is stopped (the signal to its main process alone, as an
    # orchestrator sends it to a container's first process),
    deployed.proc.send_signal(signal.SIGQUIT if stop == "cold" else signal.SIGTERM)
    if stop == "term-then-kill":
        time.sleep(GRACE)  # the orchestrator's grace period, then its SIGKILL
        deployed.kill()

    # then every task ends SUCCESS and its result reaches the caller,
    bound = LONG + ZOMBIE + 5 * SWEEP + 20
    sweep_until(
        client_app,
        lambda: all(r.ready() for r in [*running, *waiting]),
        bound,
        "every task to finish",
    )
    for result in running:
        assert result.get(timeout=5) == LONG
    for result in waiting:
        assert result.get(timeout=5) == 0.2
    # a body stopped mid-run at most twice, the others once,
    for ledger in long_ledgers:
        assert count(ledger, "start") <= 2 and count(ledger, "done") == 1, ledger_lines(ledger)
    for ledger in short_ledgers:
        assert (count(ledger, "start"), count(ledger, "done")) == (1, 1), ledger_lines(ledger)
    # and the store's last try of each is success.
    for result in [*running, *waiting]:
        wait_for(
            lambda r=result: store.tries.history(r.id)[-1]["state"] == TaskState.SUCCESS,
            10,
            what=f"{result.id}'s success: {store.tries.history(result.id)}",
        )
