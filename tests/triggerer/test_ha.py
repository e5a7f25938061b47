"""Several triggerers share the work: a killed one's triggers move, queues isolate, SIGTERM
hands off."""

from __future__ import annotations

import collections
import time

import pytest

from tests.conftest import FAST_SETTINGS
from tests.sweeps.helpers import ledger_lines
from tests.workers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)]


def _held_by(store, job_id: str) -> list[dict]:
    return [t for t in store.triggers.list_triggers() if t["triggerer_id"] == job_id]


def _resumed(ledger) -> collections.Counter:
    return collections.Counter(
        line.split()[1] for line in ledger_lines(ledger) if line.startswith("resumed")
    )


def _defer(client_app, store, ledger, count: int, seconds: float, queue: str = "default"):
    results = [
        client_app.tasks["lifecycle.wait"].delay(str(ledger), seconds, queue=queue)
        for _ in range(count)
    ]
    ids = {r.id for r in results}
    wait_for(
        lambda: len({t["task_id"] for t in store.triggers.list_triggers()} & ids) == count,
        60,
        what=f"{count} deferred tasks",
    )
    return results


def test_a_killed_triggerers_triggers_complete_on_the_other_once(
    client_app, store, start_worker, start_triggerer, tmp_path
):
    ledger = tmp_path / "ledger"
    start_worker(concurrency=2)
    first = start_triggerer()
    first_id = first.job_id(store)
    results = _defer(client_app, store, ledger, 100, 8.0)
    wait_for(lambda: len(_held_by(store, first_id)) == 100, 20, what="the first to hold all")
    second = start_triggerer()
    second_id = second.job_id(store)
    latest_due = max(t["kwargs"]["until"] for t in store.triggers.list_triggers())
    first.kill()
    killed_at = time.monotonic()

    from celery_recovery.core.timeutils import as_utc, utcnow

    delay = max((as_utc(latest_due) - utcnow()).total_seconds(), 0)
    bound = FAST_SETTINGS["health_check_threshold"] + FAST_SETTINGS["sweep_interval"] + delay + 5
    for result in results:
        left = bound - (time.monotonic() - killed_at)
        assert result.get(timeout=max(left, 0.1))["event"]["pid"] == second.pid
    assert time.monotonic() - killed_at <= bound
    resumed = _resumed(ledger)
    assert set(resumed) == {r.id for r in results}
    assert set(resumed.values()) == {1}, "a task resumed twice"
    assert _held_by(store, second_id) == []


def test_queues_keep_triggers_apart_and_capacity_is_never_exceeded(
    client_app, store, start_worker, start_triggerer, tmp_path
):
    ledger = tmp_path / "ledger"
    start_worker(concurrency=2)
    team_a = start_triggerer("--queues", "team-a", "--capacity", "3")
    team_b = start_triggerer("--queues", "team-b")
    a_id, _ = team_a.job_id(store), team_b.job_id(store)
    a_results = _defer(client_app, store, ledger, 10, 1.0, queue="team-a")
    b_results = _defer(client_app, store, ledger, 4, 1.0, queue="team-b")
    most = 0

    def all_done():
        nonlocal most
        most = max(most, len(_held_by(store, a_id)))
        return all(r.ready() for r in a_results + b_results)

    wait_for(all_done, 60, interval=0.02, what="every deferred task")
    assert 0 < most <= 3
    assert {r.get()["event"]["pid"] for r in a_results} == {team_a.pid}
    assert {r.get()["event"]["pid"] for r in b_results} == {team_b.pid}


def test_sigterm_hands_the_triggers_to_another_triggerer_at_once(
    client_app, store, start_worker, start_triggerer, tmp_path
):
    ledger = tmp_path / "ledger"
    # A threshold far longer than the test: only the release can explain a quick move.
    slow_to_suspect = {"CELERY_RECOVERY_HEALTH_CHECK_THRESHOLD": "60"}
    start_worker(concurrency=2)
    first = start_triggerer(env=slow_to_suspect)
    first_id = first.job_id(store)
    results = _defer(client_app, store, ledger, 10, 6.0)
    wait_for(lambda: len(_held_by(store, first_id)) == 10, 20, what="the first to hold all")
    second = start_triggerer(env=slow_to_suspect)
    second_id = second.job_id(store)
    started = time.monotonic()
    assert first.terminate(timeout=10) == 0
    assert time.monotonic() - started < 5, "the triggerer took too long to shut down"
    wait_for(lambda: len(_held_by(store, second_id)) == 10, 5, what="the second to take all")
    assert "released 10 triggers" in first.log
    assert {r.get(timeout=30)["event"]["pid"] for r in results} == {second.pid}
    assert set(_resumed(ledger).values()) == {1}
    [job] = [j for j in store.jobs.list_jobs(job_type="triggerer") if j["id"] == first_id]
    assert job["state"] == "success"


def test_a_killed_triggerers_triggers_are_taken_over_within_a_second_or_so(
    client_app, store, start_worker, start_triggerer, tmp_path
):
    """Default preset (a dead triggerer counts after 30 s of silence): the other triggerer's
    marker watch finds the death by its advisory lock and claims at once."""
    from sqlalchemy import update

    from celery_recovery.beat_schedules import preset_settings
    from celery_recovery.store.schema import jobs

    env = {f"CELERY_RECOVERY_{k.upper()}": str(v) for k, v in preset_settings("default").items()}
    ledger = tmp_path / "ledger"
    start_worker(concurrency=2)
    first = start_triggerer(env=env)
    first_id = first.job_id(store)
    results = _defer(client_app, store, ledger, 20, 6.0)
    wait_for(lambda: len(_held_by(store, first_id)) == 20, 20, what="the first to hold all")
    second = start_triggerer(env=env)
    second_id = second.job_id(store)
    # As a triggerer on another host sees the first: by its advisory lock alone.
    with store.transaction() as conn:
        conn.execute(update(jobs).where(jobs.c.job_type == "triggerer").values(process_marker=None))
    time.sleep(1.5)  # the second's watch has seen the first's lock held

    first.kill()
    killed_at = time.monotonic()
    wait_for(lambda: len(_held_by(store, second_id)) == 20, 20, 0.02, "the second to hold all")
    taken_over = time.monotonic() - killed_at

    assert taken_over < 3.0, f"taken over {taken_over:.2f}s after the kill"
    for result in results:
        assert result.get(timeout=30)["event"]["pid"] == second.pid
    resumed = _resumed(ledger)
    assert set(resumed) == {r.id for r in results}
    assert set(resumed.values()) == {1}, "a task resumed twice"
