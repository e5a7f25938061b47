"""A bounded, predictable connection count: a prefork worker holds at most
concurrency + 3 PostgreSQL sessions, at rest and with every pool process busy.

The store is a database of its own, so that every session counted
(``pg_stat_activity``) is the worker's; the tasks are published by a plain Celery
app, which holds none.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, text

from celery_recovery.store import Store
from tests.apps.lifecycle import create_app
from tests.services import PG_ADMIN_URL, create_pg_database, require
from tests.workers import wait_for

pytestmark = pytest.mark.slow


def _sessions(name: str) -> int:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE datname = :name"),
                    {"name": name},
                ).scalar_one()
            )
    finally:
        admin.dispose()


@pytest.fixture
def own_store():
    require("PostgreSQL", PG_ADMIN_URL, 5432)
    url, drop = create_pg_database("celery_recovery_connections")
    yield url
    drop()


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_worker_holds_at_most_concurrency_plus_three_sessions(
    own_store, broker_urls, queue, start_worker, concurrency
):
    name = own_store.rsplit("/", 1)[1]
    start_worker(store_url=own_store, concurrency=concurrency)
    store = Store(own_store)
    wait_for(lambda: len(store.jobs.list_jobs("worker")) == concurrency + 1, 20, what="its jobs")
    store.dispose()
    plain = create_app(*broker_urls, queue, None)
    try:
        results = [plain.send_task("lifecycle.add", (i, 1)) for i in range(40)]
        assert [r.get(timeout=30) for r in results] == [i + 1 for i in range(40)]
        bound = concurrency + 3
        assert _sessions(name) <= bound
        busy = [plain.send_task("lifecycle.sleep_for", (1.0,)) for _ in range(2 * concurrency)]
        most = 0
        while not all(r.ready() for r in busy):
            most = max(most, _sessions(name))
            time.sleep(0.05)  # between two samples
        assert 0 < most <= bound, most
        assert _sessions(name) <= bound
    finally:
        plain.close()
