"""PostgreSQL, the store, restarted or cut off mid-run: tasks run on, nothing is lost.

Each case runs a stream of tasks through two real workers, injects the fault
into a private cluster, and checks that (1) tasks kept completing during and
after the fault, (2) every task's record reached ``success`` once the
write-behind buffers replayed, and (3) a worker SIGKILLed after the fault is
still recovered by a sweep.
"""

from __future__ import annotations

import time

import pytest

from celery_recovery import JobType, TaskState
from celery_recovery.recovery import recovery_for_app
from celery_recovery.store import Store
from tests.conftest import FAST_SETTINGS
from tests.faults.conftest import STORE_DB
from tests.faults.helpers import TaskStream, wait_all_succeeded, worker_running
from tests.sweeps.helpers import count, ledger_lines, sweep_until, try_started
from tests.workers import wait_for

pytestmark = pytest.mark.slow

ZOMBIE = FAST_SETTINGS["zombie_threshold"]
SWEEP = FAST_SETTINGS["sweep_interval"]


def inject(private_pg, fault: str) -> str:
    if fault.startswith("restart-"):
        took = private_pg.restart(fault.removeprefix("restart-"))
        return f"{fault}: down {took:.1f}s"
    # Drop every connection, three times, as a failover or an admin's kill would.
    killed = 0
    for _ in range(3):
        killed += private_pg.terminate_backends(STORE_DB)
        time.sleep(0.3)
    assert killed > 0, "no connection of the workers was open to terminate"
    return f"{fault}: {killed} backends"


@pytest.mark.parametrize("fault", ["restart-fast", "restart-immediate", "terminate"])
def test_store_fault_mid_run_loses_nothing_and_recovery_resumes(
    fault, private_pg, fault_pg_url, make_client_app, start_worker, tmp_path
):
    client = make_client_app(fault_pg_url)
    store = Store(fault_pg_url)
    workers = [start_worker(store_url=fault_pg_url, name=f"w{i}") for i in (1, 2)]
    # Each worker's main process and two pool processes.
    wait_for(lambda: len(store.jobs.list_jobs(JobType.WORKER)) == 6, what="the workers' jobs")

    with TaskStream(client) as stream:
        stream.wait_completed(20, 20, "tasks before the fault")
        what = inject(private_pg, fault)
        stream.wait_completed(40, 30, f"tasks to keep completing after {what}")
    ids = [r.id for r in stream.results]
    assert [r.get(timeout=30) for r in stream.results] == [i + 1 for i in range(len(ids))]
    took = wait_all_succeeded(store, ids, 45)
    print(f"{what}; {len(ids)} tasks, records final {took:.1f}s after the stream stopped")

    # Recovery resumed: a worker SIGKILLed now is still found and its task recovered.
    ledger = tmp_path / "ledger"
    result = client.send_task("lifecycle.ledger_sleep", (str(ledger), 4, 0.1))
    doomed = worker_running(store, result.id, workers)
    doomed.kill()
    killed = time.monotonic()
    sweep_until(client, lambda: try_started(store, result.id, 2), ZOMBIE + SWEEP + 20, "try 2")
    print(f"zombie recovered {time.monotonic() - killed:.1f}s after the kill")
    assert result.get(timeout=30) == 4
    assert count(ledger, "done") == 1, ledger_lines(ledger)
    tries = wait_for(
        lambda: (t := store.tries.history(result.id)) and t[-1]["state"] == TaskState.SUCCESS and t,
        10,
        what="the recovered try to succeed",
    )
    assert [t["state"] for t in tries] == [TaskState.UP_FOR_RETRY, TaskState.SUCCESS]
    assert recovery_for_app(client).sweep().errors == 0
    store.dispose()
