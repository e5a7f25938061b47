"""The console's Schedules page: the same facts as ``inspect schedules``."""

from __future__ import annotations

from datetime import timedelta

from celery_recovery.core.records import MissedRuns
from celery_recovery.core.timeutils import utcnow
from celery_recovery.store import BEAT_LEASE, Fence
from tests.web.helpers import console_client


def test_the_schedules_page_shows_the_leader_and_each_entrys_runs(store):
    now = utcnow()
    anchor = now - timedelta(seconds=30)
    store.beat.register_entries([{"name": "report", "task": "shop.report"}], anchor)
    token = store.leases.acquire_lease(BEAT_LEASE, "a:7@host", now, 60)
    run_at = anchor + timedelta(seconds=10)
    fence = Fence(BEAT_LEASE, "a:7@host", token)
    missed = MissedRuns(2, anchor, "beats down")
    store.beat.claim_run("report", anchor, run_at, "tid-1", fence, now, missed=missed)
    store.beat.mark_sent("report", "tid-1", token, now)
    with console_client(store.url) as client:
        data = client.get("/api/schedules").json()
        page = client.get("/schedules").text
    assert data["leader"]["holder"] == "a:7@host" and data["leader"]["token"] == token
    (row,) = data["rows"]
    assert (row["name"], row["last_task_id"], row["missed_count"]) == ("report", "tid-1", 2)
    assert "a:7@host" in page and "/tasks/tid-1" in page and "beats down" in page


def test_the_schedules_page_says_when_no_beat_leads(store):
    with console_client(store.url) as client:
        assert client.get("/api/schedules").json() == {"leader": None, "rows": []}
        assert "No beat leads" in client.get("/schedules").text
