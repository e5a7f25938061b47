"""Revoked, expired and purged tasks end ``revoked`` and are never published again."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest

from celery_recovery import TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.recovery import recovery_for_app
from celery_recovery.sweeps.revocations import revoked_because
from tests.conftest import app_env
from tests.workers import ROOT, wait_for

pytestmark = pytest.mark.compat

REVOKED = TaskState.REVOKED


def sweep_past_queued_timeout(app):
    """One sweep as it would run once every try queued now is overdue."""
    recovery = recovery_for_app(app)
    assert recovery.flush()
    return recovery.sweep(now=utcnow() + timedelta(seconds=recovery.settings.queued_timeout + 1))


def stamped(app, name, args, **stamps):
    signature = app.signature(name, args)
    signature.stamp(**stamps)
    return signature.apply_async()


def states(store, *results):
    return {
        r.id: [(t["try_number"], t["state"]) for t in store.tries.history(r.id)] for r in results
    }


@pytest.mark.slow
def test_revoked_expired_and_purged_tasks_end_revoked_and_are_not_published_again(
    make_client_app, store_url, store, start_worker, broker_urls, queue
):
    client = make_client_app(store_url)

    # A worker that hears the revokes discards the messages itself (task_revoked).
    # Each publisher record is written before the revoke: a worker's discard of a try
    # the store does not know yet changes nothing, and the sweep would end it instead.
    worker = start_worker(concurrency=1)
    busy = client.send_task("lifecycle.sleep_for", (1.5,))
    seen_by_id = client.send_task("lifecycle.add", (1, 1))
    seen_stamped = stamped(client, "lifecycle.add", (2, 2), case="seen")
    seen_expired = client.send_task("lifecycle.add", (3, 3), expires=0.5)
    assert recovery_for_app(client).flush()
    seen_by_id.revoke()
    client.control.revoke_by_stamped_headers({"case": "seen"})
    seen = (seen_by_id, seen_stamped, seen_expired)
    assert busy.get(timeout=20) == 1.5
    wait_for(lambda: all(r.state == "REVOKED" for r in seen), 15, what="the worker's discards")
    worker.stop()

    # With no worker to hear them, only the publisher's records tell the sweep.
    purged = client.send_task("lifecycle.add", (7, 7))
    assert recovery_for_app(client).flush()
    client.control.purge()
    purged_by_cli = client.send_task("lifecycle.add", (8, 8))
    assert recovery_for_app(client).flush()
    purge = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.apps.lifecycle", "purge", "-f"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **app_env(store_url, broker_urls, queue)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert purge.returncode == 0, purge.stderr
    by_id = client.send_task("lifecycle.add", (4, 4))
    by_id.revoke()
    by_stamp = stamped(client, "lifecycle.add", (5, 5), case="unseen")
    client.control.revoke_by_stamped_headers({"case": ["other", "unseen"]})
    expires = utcnow() + timedelta(seconds=1)
    expired = client.send_task("lifecycle.add", (6, 6), expires=expires)
    unseen = (by_id, by_stamp, expired, purged, purged_by_cli)
    wait_for(lambda: utcnow() > expires, 5, what="the expiry to pass")

    report = sweep_past_queued_timeout(client)

    assert report.lost_republished == 0
    assert report.revoked == len(unseen)
    assert states(store, *seen, *unseen) == {r.id: [(1, REVOKED)] for r in (*seen, *unseen)}
    reasons = {r.id: store.tries.history(r.id)[0]["state_reason"] for r in unseen}
    assert "app.control.revoke)" in reasons[by_id.id]
    assert "stamped header case" in reasons[by_stamp.id]
    assert "expired" in reasons[expired.id]
    assert "purged from queue" in reasons[purged.id]
    assert "purged from queue" in reasons[purged_by_cli.id]
    # A second pass finds nothing left to do.
    again = sweep_past_queued_timeout(client)
    assert (again.lost_messages, again.revoked, again.lost_republished) == (0, 0, 0)

    # A new worker never heard the revokes: Celery runs what is still queued, the
    # expired one excepted, and the records follow the worker, not the presumption.
    start_worker(concurrency=1)
    assert by_id.get(timeout=20) == 8
    assert by_stamp.get(timeout=20) == 10
    wait_for(lambda: expired.state == "REVOKED", 15, what="the worker to discard the expired one")
    wait_for(
        lambda: [t["state"] for t in store.tries.history(by_stamp.id)] == [TaskState.SUCCESS],
        10,
        what="the delivered one to be recorded",
    )
    assert [t["state"] for t in store.tries.history(by_id.id)] == [TaskState.SUCCESS]
    assert [t["state"] for t in store.tries.history(expired.id)] == [REVOKED]
    assert purged.state == purged_by_cli.state == "PENDING"


def test_revoked_because_mirrors_what_a_worker_checks():
    now = utcnow()
    before, after = now - timedelta(seconds=10), now + timedelta(seconds=10)
    record = {
        "task_id": "t1",
        "queue": "q",
        "queued_at": before,
        "expires": None,
        "headers": {"stamped_headers": ["case"], "stamps": {"case": ["a", "b"]}},
    }
    assert revoked_because(record, [], now) is None
    assert "expired" in revoked_because({**record, "expires": before}, [], now)
    assert revoked_because({**record, "expires": after}, [], now) is None
    task = {"kind": "task", "task_id": "t1", "created_at": now}
    assert "revoke" in revoked_because(record, [task], now)
    assert revoked_because(record, [{**task, "task_id": "t2"}], now) is None
    stamp = {"kind": "stamp", "header": "case", "value": ["b"], "created_at": now}
    assert "stamped header" in revoked_because(record, [stamp], now)
    assert revoked_because(record, [{**stamp, "value": "c"}], now) is None
    assert revoked_because(record, [{**stamp, "header": "other"}], now) is None
    purge = {"kind": "purge", "queue": "q", "created_at": now}
    assert "purged" in revoked_because(record, [purge], now)
    # Published after the purge, or to another queue: not purged.
    assert revoked_because(record, [{**purge, "created_at": before - timedelta(1)}], now) is None
    assert revoked_because(record, [{**purge, "queue": "other"}], now) is None


def test_a_lost_stamped_task_is_published_again_with_its_stamps(
    make_client_app, sqlite_url, broker_urls, queue
):
    import json

    import redis

    client = make_client_app(sqlite_url)
    result = stamped(client, "lifecycle.add", (1, 2), case="kept")
    assert recovery_for_app(client).flush()
    broker = redis.Redis.from_url(broker_urls[0])
    assert broker.delete(queue) == 1  # the message is lost

    report = sweep_past_queued_timeout(client)

    assert report.lost_republished == 1
    (message,) = broker.lrange(queue, 0, -1)
    headers = json.loads(message)["headers"]
    assert headers["id"] == result.id and headers["retries"] == 1
    # A worker that heard revoke_by_stamped_headers({"case": "kept"}) discards it.
    assert headers["stamped_headers"] == ["case"]
    assert headers["stamps"] == {"case": "kept"}
