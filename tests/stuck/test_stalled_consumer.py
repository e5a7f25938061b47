"""A worker whose broker connection freezes fails its liveness probe; an idle one never does.

Real workers reach Redis through a TCP proxy; the test publishes straight to
Redis and freezes the proxy: bytes stop, every socket stays open, nothing in
the worker raises.  Its process, pool and heartbeats stay healthy.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from celery_recovery.core.states import TaskState
from celery_recovery.recovery import recovery_for_app
from tests.cli.helpers import run_json
from tests.faults.helpers import final_states
from tests.stuck.helpers import (
    DETECTION_BOUND,
    STALL_TIMEOUT,
    consumer_state,
    node_of,
    probe,
    stall_audit_rows,
    wait_stalled,
)
from tests.sweeps.helpers import count, sweep_until
from tests.workers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis]

#: Longer than the stall takes to detect and the worker to be replaced, so that only
#: the message the frozen connection took from Redis counts as lost.
QUEUED_TIMEOUT = 25.0


def _ledgers(tmp_path: Path, n: int) -> list[Path]:
    return [tmp_path / f"ledger-{i}.txt" for i in range(n)]


# The consumer's state and verdict are the worker's; the store only keeps them (its
# queries are tested on both in tests/cli and tests/web): one store each, for CI's time.
@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_frozen_broker_connection_fails_the_probe_within_the_bound_and_nothing_is_lost(
    start_proxied_worker, start_worker, broker_proxy, make_client_app, store_url, tmp_path
):
    proxy, _ = broker_proxy
    # Given a worker that reaches its broker through the proxy, and has run a task
    # (every process with one queued timeout: a message that waited longer than it is
    # published again, and a delivery older than half of it is checked before it runs)
    lost_after = {"CELERY_RECOVERY_QUEUED_TIMEOUT": str(QUEUED_TIMEOUT)}
    worker = start_proxied_worker(store_url, **lost_after)
    client = make_client_app(store_url, queued_timeout=QUEUED_TIMEOUT)
    assert client.send_task("lifecycle.add", (1, 2)).get(timeout=20) == 3
    assert probe(store_url, worker).exit_code == 0

    # When its broker connection freezes and four tasks are published meanwhile
    proxy.freeze()
    frozen_at = time.monotonic()
    ledgers = _ledgers(tmp_path, 4)
    results = [client.send_task("lifecycle.ledger_sleep", (str(p), 0)) for p in ledgers]

    # Then the probe fails, saying it is stalled, within the aggressive preset's bound
    failed, detected = wait_stalled(store_url, worker, frozen_at)
    assert "stalled: " in failed.output, failed.output
    assert detected <= DETECTION_BOUND, f"stall seen after {detected:.1f}s"
    print(f"frozen broker connection: stalled after {detected:.1f}s")
    # ... while its heartbeats to the store went on
    job = consumer_state(store_url, worker)
    assert job is not None and job["consumer"]["stalled"], job
    assert "Traceback" not in worker.log
    # ... and `inspect jobs` shows it stalled
    jobs = run_json(store_url, "inspect", "jobs", "--job-type", "worker")
    shown = [j["consumer"] for j in jobs if j["node_name"] == node_of(worker) and j["consumer"]]
    assert len(shown) == 1 and shown[0].startswith("stalled: "), jobs
    # ... with a warning in its log and an audit row
    wait_for(lambda: "this worker is stalled" in worker.log, 10, what="the warning")
    rows = wait_for(lambda: stall_audit_rows(store_url), 10, what="the audit row")
    assert rows[0]["detail"].startswith("stalled: ") and rows[0]["job_id"] == job["id"]

    # When the stalled worker is replaced (its supervisor restarts it)
    worker.kill()
    proxy.cut()
    start_worker(store_url, name="replacement", env=lost_after)

    # Then every task published during the stall runs exactly once (a message the
    # frozen connection had already taken from Redis is published again as lost)
    ids = [r.id for r in results]
    sweep_until(
        client,
        lambda: (
            set(final_states(recovery_for_app(client).store, ids).values()) == {TaskState.SUCCESS}
        ),
        60,
        "every task to succeed",
    )
    assert [count(p, "done") for p in ledgers] == [1, 1, 1, 1]


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_an_idle_worker_with_empty_queues_keeps_passing_the_probe(start_proxied_worker, store_url):
    # Given an idle worker whose queues are empty (its jobs registered)
    worker = start_proxied_worker(store_url)
    wait_for(lambda: probe(store_url, worker).exit_code == 0, 10, what="its jobs to register")

    # When it stays idle for longer than the stall timeout, asking the broker meanwhile
    deadline = time.monotonic() + STALL_TIMEOUT * 1.5
    while time.monotonic() < deadline:
        # Then every probe passes
        result = probe(store_url, worker)
        assert result.exit_code == 0, result.output
        time.sleep(0.5)
    state = consumer_state(store_url, worker)["consumer"]
    assert state["probed_at"] is not None and state["ready"] == 0, state
    assert not state["stalled"] and stall_audit_rows(store_url) == []


def test_a_half_open_consumer_connection_is_stalled_by_the_ready_messages_it_does_not_take(
    start_proxied_worker, broker_proxy, make_client_app, tmp_path
):
    proxy, _ = broker_proxy
    store_url = f"sqlite:///{tmp_path / 'recovery.sqlite3'}"
    # Given an idle worker whose consumer's connection goes half-open, while a new
    # connection to the broker still works (a NAT entry dropped)
    worker = start_proxied_worker(store_url)
    client = make_client_app(store_url)
    proxy.freeze(new_connections=False)
    frozen_at = time.monotonic()

    # When tasks wait in its queue
    ledgers = _ledgers(tmp_path, 3)
    results = [client.send_task("lifecycle.ledger_sleep", (str(p), 0)) for p in ledgers]

    # Then it is stalled by the messages its queue holds and it does not take
    failed, detected = wait_stalled(store_url, worker, frozen_at)
    assert "ready messages in its queues" in failed.output, failed.output
    assert detected <= DETECTION_BOUND, f"stall seen after {detected:.1f}s"
    print(f"half-open consumer: stalled after {detected:.1f}s")
    # ... while the worker itself, alive and heartbeating, ran none of them
    assert not any(r.ready() for r in results)


def test_a_stalled_worker_set_to_exit_shuts_itself_down(
    start_proxied_worker, broker_proxy, make_client_app, tmp_path
):
    proxy, _ = broker_proxy
    store_url = f"sqlite:///{tmp_path / 'recovery.sqlite3'}"
    # Given a worker told to exit when stalled
    worker = start_proxied_worker(store_url, CELERY_RECOVERY_ON_STALLED_CONSUMER="exit")
    client = make_client_app(store_url)

    # When its broker connection freezes while a task waits
    proxy.freeze()
    frozen_at = time.monotonic()
    client.send_task("lifecycle.add", (1, 2))

    # Then it shuts itself down, warm (its supervisor would start it again)
    # (its main thread is blocked in a read of the frozen connection: warm, then cold
    # shutdown wait for it a stall timeout each, then the process ends itself)
    wait_for(
        lambda: worker.proc.poll() is not None, DETECTION_BOUND + 40, what="the worker to exit"
    )
    print(f"exit on stall: the worker exited {time.monotonic() - frozen_at:.1f}s after the freeze")
    assert "shutting down warm" in worker.log
    # ... and its pool processes with it
    group = str(worker.proc.pid)
    wait_for(
        lambda: not subprocess.run(["pgrep", "-g", group], capture_output=True).stdout,
        10,
        what="the worker's pool processes to end",
    )


def test_a_warm_shutdown_waiting_for_a_long_task_is_not_a_stall(
    start_proxied_worker, make_client_app, tmp_path
):
    store_url = f"sqlite:///{tmp_path / 'recovery.sqlite3'}"
    # Given a worker set to exit when stalled, running a task longer than the stall timeout
    worker = start_proxied_worker(store_url, CELERY_RECOVERY_ON_STALLED_CONSUMER="exit")
    client = make_client_app(store_url)
    long = client.send_task("lifecycle.sleep_for", (STALL_TIMEOUT + 5,))
    wait_for(lambda: long.state == "STARTED", 20, what="the long task to start")

    # When it is told to shut down warm while messages wait in its queue (it has a free
    # slot, receives nothing, and its queue holds ready messages for longer than the timeout)
    worker.proc.send_signal(signal.SIGTERM)
    for n in range(3):
        client.send_task("lifecycle.add", (n, 1))

    # Then it waits for its task and exits cleanly: a shutdown is not a stall
    assert long.get(timeout=STALL_TIMEOUT + 20) == STALL_TIMEOUT + 5
    wait_for(lambda: worker.proc.poll() is not None, 20, what="the worker to exit")
    assert worker.proc.returncode == 0
    assert "stalled" not in worker.log and "shutting down cold" not in worker.log
