"""Every result backend, and none: a killed worker's tasks run again and their results
reach the caller.

Real workers, a real broker, and the sweep in a process of its own
(``celery-recovery sweep --loop``), as in production: with ``rpc://`` a try
that process publishes again must carry the caller's reply queue, not its own,
or the caller's ``get()`` waits for ever.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kombu import Connection

from celery_recovery import TaskState
from tests.conftest import FAST_SETTINGS, app_env
from tests.sweeps.helpers import count, ledger_lines, reserved_ids, running_try
from tests.workers import SessionProcess, flush_publisher, wait_for

pytestmark = pytest.mark.slow

ZOMBIE = FAST_SETTINGS["zombie_threshold"]
SWEEP = FAST_SETTINGS["sweep_interval"]
#: From a kill to the last of its tasks done: the death found, the sweep's interval, the
#: new worker's run of five short tasks, and a margin for a loaded machine.
KILL_BOUND = ZOMBIE + 3 * SWEEP + 8

#: (broker, result backend): rpc:// on its usual RabbitMQ and on Redis, a database
#: backend on PostgreSQL, and none at all (Celery's default).
MATRIX = [
    pytest.param("rabbitmq", "rpc", marks=pytest.mark.compat),
    pytest.param("redis", "rpc"),
    pytest.param("redis", "database"),
    pytest.param("redis", "none", marks=pytest.mark.compat),
]


@pytest.fixture
def start_sweeper(
    store_url: str, broker_urls: tuple[str, str], queue: str, tmp_path: Path
) -> Iterator[Callable[..., SessionProcess]]:
    """``celery-recovery sweep --loop`` in a process of its own; killed at teardown."""
    sweepers: list[SessionProcess] = []

    def start(**settings: object) -> SessionProcess:
        env = app_env(store_url, broker_urls, queue)
        env.update({f"CELERY_RECOVERY_{k.upper()}": str(v) for k, v in settings.items()})
        command = [sys.executable, "-m", "celery_recovery.cli", "--app", "tests.apps.lifecycle"]
        sweeper = SessionProcess(
            [*command, "sweep", "--loop"], env, tmp_path / f"sweeper{len(sweepers)}.log"
        )
        sweepers.append(sweeper)
        return sweeper

    yield start
    for sweeper in sweepers:
        sweeper.kill()


def _ledgers(tmp_path: Path, n: int) -> list[Path]:
    return [tmp_path / f"ledger{i}" for i in range(n)]


def _all_done(ledgers: list[Path]) -> bool:
    return all(count(ledger, "done") >= 1 for ledger in ledgers)


def _assert_results(results, ledgers, expected, has_backend: bool, deadline: float) -> None:
    """Every task's result reaches the caller (or, with no backend, every body ends) by
    ``deadline`` (monotonic)."""
    if has_backend:
        for result, value in zip(results, expected, strict=True):
            left = max(deadline - time.monotonic(), 0.5)
            assert result.get(timeout=left) == value
    else:
        wait_for(
            lambda: _all_done(ledgers),
            max(deadline - time.monotonic(), 0.5),
            what="every body to finish",
        )


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("broker,result_backend", MATRIX)
def test_a_killed_workers_running_and_prefetched_tasks_reach_the_caller(
    client_app, store, start_worker, start_sweeper, tmp_path, result_backend
):
    # Given a worker running one task and holding four more (prefetch 4, concurrency 1),
    env = {"RECOVERY_TEST_PREFETCH": "4"}
    doomed = start_worker(name="doomed", concurrency=1, env=env)
    ledgers = _ledgers(tmp_path, 5)
    running = client_app.send_task("lifecycle.ledger_sleep", (str(ledgers[0]), 30, 0.2))
    running_try(store, running.id)
    waiting = [
        client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 0.3)) for ledger in ledgers[1:]
    ]
    wait_for(
        lambda: reserved_ids(store) >= {r.id for r in waiting}, 15, what="doomed to reserve them"
    )
    flush_publisher(client_app)
    sweeper = start_sweeper()
    start_worker(name="survivor", concurrency=2, env=env)

    # when it is SIGKILLed,
    doomed.kill()
    killed = time.monotonic()

    # then every task runs on the survivor and the caller gets each result in time,
    # (ledger_sleep returns the seconds of its first try, whichever try ran)
    expected = [30, *[0.3] * 4]
    _assert_results(
        [running, *waiting], ledgers, expected, result_backend != "none", killed + KILL_BOUND
    )
    took = time.monotonic() - killed
    print(f"\n{result_backend}: kill to the last result: {took:.1f}s")
    # the killed body at most twice, the others once,
    assert count(ledgers[0], "start") <= 2 and count(ledgers[0], "done") == 1
    for ledger in ledgers[1:]:
        assert (count(ledger, "start"), count(ledger, "done")) == (1, 1), ledger_lines(ledger)
    # every task's last try recorded a success,
    for result in [running, *waiting]:
        wait_for(
            lambda r=result: store.tries.history(r.id)[-1]["state"] == TaskState.SUCCESS,
            10,
            what=f"{result.id}'s success in the store",
        )
    # and a sweep that cannot ask the backend says so once per decision, never per pass.
    log = sweeper.log
    assert "did not answer" not in log and "bulk probe failed" not in log
    (first, *_) = store.tries.history(running.id)
    if result_backend in ("none", "rpc"):
        assert "the result backend cannot be asked" in first["state_reason"]
    else:
        assert "cannot be asked" not in first["state_reason"]


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("broker,result_backend", [("rabbitmq", "rpc"), ("redis", "none")])
def test_a_killed_pool_processs_task_runs_again_and_reaches_the_caller(
    client_app, store, start_worker, start_sweeper, tmp_path, result_backend
):
    # acks_late + task_reject_on_worker_lost: the worker requeues the message of a pool
    # process killed mid-task, and the redelivery runs it again.
    env = {"RECOVERY_TEST_ACKS_LATE": "1", "RECOVERY_TEST_REJECT_ON_LOST": "1"}
    worker = start_worker(concurrency=1, env=env)
    start_sweeper()
    (ledger,) = _ledgers(tmp_path, 1)
    result = client_app.send_task("lifecycle.slow_first_start", (str(ledger), 30, 0.2))
    wait_for(lambda: count(ledger, "start"), 15, what="the task to start")
    pid = int(ledger_lines(ledger)[0].rsplit("pid=", 1)[1])
    assert pid in worker.child_pids()
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()

    _assert_results([result], [ledger], [30], result_backend != "none", killed + KILL_BOUND)
    assert (count(ledger, "start"), count(ledger, "done")) == (2, 1), ledger_lines(ledger)
    wait_for(
        lambda: store.tries.history(result.id)[-1]["state"] == TaskState.SUCCESS,
        10,
        what="the success in the store",
    )


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("broker,result_backend", [("rabbitmq", "rpc"), ("redis", "none")])
def test_a_lost_message_published_again_reaches_the_caller(
    client_app, store, broker_urls, queue, start_worker, start_sweeper, tmp_path, result_backend
):
    # Given a published task whose message the broker then lost (purged behind Celery's back),
    (ledger,) = _ledgers(tmp_path, 1)
    result = client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 0.2))
    flush_publisher(client_app)
    with Connection(broker_urls[0]) as conn:
        assert conn.default_channel.queue_purge(queue) == 1
    published = time.monotonic()

    # when the sweep, in its own process, finds it not started within the queued timeout,
    queued_timeout = 3.0
    sweeper = start_sweeper(queued_timeout=queued_timeout)
    start_worker(concurrency=1)

    # then it is published again, runs once, and its result reaches the caller.
    _assert_results(
        [result], [ledger], [0.2], result_backend != "none", published + queued_timeout + 15
    )
    assert (count(ledger, "start"), count(ledger, "done")) == (1, 1), ledger_lines(ledger)
    first, _ = wait_for(
        lambda: (t := store.tries.history(result.id))[-1]["state"] == TaskState.SUCCESS and t,
        10,
        what="the success in the store",
    )
    assert first["state_reason"].startswith("message lost: not started within 3s")
    if result_backend != "redis":
        assert "the result backend cannot be asked" in first["state_reason"]
    assert "did not answer" not in sweeper.log


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("broker,result_backend", [("rabbitmq", "rpc")])
def test_a_task_failed_by_the_sweep_raises_in_the_caller(
    client_app, store, start_worker, start_sweeper, tmp_path
):
    # Given a task that may not be retried (max_retries=0) whose worker is killed,
    (ledger,) = _ledgers(tmp_path, 1)
    doomed = start_worker(name="doomed", concurrency=1)
    result = client_app.send_task("lifecycle.ledger_sleep_once", (str(ledger), 30))
    running_try(store, result.id)
    start_sweeper()
    doomed.kill()

    # then the sweep, in its own process, fails it, and the failure reaches the caller.
    with pytest.raises(Exception, match="max_retries") as raised:
        result.get(timeout=KILL_BOUND)
    assert type(raised.value).__name__ == "LostWorkerError"
    (only,) = store.tries.history(result.id)
    assert only["state"] == TaskState.FAILED
