"""The console's JSON API over real stores (SQLite and PostgreSQL): what the pages show.

Decisions come from a real sweep (zombies made in the store, republished through
real Redis), so the audit log is checked end to end: written in the sweep's
transaction, read back by the console.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import redis

from celery_recovery.core.timeutils import utcnow
from celery_recovery.locks.redis_lock import IdempotencyLocks
from celery_recovery.recovery import recovery_for_app
from tests.builders import add_history, add_job, add_running, add_trigger, add_try, make_zombie
from tests.services import BROKER_DB
from tests.web.helpers import console_client


@pytest.fixture
def client(store):
    with console_client(store.url) as client:
        yield client


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql", "pgbouncer"], indirect=True)
def test_a_swept_zombie_is_in_the_audit_log_with_its_dead_process(store, client_app, client):
    # Given a try running in a worker that stopped heartbeating a minute ago
    make_zombie(store, "t1", age=60.0)
    # When a sweep resets it
    assert recovery_for_app(client_app).sweep().republished == 1
    # Then Recoveries lists the decision: the try, the dead process, why, what was done
    rows = client.get("/api/recoveries").json()["rows"]
    # (newest first: the retry callback the reset made due was delivered after it)
    assert [r["action"] for r in rows] == ["callback_delivered", "republished"]
    row = rows[1]
    assert (row["task_id"], row["try_number"], row["action"], row["reason"]) == (
        "t1",
        1,
        "republished",
        "worker_lost",
    )
    assert (row["hostname"], row["pid"], row["job_id"]) == ("gone", 4242, "deadjob")
    assert 59 <= row["recovery_seconds"] < 90
    assert "retried as try 2" in row["detail"]
    # And the task's timeline shows try 1 up_for_retry (with the decision) then try 2
    task = client.get("/api/tasks/t1").json()
    assert [(t["try_number"], t["state"]) for t in task["tries"]] == [
        (1, "up_for_retry"),
        (2, "queued"),
    ]
    decisions = [d["action"] for d in task["tries"][0]["decisions"]]
    assert decisions == ["republished", "callback_delivered"]
    assert task["tries"][0]["process"]["hostname"] == "gone"
    # And arguments are hidden unless asked for
    assert task["tries"][0]["args"].startswith("hidden")
    # And the overview has the sweep's report and the recovery in the last hour
    overview = client.get("/api/overview").json()
    assert overview["last_sweep"]["report"]["zombies"] == 1
    assert overview["recoveries_per_hour"][-1]["count"] == 1
    assert overview["counts"]["running"] == 0


def test_show_args_shows_arguments(store):
    add_try(store, "success", task_id="shown")
    with console_client(store.url, show_args=True) as client:
        assert client.get("/api/tasks/shown").json()["tries"][0]["args"] == [1]


def test_recoveries_page_by_keyset_and_filter(store, client_app, client):
    for i in range(5):
        make_zombie(store, f"z{i}", job_id=f"dead{i}", age=60.0)
    assert recovery_for_app(client_app).sweep().republished == 5
    only_resets = {"action": "republished", "limit": 2}
    first = client.get("/api/recoveries", params=only_resets).json()
    assert len(first["rows"]) == 2 and first["next_before"]
    seen = [r["id"] for r in first["rows"]]
    before = first["next_before"]
    while before:
        page = client.get("/api/recoveries", params={**only_resets, "before": before}).json()
        seen += [r["id"] for r in page["rows"]]
        before = page["next_before"]
    assert len(seen) == len(set(seen)) == 5 and seen == sorted(seen, reverse=True)
    only = client.get("/api/recoveries", params={"task_id": "z3", "reason": "worker_lost"})
    only = only.json()["rows"]
    assert [r["task_id"] for r in only] == ["z3"]
    assert client.get("/api/recoveries", params={"action": "failed"}).json()["rows"] == []


def test_search_by_name_pages_newest_first(store, client):
    now = utcnow()
    ids = [
        add_try(store, "success", task_name="shop.ship", now=now + timedelta(seconds=i))
        for i in range(5)
    ]
    add_try(store, "success", task_name="shop.other")
    found, before = [], None
    while True:
        params = {"q": "shop.ship", "limit": 2, **({"before": before} if before else {})}
        page = client.get("/api/tasks", params=params).json()
        found += [r["task_id"] for r in page["rows"]]
        assert all("args" not in r for r in page["rows"])
        before = page["next_before"]
        if not before:
            break
    assert found == ids[::-1]
    by_id = client.get("/api/tasks", params={"q": ids[0]}).json()["rows"]
    assert [r["task_id"] for r in by_id] == [ids[0]]
    assert client.get("/api/tasks/no-such-task").status_code == 404


def test_jobs_deferred_and_callbacks(store, client):
    live = add_job(store, "worker", hostname="w1")
    late = add_job(store, "triggerer", heartbeat_age=120, hostname="t1")
    for _ in range(3):
        add_job(store, "worker", state="success", ended_age=10, hostname="old")
    deferred = add_try(store, "deferred")
    add_trigger(store, deferred, late, queue="payments")
    overview = client.get("/api/overview").json()
    assert [j["id"] for j in overview["jobs"]["worker"]] == [live]
    assert overview["jobs"]["triggerer"][0]["late"] is True
    assert overview["counts"]["deferred"] == 1
    assert overview["sweepers"] == []
    store.leases.acquire_lease("sweep-fallback", "worker-host:77", utcnow(), ttl=30)
    [sweeper] = client.get("/api/overview").json()["sweepers"]
    assert (sweeper["name"], sweeper["holder"]) == ("sweep-fallback", "worker-host:77")
    workers = client.get("/api/jobs", params={"type": "worker", "limit": 2}).json()
    rest = client.get(
        "/api/jobs", params={"type": "worker", "limit": 2, "before": workers["next_before"]}
    ).json()
    assert len({j["id"] for j in workers["rows"] + rest["rows"]}) == 4
    triggers = client.get("/api/deferred", params={"queue": "payments"}).json()["rows"]
    assert triggers[0]["task_id"] == deferred and triggers[0]["triggerer_hostname"] == "t1"
    assert triggers[0]["kwargs"].startswith("hidden")
    assert client.get("/api/deferred", params={"queue": "other"}).json()["rows"] == []
    assert client.get("/api/callbacks").json() == {"rows": [], "next_before": None}


def test_locks_lists_held_keys_from_redis(store, redis_service):
    url = f"{redis_service}/{BROKER_DB}"
    key = f"web-test-{uuid.uuid4().hex}"
    client_redis = redis.Redis.from_url(url)
    client_redis.set(IdempotencyLocks.lock_key(key), "host:1|7", px=60_000)
    try:
        with console_client(store.url, redis_url=url) as client:
            rows = [r for r in client.get("/api/locks").json()["rows"] if r["key"] == key]
    finally:
        client_redis.delete(IdempotencyLocks.lock_key(key))
    assert rows and rows[0]["holder"] == "host:1" and rows[0]["token"] == 7
    assert 0 < rows[0]["ttl"] <= 60


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql", "pgbouncer"], indirect=True)
def test_the_console_cannot_write(store, client):
    from celery_recovery.core.errors import StoreError
    from celery_recovery.store.schema import jobs

    assert client.post("/api/overview").status_code == 405
    console = client.app.app.state.console
    with pytest.raises(StoreError), console.queries.store.reading() as conn:
        conn.execute(jobs.delete())


def test_a_dropped_stale_delivery_is_in_the_audit_log(store, client_app, client):
    from celery_recovery.deliveries.redundant_deliveries import drop_if_redundant, was_dropped
    from tests.sweeps.test_redelivery_owner import redelivery

    # Given try 1 was recovered as try 2 by a sweep
    recovery = recovery_for_app(client_app)
    make_zombie(store, "t1", age=60.0)
    assert recovery.sweep().republished == 1
    # When the broker hands the worker the old message of try 1 again
    assert drop_if_redundant(recovery.context, redelivery("t1"), "t1") is True
    assert was_dropped("t1")
    recovery.runtime.writer.flush()
    # Then the log says that delivery was dropped, and why
    rows = client.get("/api/recoveries", params={"action": "dropped"}).json()["rows"]
    assert [(r["task_id"], r["try_number"], r["reason"]) for r in rows] == [
        ("t1", 1, "stale_delivery")
    ]
    assert rows[0]["detail"] == "superseded by try 2"


def test_the_overview_shows_overdue_tries(store, client):
    now = utcnow()
    add_history(store, "shop.import", now, [100.0] * 20)
    late = add_running(store, "shop.import", now - timedelta(seconds=400))
    add_running(store, "shop.import", now - timedelta(seconds=100))

    [row] = client.get("/api/overview").json()["overdue"]
    assert (row["task_id"], row["bound"], row["usual"]) == (late, 300.0, 100.0)
    page = client.get("/").text
    assert 'id="overdue"' in page and f"/tasks/{late}" in page
