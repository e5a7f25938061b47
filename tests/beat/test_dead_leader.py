"""A SIGKILLed beat leader is replaced within a second or so, whatever the lease's length.

The default preset's lease lasts a sweep interval (5 s): waiting for it to run
out leaves a gap of 5 to 7 s.  The standby looks at the leader's liveness
markers twice a second instead (the process marker on one host, the advisory
lock from anywhere), and takes the lease from a dead leader with a
compare-and-set on its token; each scheduled time still runs once.
"""

from __future__ import annotations

import signal
import time

import pytest
from sqlalchemy import update

from celery_recovery.beat.publish import run_task_id
from celery_recovery.beat_schedules import preset_settings
from celery_recovery.store.schema import jobs
from tests.beat.conftest import leader_pid, wait_for_leader
from tests.beat.test_ha_beat import ledger_runs
from tests.workers import wait_for

pytestmark = pytest.mark.slow

DEFAULT_ENV = {
    f"CELERY_RECOVERY_{k.upper()}": str(v) for k, v in preset_settings("default").items()
}
#: Kill to the next run on the worker: the issue's 2 s, with slack for the worker.
BOUND = 2.5


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
def test_a_killed_leader_is_replaced_before_its_lease_ends(
    store, store_url, start_ha_beat, start_beat_worker, tmp_path
):
    ledger = tmp_path / "runs.txt"
    schedule = {"every-second": {"task": "beat.ledger", "every": 1.0, "args": [str(ledger)]}}
    start_beat_worker(env=DEFAULT_ENV)
    beats = [start_ha_beat(schedule, env=DEFAULT_ENV) for _ in range(2)]
    leader = wait_for_leader(store, beats)
    standby = next(b for b in beats if b is not leader)
    wait_for(lambda: len(store.jobs.list_jobs("beat", "running")) == 2, 20, what="both beat jobs")
    if store.dialect == "postgresql":
        # As a standby on another host sees the leader: by its advisory lock alone.
        with store.transaction() as conn:
            conn.execute(update(jobs).where(jobs.c.job_type == "beat").values(process_marker=None))
    wait_for(lambda: len(ledger_runs(ledger)) >= 3, 30, what="three runs on the worker")

    leader.signal(signal.SIGKILL)
    killed = time.monotonic()
    before = len(ledger_runs(ledger))
    wait_for(lambda: len(ledger_runs(ledger)) > before, 15, 0.02, "the standby's first run")
    takeover = time.monotonic() - killed

    assert leader_pid(store) == standby.pid
    assert takeover < BOUND, f"the standby's first run came {takeover:.2f}s after the kill"
    wait_for(lambda: len(ledger_runs(ledger)) >= before + 3, 10, what="more runs")
    runs = ledger_runs(ledger)
    times = [at for _, at in runs]
    assert len(times) == len(set(times)), f"a scheduled time ran twice: {sorted(times)}"
    assert all(task_id == run_task_id("every-second", at) for task_id, at in runs)
