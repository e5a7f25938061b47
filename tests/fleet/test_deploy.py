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
from celery_recovery.beat_schedules import preset_settings
from tests.conftest import FAST_SETTINGS
from tests.sweeps.helpers import count, ledger_lines, reserved_ids, running_try, sweep_until
from tests.workers import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.compat,
    pytest.mark.parametrize("store_url", ["postgresql"], indirect=True),
]

#: The running tasks' first run: longer than the grace period, short enough for a
#: warm shutdown to wait for.
LONG = 4.0
GRACE = 1.0


@pytest.mark.parametrize("acks_late", [False, True], ids=["early-ack", "acks-late"])
@pytest.mark.parametrize("stop", ["term-then-kill", "term", "cold"])
def test_every_task_of_a_stopped_worker_ends_success(
    client_app, store, start_worker, tmp_path, stop, acks_late
):
    _stop_a_worker_mid_deploy(client_app, store, start_worker, tmp_path, stop, acks_late)


def test_a_deploy_under_the_default_preset_ends_every_task_success(
    make_client_app, store_url, store, start_worker, tmp_path
):
    # The default preset's intervals (5 s heartbeats and sweeps, a 30 s threshold) beside
    # the fast ones above: the death, the reservations kept through the shutdown and the
    # sweep meet at other moments.
    default = preset_settings("default")
    names = ("heartbeat_interval", "zombie_threshold", "health_check_threshold", "sweep_interval")
    timing = {k: default[k] for k in names}
    client_app = make_client_app(store_url, **timing)
    worker_env = {f"CELERY_RECOVERY_{k.upper()}": str(v) for k, v in timing.items()}
    _stop_a_worker_mid_deploy(
        client_app, store, start_worker, tmp_path, "term-then-kill", True, worker_env, timing
    )


def _stop_a_worker_mid_deploy(
    client_app,
    store,
    start_worker,
    tmp_path,
    stop: str,
    acks_late: bool,
    worker_env: dict[str, str] | None = None,
    timing: dict[str, float] = FAST_SETTINGS,
) -> None:
    env = {"RECOVERY_TEST_PREFETCH": "4", **(worker_env or {})}
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
    bound = LONG + timing["zombie_threshold"] + 5 * timing["sweep_interval"] + 20
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
