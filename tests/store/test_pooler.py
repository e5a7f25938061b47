"""The store through a real PgBouncer in transaction mode: found without being told,
no session state relied on, the same answers as a direct connection.

Two PgBouncers stand in front of the tests' PostgreSQL: one configured as most guides
do (it refuses the ``options`` startup parameter), one that accepts and drops it (the
workaround users found, under which psycopg's server-side prepared statements broke).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text

from celery_recovery import TaskState
from celery_recovery.core.errors import StoreUnavailableError
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.core.timeutils import utcnow
from celery_recovery.liveness.job import uses_lock_marker
from celery_recovery.store import Store, behind_pooler
from tests.builders import make_queued
from tests.conftest import through_port

POOLERS = ["pgbouncer_port", "pgbouncer_lenient_port"]


@pytest.fixture(params=POOLERS)
def pooled_url(request, pg_url) -> str:
    return through_port(pg_url, request.getfixturevalue(request.param))


def test_a_pooler_is_found_and_a_direct_connection_is_not(pooled_url, pg_url):
    assert behind_pooler(pooled_url) is True
    assert behind_pooler(pg_url) is False
    # Said outright, nothing is asked.
    assert behind_pooler(pg_url, "transaction") is True
    assert behind_pooler(pooled_url, "none") is False
    assert behind_pooler("sqlite:///x.sqlite3") is False


def test_every_transaction_has_its_timeouts_and_nothing_is_prepared(pooled_url):
    store = Store(pooled_url)
    try:
        store.ensure_ready()
        assert store.db.behind_pooler
        # Each transaction may run on another server session: each has its timeouts.
        for _ in range(12):
            with store.transaction() as conn:
                got = conn.execute(
                    text(
                        "SELECT current_setting('statement_timeout'), "
                        "current_setting('idle_in_transaction_session_timeout')"
                    )
                ).one()
                assert tuple(got) == ("10s", "2s")
        # Past psycopg's prepare threshold (5 runs of one statement) nothing fails: no
        # statement is prepared on a server session another transaction then reuses.
        now = utcnow()
        for n in range(12):
            make_queued(store, f"t{n}")
            store.jobs.add_job(
                {
                    "id": f"job{n}",
                    "job_type": "worker",
                    "hostname": "h",
                    "node_name": "w@h",
                    "pid": 100 + n,
                    "state": "running",
                    "start_date": now,
                    "latest_heartbeat": now,
                }
            )
        assert [t["state"] for t in store.tries.history("t11")] == [TaskState.QUEUED]
        assert len(store.try_recovery.find_lost(now + timedelta(hours=1), 600, 30)) == 12
    finally:
        store.dispose()


def test_the_same_store_read_directly_agrees(pooled_url, pg_url):
    pooled, direct = Store(pooled_url), Store(pg_url)
    try:
        pooled.ensure_ready()
        make_queued(pooled, "t1")
        assert [t["state"] for t in direct.tries.history("t1")] == [TaskState.QUEUED]
        assert not direct.db.behind_pooler
    finally:
        pooled.dispose()
        direct.dispose()


def test_no_advisory_lock_marker_is_held_behind_a_pooler(pooled_url, pg_url):
    assert not uses_lock_marker(RecoverySettings(database_url=pooled_url))
    assert uses_lock_marker(RecoverySettings(database_url=pg_url))
    assert not uses_lock_marker(
        RecoverySettings(database_url=pg_url, database_pooler="transaction")
    )


def test_a_store_that_cannot_be_reached_is_unavailable_not_a_schema_problem(pg_url):
    store = Store(through_port(pg_url, 1))  # nothing listens on port 1
    try:
        with pytest.raises(StoreUnavailableError, match="unavailable"):
            store.ensure_ready()
    finally:
        store.dispose()
