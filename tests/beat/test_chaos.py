"""A bounded chaos run: three beats SIGKILLed, restarted and paused at random.

With ``catch_up="all"`` no scheduled time may be lost either, so the worker's
ledger must hold every scheduled time of the entry, from its first run to its
last, exactly once.  About 40 s of faults in CI; ``RECOVERY_TEST_BEAT_CHAOS_SECONDS``
runs it longer (the timeout scales with it); the seed is printed.
"""

from __future__ import annotations

import os
import random
import signal
import time
from datetime import timedelta

import pytest

from celery_recovery.beat.publish import run_task_id
from tests.beat.test_ha_beat import ledger_runs
from tests.workers import wait_for

pytestmark = pytest.mark.slow

CHAOS_SECONDS = float(os.environ.get("RECOVERY_TEST_BEAT_CHAOS_SECONDS") or 40)


@pytest.mark.timeout(CHAOS_SECONDS + 140)
@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_every_scheduled_time_runs_once_while_beats_die_and_pause(
    store, start_ha_beat, start_beat_worker, tmp_path
):
    seed = int(os.environ.get("RECOVERY_TEST_SEED") or time.time())
    rng = random.Random(seed)
    print(f"chaos seed {seed} (RECOVERY_TEST_SEED={seed} repeats it)")
    ledger = tmp_path / "runs.txt"
    schedule = {
        "every-second": {
            "task": "beat.ledger",
            "every": 1.0,
            "args": [str(ledger)],
            "options": {"recovery": {"catch_up": "all"}},
        }
    }
    start_beat_worker()
    beats = [start_ha_beat(schedule) for _ in range(3)]
    wait_for(lambda: len(ledger_runs(ledger)) >= 2, 30, what="the first runs")

    events = []
    ends = time.monotonic() + CHAOS_SECONDS
    while time.monotonic() < ends:
        slot = rng.randrange(len(beats))
        beat = beats[slot]
        action = rng.choice(("kill", "pause", "wait"))
        if action == "kill":
            beat.kill()
            events.append(f"kill {beat.pid}")
            time.sleep(rng.uniform(0.5, 2.0))  # the slot stays empty a moment
            beats[slot] = start_ha_beat(schedule)
        elif action == "pause":
            beat.signal(signal.SIGSTOP)
            events.append(f"pause {beat.pid}")
            time.sleep(rng.uniform(1.5, 3.0))  # past the 1 s lease, often
            beat.signal(signal.SIGCONT)
        else:
            time.sleep(rng.uniform(0.5, 2.0))
    print("chaos:", ", ".join(events))

    # When the faults stop, the schedule settles
    settled = store.beat.entry("every-second")["last_run_at"] + timedelta(seconds=3)
    wait_for(
        lambda: (
            (row := store.beat.entry("every-second"))["last_run_at"] >= settled
            and row["pending_task_id"] is None
        ),
        30,
        what="the schedule to settle",
    )
    last = store.beat.entry("every-second")["last_sent_run_at"]
    wait_for(lambda: any(at == last for _, at in ledger_runs(ledger)), 20, what="the last run")

    # Then every scheduled time from the first to the last ran exactly once
    runs = ledger_runs(ledger)
    times = sorted(at for _, at in runs)
    twice = sorted({t for t in times if times.count(t) > 1})
    assert not twice, f"scheduled times that ran twice: {twice}"
    expected = round((last - times[0]).total_seconds()) + 1
    ran = [t for t in times if t <= last]
    assert len(ran) == expected, f"{expected - len(ran)} scheduled times never ran"
    assert all(task_id == run_task_id("every-second", at) for task_id, at in runs)
    assert store.beat.entry("every-second")["missed_count"] == 0
    with store.transaction() as conn:
        taken = conn.exec_driver_sql(
            "SELECT count(*) FROM audit_log WHERE action = 'beat_lead_taken'"
        ).scalar()
        resent = conn.exec_driver_sql(
            "SELECT count(*) FROM audit_log WHERE action = 'beat_resent'"
        ).scalar()
    print(f"{len(ran)} runs, {taken} takeovers, {resent} claimed runs taken over")
