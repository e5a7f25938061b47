"""Several real beats, one leader: each scheduled time is published once.

Beats run ``celery_recovery.beat:Scheduler`` as ``celery beat`` subprocesses with
the tests' fast settings (heartbeat 0.5 s, sweep interval 1 s: a lease of 1 s,
renewed every 0.25 s), so the bound for a takeover is a sweep plus a
heartbeat interval: 1.5 s.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from celery_recovery import JobType
from celery_recovery.beat.publish import run_task_id
from celery_recovery.core.timeutils import utcnow
from celery_recovery.sweeps.runner import SWEEP_COMPLETION
from tests.beat.conftest import leader_pid, queued_runs, wait_for_leader
from tests.cli.helpers import run
from tests.conftest import FAST_SETTINGS
from tests.workers import wait_for

pytestmark = pytest.mark.slow

EVERY_SECOND = {"every-second": {"task": "lifecycle.noop", "every": 1.0}}
#: A sweep interval plus a heartbeat interval (the bound of a dead worker).
BOUND = FAST_SETTINGS["sweep_interval"] + FAST_SETTINGS["heartbeat_interval"]
HEALTH = FAST_SETTINGS["health_check_threshold"]


def assert_each_time_once(runs, entry="every-second"):
    times = [t for name, _, t in runs]
    duplicates = [t for t, n in Counter(times).items() if n > 1]
    assert not duplicates, f"scheduled times published twice: {duplicates}"
    for _, task_id, at in runs:
        assert task_id == run_task_id(entry, at)


def ledger_runs(path) -> list[tuple[str, datetime]]:
    """(task id, scheduled time) of every run a worker ran, in order."""
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(task_id, datetime.fromisoformat(at)) for task_id, at in lines]


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql", "pgbouncer"], indirect=True)
def test_the_standby_publishes_the_next_run_within_the_bound_after_a_sigkill(
    store, store_url, start_ha_beat, start_beat_worker, tmp_path
):
    # Given a worker and two beats running a 1 s entry (and the recovery sweep)
    ledger = tmp_path / "runs.txt"
    schedule = {"every-second": {"task": "beat.ledger", "every": 1.0, "args": [str(ledger)]}}
    start_beat_worker()
    beats = [start_ha_beat(schedule, sweep=True), start_ha_beat(schedule, sweep=True)]
    leader = wait_for_leader(store, beats)
    standby = next(b for b in beats if b is not leader)
    wait_for(lambda: len(ledger_runs(ledger)) >= 3, 30, what="three runs on the worker")
    # The standby is a live beat job, as the leader is (liveness probes pass on both)
    live = store.jobs.live_jobs(utcnow(), HEALTH, JobType.BEAT)
    assert {leader.pid, standby.pid} <= {job["pid"] for job in live}

    # When the leader is SIGKILLed
    leader.signal(signal.SIGKILL)
    killed = time.monotonic()
    before = len(ledger_runs(ledger))

    # Then the standby's first run reaches the worker within the bound
    wait_for(lambda: len(ledger_runs(ledger)) > before, BOUND + 3, 0.02, "the standby's run")
    takeover = time.monotonic() - killed
    assert leader_pid(store) == standby.pid
    assert takeover < BOUND + 0.5, f"the standby's run ran {takeover:.2f}s after the kill"
    wait_for(lambda: len(ledger_runs(ledger)) >= before + 3, 10, what="more runs")

    # And each scheduled time ran once; the times the gap skipped are counted as missed
    runs = ledger_runs(ledger)
    times = [at for _, at in runs]
    assert len(times) == len(set(times)), f"a scheduled time ran twice: {sorted(times)}"
    assert all(task_id == run_task_id("every-second", at) for task_id, at in runs)
    row = store.beat.entry("every-second")
    span = round((row["last_run_at"] - min(times)).total_seconds()) + 1
    ran_by_then = [t for t in times if t <= row["last_run_at"]]
    assert len(ran_by_then) + row["missed_count"] == span, (ran_by_then, row)
    # The probe passes on the standby that now leads, the killed leader long silent
    wait_for(
        lambda: (
            not any(
                job["pid"] == leader.pid
                for job in store.jobs.live_jobs(utcnow(), HEALTH, JobType.BEAT)
            )
        ),
        10,
        what="the killed leader's heartbeat to go stale",
    )
    probe = run(store_url, "jobs", "check", "--job-type", "beat")
    assert probe.exit_code == 0 and f"pid {standby.pid}" in probe.output, probe.output
    # The recovery sweep entry ran under this scheduler too
    assert store.checkins.last_completed(SWEEP_COMPLETION) is not None
    print(f"takeover after SIGKILL, to the run on the worker: {takeover:.3f}s (bound {BOUND}s)")


def test_a_leader_paused_past_its_lease_publishes_nothing_when_it_wakes(
    store, start_ha_beat, broker_urls, queue
):
    # Given two beats running a 1 s entry
    beats = [start_ha_beat(EVERY_SECOND), start_ha_beat(EVERY_SECOND)]
    leader = wait_for_leader(store, beats)
    standby = next(b for b in beats if b is not leader)
    wait_for(lambda: len(queued_runs(broker_urls[0], queue)) >= 2, 20, what="two runs")

    # When the leader is stopped past its lease, and the standby takes over
    leader.signal(signal.SIGSTOP)
    wait_for(lambda: leader_pid(store) == standby.pid, BOUND + 3, what="the standby to lead")
    published = len(queued_runs(broker_urls[0], queue))
    wait_for(lambda: len(queued_runs(broker_urls[0], queue)) >= published + 2, 10, what="runs")
    # and then resumed
    log_before = len(leader.log)
    leader.signal(signal.SIGCONT)
    wait_for(lambda: "lost the lead" in leader.log[log_before:], 10, what="the old leader to yield")
    resumed = len(queued_runs(broker_urls[0], queue))
    wait_for(lambda: len(queued_runs(broker_urls[0], queue)) >= resumed + 3, 10, what="runs")

    # Then the woken leader sent nothing, and no scheduled time was published twice
    assert "sending every-second" not in leader.log[log_before:]
    assert leader_pid(store) == standby.pid
    assert_each_time_once(queued_runs(broker_urls[0], queue))


def test_runs_missed_while_every_beat_was_down_follow_each_entrys_catch_up_policy(
    store, start_ha_beat, broker_urls, queue
):
    schedule = {
        "latest": {"task": "lifecycle.noop", "every": 1.0},
        "all": {
            "task": "lifecycle.noop",
            "every": 1.0,
            "options": {"recovery": {"catch_up": "all"}},
        },
        "skip": {
            "task": "lifecycle.noop",
            "every": 1.0,
            "options": {"recovery": {"catch_up": "skip"}},
        },
    }
    # Given a beat that ran the entries, then died
    beat = start_ha_beat(schedule)
    wait_for(lambda: len(queued_runs(broker_urls[0], queue)) >= 6, 20, what="runs")
    beat.signal(signal.SIGKILL)
    beat.kill()
    last = {row["name"]: row["last_run_at"] for row in store.beat.entries()}
    down = time.monotonic()
    # When no beat runs for 4 s, and then one starts
    wait_for(lambda: time.monotonic() - down > 4, 6, 0.1, "the schedule to fall behind")
    start_ha_beat(schedule)
    wait_for(
        lambda: all(
            store.beat.entry(n)["last_run_at"] > last[n] + timedelta(seconds=6) for n in last
        ),
        30,
        what="the new beat to catch up and go on",
    )

    runs = queued_runs(broker_urls[0], queue)
    by_entry = {n: sorted(t for name, tid, t in runs if tid == run_task_id(n, t)) for n in schedule}
    for name, times in by_entry.items():
        assert len(times) == len(set(times)), f"{name}: a time published twice"
    with store.transaction() as conn:
        took = [r[0] for r in conn.exec_driver_sql(
            "SELECT at FROM audit_log WHERE action = 'beat_lead_taken' ORDER BY id"
        )]  # fmt: skip
        actions = Counter(r[0] for r in conn.exec_driver_sql("SELECT action FROM audit_log"))
    assert len(took) == 2
    takeover = datetime.fromisoformat(str(took[1]))
    takeover = takeover if takeover.tzinfo else takeover.replace(tzinfo=UTC)
    rows = {row["name"]: row for row in store.beat.entries()}
    for name, times in by_entry.items():
        after = [t for t in times if t > last[name]]
        # the scheduled times between the last run before the outage and the first after
        between = round((after[0] - last[name]).total_seconds()) - 1
        assert all(round((b - a).total_seconds()) == 1 for a, b in pairwise(after)), after
        # Then "all" sent every missed run; "latest" and "skip" only the newest due one
        if name == "all":
            assert between == 0 and rows[name]["missed_count"] == 0, (after, rows[name])
        else:
            assert between >= 3, (name, after)
            assert rows[name]["missed_count"] == between, (name, rows[name])
            assert after[0] >= takeover - timedelta(seconds=1), (name, after[0], takeover)
    # "all" sent late runs; "latest" and "skip" recorded missed ones
    assert (actions["beat_caught_up"], actions["beat_skipped"]) == (1, 2)
