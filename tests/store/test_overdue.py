"""Overdue tries: a running try far past its task's usual duration is flagged, on SQLite and
PostgreSQL, with the clock moved instead of waited for; nothing is ever written."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from celery_recovery.core.overdue import OverduePolicy, percentile
from celery_recovery.core.states import TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.store import Store
from tests.builders import add_history, add_running

POLICY = OverduePolicy(factor=3.0, min_runs=20, min_seconds=60.0)


def overdue_ids(store: Store, at: datetime) -> list[str]:
    return [row["task_id"] for row in store.overdue.find(at, POLICY)]


def test_a_running_try_is_overdue_past_factor_times_the_usual_duration_not_before(store):
    # Given 20 successful runs of 100 s (one slow run of 150 s among them) and a try running
    now = utcnow()
    add_history(store, "shop.import", now, [100.0] * 19 + [150.0])
    task_id = add_running(store, "shop.import", now)

    # Then it is not overdue at 3 x 100 s, and is just after
    assert overdue_ids(store, now + timedelta(seconds=299)) == []
    [row] = store.overdue.find(now + timedelta(seconds=301), POLICY)
    assert (row["task_id"], row["try_number"], row["task_name"]) == (task_id, 1, "shop.import")
    assert (row["bound"], row["usual"], row["runs"], row["age"]) == (300.0, 100.0, 20, 301.0)
    assert row["worker_hostname"] == "celery@host-a"
    assert row["last_beat"] is None


def test_a_task_with_too_little_history_is_never_overdue(store):
    now = utcnow()
    add_history(store, "shop.rare", now, [10.0] * 19)
    add_running(store, "shop.rare", now)

    assert overdue_ids(store, now + timedelta(days=2)) == []


def test_a_finished_try_is_not_overdue(store):
    now = utcnow()
    add_history(store, "shop.import", now, [10.0] * 20)
    task_id = add_running(store, "shop.import", now)
    assert overdue_ids(store, now + timedelta(hours=1)) == [task_id]

    assert store.tries.transition(
        task_id, 1, TaskState.RUNNING, TaskState.SUCCESS, ended_at=now + timedelta(hours=1)
    )

    assert overdue_ids(store, now + timedelta(hours=2)) == []


def test_a_quick_task_is_overdue_only_after_the_minimum(store):
    # Given a task that takes 1 s: 3 s would be its bound, but no try is flagged under 60 s
    now = utcnow()
    add_history(store, "shop.ping", now, [1.0] * 30)
    slow = add_running(store, "shop.ping", now)
    other = add_running(store, "shop.other", now)  # no history at all

    assert overdue_ids(store, now + timedelta(seconds=59)) == []
    [row] = store.overdue.find(now + timedelta(seconds=61), POLICY)
    assert (row["task_id"], row["bound"]) == (slow, 60.0)
    assert other not in overdue_ids(store, now + timedelta(days=1))


def test_an_overdue_try_shows_its_last_heartbeat(store):
    now = utcnow()
    add_history(store, "shop.import", now, [10.0] * 20)
    task_id = add_running(store, "shop.import", now)
    assert store.task_heartbeats.beat(task_id, 1, now + timedelta(seconds=5), None) is True

    [row] = store.overdue.find(now + timedelta(seconds=100), POLICY)
    assert row["last_beat"] == now + timedelta(seconds=5)


def test_the_sample_is_the_newest_successful_runs_of_the_task(store):
    # Given 200 recent runs of 10 s, and older runs of 1000 s past the sample
    now = utcnow()
    add_history(store, "shop.import", now - timedelta(days=1), [1000.0] * 50)
    add_history(store, "shop.import", now, [10.0] * 200)
    task_id = add_running(store, "shop.import", now)

    assert overdue_ids(store, now + timedelta(seconds=61)) == [task_id]


def test_percentile_and_bound():
    assert percentile([5.0, 1.0, 3.0]) == 5.0
    assert percentile([float(i) for i in range(1, 101)]) == 95.0
    # One hang that ended in success does not move the bound of a task with enough runs.
    assert POLICY.bound([100.0] * 19 + [10_000.0]) == (300.0, 100.0)
    assert POLICY.bound([100.0] * 19) is None
    assert OverduePolicy(2.0, 1, 1.0).bound([0.1]) == (1.0, 0.1)


@pytest.mark.parametrize(
    ("value", "allowed"),
    [(0.5, False), ("2", True), (True, False), ("x", False), (1, True), (10**400, False)],
)
def test_overdue_factor_is_validated(value, allowed):
    from celery_recovery.core.errors import ConfigurationError
    from celery_recovery.core.settings import RecoverySettings

    if allowed:
        assert RecoverySettings.from_sources({"recovery_overdue_factor": value}, {}).overdue_factor
        return
    with pytest.raises(ConfigurationError, match="recovery_overdue_factor"):
        RecoverySettings.from_sources({"recovery_overdue_factor": value}, {})
