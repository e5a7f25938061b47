"""Every Celery pool: a SIGKILLed worker's running tasks and the messages it held come back
together, in the sweep that finds it dead, and each body completes once.

prefork runs tasks in child processes (each its own job, the main process a job that
holds the messages); solo, threads, gevent and eventlet run them in the worker's one
process, which is then one job for both.  docs/compatibility.md says what differs.
"""

from __future__ import annotations

import re
import time
from datetime import datetime

import pytest

from celery_recovery import TaskState
from tests.conftest import FAST_SETTINGS
from tests.sweeps.helpers import count, ledger_lines, reserved_ids, sweep_counting
from tests.workers import wait_for

pytestmark = pytest.mark.slow

ZOMBIE = FAST_SETTINGS["zombie_threshold"]
SWEEP = FAST_SETTINGS["sweep_interval"]


def running_ids(store, results) -> set[str]:
    return {
        r.id
        for r in results
        if any(t["state"] == TaskState.RUNNING for t in store.tries.history(r.id))
    }


def recovered(store, results):
    """A condition: every try 1 of ``results`` has been published again."""
    return lambda: all(len(store.tries.history(r.id)) >= 2 for r in results)


#: The messages a worker holds besides those it runs, with prefetch multiplier 2:
#: prefork and threads fill their prefetch (2 running, 2 waiting); gevent and eventlet
#: take one more, which waits at the full pool and stops the consumer until a slot
#: frees; solo runs its task in the consumer and takes the next once it is done.  The
#: test sends as many as the worker takes (a message it leaves in the broker is not
#: the sweep's, and would run its long first try on the survivor).
HELD = {"prefork": 2, "threads": 2, "gevent": 1, "eventlet": 1, "solo": 0}


@pytest.mark.parametrize("pool", list(HELD))
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_killed_workers_running_and_held_tasks_come_back_together_on_every_pool(
    client_app, store, start_worker, tmp_path, pool
):
    concurrency = 1 if pool == "solo" else 2
    held = HELD[pool]
    env = {"RECOVERY_TEST_PREFETCH": "2"}
    doomed = start_worker(name="doomed", pool=pool, concurrency=concurrency, env=env)
    ledgers = [tmp_path / f"ledger{i}" for i in range(concurrency + held)]
    results = [client_app.send_task("lifecycle.ledger_sleep", (str(p), 60, 0.1)) for p in ledgers]
    wait_for(
        lambda: (
            len(running_ids(store, results)) == concurrency
            and len(reserved_ids(store) - running_ids(store, results)) == held
        ),
        20,
        what=f"{concurrency} tasks running and {held} held",
    )
    survivor = start_worker(name="survivor", pool=pool, concurrency=concurrency, env=env)
    doomed.kill()
    killed = time.monotonic()

    report, at = sweep_counting(
        client_app, recovered(store, results), ZOMBIE + 4 * SWEEP + 10, "the republish"
    )
    print(f"\n{pool}: kill to every task published again: {at - killed:.1f}s")
    # The sweeps that found it dead published them all, the running and the held ones:
    # none waited for recovery_queued_timeout (600 s here) as a lost message.
    assert at - killed <= ZOMBIE + 2 * SWEEP + 2
    assert report.republished == concurrency and report.reserved_republished == held, report
    assert report.lost_republished == 0, report
    wait_for(lambda: all(r.ready() for r in results), 20, what=f"the tasks to run on {pool}")
    for result, ledger in zip(results, ledgers, strict=True):
        assert result.get(timeout=5) == 60
        assert count(ledger, "done") == 1, ledger_lines(ledger)
    assert survivor.proc.poll() is None


#: The time in a worker's log line: ``[2026-01-01 10:00:00,123: INFO/MainProcess] ...``.
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): ")


def _received_at(log: str, task_id: str) -> float | None:
    """When the worker logged taking ``task_id`` (epoch seconds), if it did."""
    for line in log.splitlines():
        if f"[{task_id}] received" in line and (found := LOG_TIME.match(line)):
            stamp = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    return None


#: When, after the worker took its next message, the demo's kill came: within the
#: 0.2 s its main process used to gather reservations before committing them.
KILLED_AFTER_TAKING = 0.15


@pytest.mark.parametrize("store_url,broker", [("sqlite", "filesystem")], indirect=["store_url"])
def test_a_message_taken_just_before_the_kill_comes_back_with_the_zombie(
    client_app, store, start_worker, tmp_path
):
    # The demo: filesystem broker (the worker takes a message off the folder, so a
    # SIGKILL loses it), prefork, concurrency 1.  The worker takes the next message
    # the moment the first task starts, and is killed a moment later.
    doomed = start_worker(name="doomed", concurrency=1)
    ledgers = [tmp_path / "running", tmp_path / "taken"]
    results = [client_app.send_task("lifecycle.ledger_sleep", (str(p), 60, 0.1)) for p in ledgers]
    taken = wait_for(lambda: _received_at(doomed.log, results[1].id), 20, what="the next message")
    # The kill's moment is the scenario (the demo kills as the task is seen running).
    time.sleep(max(0.0, taken + KILLED_AFTER_TAKING - time.time()))
    doomed.kill()
    killed = time.monotonic()
    start_worker(name="survivor", concurrency=1)

    report, at = sweep_counting(
        client_app, recovered(store, results), ZOMBIE + 4 * SWEEP + 10, "the republish"
    )
    print(f"\nfilesystem/prefork: kill to both published again: {at - killed:.1f}s")
    assert at - killed <= ZOMBIE + 2 * SWEEP + 2
    assert (report.republished, report.reserved_republished, report.lost_republished) == (1, 1, 0)
    wait_for(lambda: all(r.ready() for r in results), 20, what="both tasks to run")
    for ledger in ledgers:
        assert count(ledger, "done") == 1, ledger_lines(ledger)
