"""``inspect schedules``: the HA beat's entries, their runs, and who leads."""

from __future__ import annotations

from datetime import timedelta

from celery_recovery.beat.leadership import LEASE
from celery_recovery.cli import recovery
from celery_recovery.core.records import MissedRuns
from celery_recovery.core.timeutils import utcnow
from celery_recovery.store import Fence
from tests.cli.helpers import run, run_json


def test_schedules_show_the_leader_last_and_next_runs_and_missed_ones(store, store_url):
    now = utcnow()
    anchor = now - timedelta(seconds=30)
    store.beat.register_entries([{"name": "e", "task": "t", "schedule": "<every 10s>"}], anchor)
    token = store.leases.acquire_lease(LEASE, "a:1@h", now, 60)
    fence = Fence(LEASE, "a:1@h", token)
    run_at = anchor + timedelta(seconds=20)
    missed = MissedRuns(1, run_at - timedelta(10), "down")
    store.beat.claim_run("e", anchor, run_at, "tid", fence, now, missed=missed)
    store.beat.mark_sent("e", "tid", token, now)

    rows = run_json(store_url, "inspect", "schedules")
    assert len(rows) == 1
    row = rows[0]
    assert (row["name"], row["last_task_id"], row["missed_count"]) == ("e", "tid", 1)
    assert row["last_run_at"] == run_at.isoformat()
    assert (row["leader"], row["leader_token"], row["last_missed_reason"]) == ("a:1@h", 1, "down")

    table = run(store_url, "inspect", "schedules").output
    assert "leader: a:1@h (fencing token 1)" in table and "tid" in table


def test_schedules_say_when_no_beat_leads(store_url, store):
    output = run(store_url, "inspect", "schedules").output
    assert "leader: none" in output and "no beat entries" in output


def test_with_the_app_the_next_run_comes_from_its_schedule(store, make_client_app, store_url):
    app = make_client_app(store_url)
    app.conf.beat_schedule = {"e": {"task": "t", "schedule": 10.0}}
    anchor = utcnow() - timedelta(seconds=3)
    store.beat.register_entries([{"name": "e", "task": "t"}], anchor)
    from click.testing import CliRunner

    result = CliRunner().invoke(
        recovery,
        ["--database-url", store_url, "inspect", "schedules", "--json"],
        obj=type("Ctx", (), {"app": app})(),
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert '"next_run_at": "' + (anchor + timedelta(seconds=10)).isoformat() in result.output
