"""One clock: a worker on another host whose wall clock is a minute off is judged as
one whose clock is right.

The worker runs under libfaketime (Debian's ``faketime``) in a UTS namespace of its
own with another host name (``unshare --uts``, root only), beside a sweep with the
right clock in the test process; the store is PostgreSQL, whose clock both follow.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from celery_recovery import JobState, TaskState
from celery_recovery.recovery import recovery_for_app
from tests.conftest import FAST_SETTINGS
from tests.services import in_ci
from tests.sweeps.helpers import count, ledger_lines, running_try, sweep_for, sweep_until
from tests.workers import ROOT, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("store_url", ["postgresql"], indirect=True),
]

ZOMBIE = FAST_SETTINGS["zombie_threshold"]
SWEEP = FAST_SETTINGS["sweep_interval"]
ELSEWHERE = str(ROOT / "tests" / "fleet" / "elsewhere.sh")
HOST = "skewed-host"


@pytest.fixture
def elsewhere():
    """The command prefix that runs a worker on 'another host' with its clock off."""
    missing = [tool for tool in ("faketime", "unshare") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        why = f"needs {', '.join(missing)} (apt-get install faketime)" if missing else "needs root"
        if in_ci():
            pytest.fail(f"the clock tests {why}; .ci/run installs faketime", pytrace=False)
        pytest.skip(f"the clock tests {why}")

    def prefix(offset: str) -> tuple[str, ...]:
        return ("unshare", "--uts", "sh", ELSEWHERE, HOST, offset)

    return prefix


@pytest.mark.parametrize("offset", ["-60s", "+60s", "-15s", "+15s"])
def test_a_live_worker_with_its_clock_off_is_never_taken_for_dead(
    client_app, store, start_worker, elsewhere, tmp_path, offset
):
    ledger = tmp_path / "ledger"
    worker = start_worker(name="skewed", concurrency=1, prefix=elsewhere(offset))
    # (its main process and its pool process)
    jobs = wait_for(
        lambda: (
            len(j := [j for j in store.jobs.list_jobs("worker") if j["hostname"] == HOST]) == 2
            and j
        ),
        15,
        what="the skewed worker's jobs",
    )
    # Given its task runs for several zombie thresholds while sweeps run beside it,
    result = client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 3 * ZOMBIE + 1))
    sweep_until(client_app, result.ready, 3 * ZOMBIE + 20, "the task to finish")

    # then no job of it was ended, and its try is its own, recorded by itself, once.
    assert result.get(timeout=5) == 3 * ZOMBIE + 1
    for job in jobs:
        assert store.jobs.get_job(job["id"])["state"] == JobState.RUNNING, job
    (only,) = wait_for(
        lambda: (t := store.tries.history(result.id))[-1]["state"] == TaskState.SUCCESS and t,
        10,
        what="the try's success",
    )
    assert only["job_id"] in {job["id"] for job in jobs}
    assert only["recovered_at"] is None, only["state_reason"]
    assert (count(ledger, "start"), count(ledger, "done")) == (1, 1), ledger_lines(ledger)
    assert "was marked failed while this process was alive" not in worker.log


@pytest.mark.parametrize("offset", ["-60s", "+60s"])
def test_a_killed_worker_with_its_clock_off_is_found_as_fast(
    client_app, store, start_worker, elsewhere, tmp_path, offset
):
    ledger = tmp_path / "ledger"
    doomed = start_worker(name="skewed", concurrency=1, prefix=elsewhere(offset))
    result = client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 60, 0.2))
    first = running_try(store, result.id)
    start_worker(name="survivor", concurrency=1)
    sweep_for(client_app, 2 * SWEEP)  # live, and judged so
    assert store.jobs.get_job(first["job_id"])["state"] == JobState.RUNNING

    doomed.kill()
    killed = time.monotonic()
    sweep_until(client_app, result.ready, ZOMBIE + SWEEP + 20, "the recovered task")
    took = time.monotonic() - killed
    print(f"\nclock {offset}: kill to the recovered task's result: {took:.1f}s")
    # As fast as without skew: the death found from its marker or its heartbeat, judged
    # on the store's clock (a 60 s skew would otherwise add or hide 60 s).
    assert took <= ZOMBIE + 2 * SWEEP + 4, took
    assert count(ledger, "done") == 1, ledger_lines(ledger)
    assert recovery_for_app(client_app).store.jobs.get_job(first["job_id"])["state"] == (
        JobState.FAILED
    )
