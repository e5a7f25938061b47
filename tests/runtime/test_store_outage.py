"""A down, unreachable or unmigrated store never hurts the user's tasks."""

from __future__ import annotations

import re
import uuid

import pytest
from sqlalchemy import create_engine, text

from celery_recovery import JobType, TaskState
from celery_recovery.store import Store
from tests.proxy import TcpProxy
from tests.services import PG_ADMIN_URL
from tests.workers import wait_for

pytestmark = pytest.mark.slow

WARNING = re.compile(r"WARNING/.*celery-recovery:")


def run_tasks(app, count):
    results = [app.send_task("lifecycle.add", (i, i)) for i in range(count)]
    return [r.get(timeout=60) for r in results]


def recovery_warnings(log: str) -> list[str]:
    return [line for line in log.splitlines() if WARNING.search(line)]


def test_postgres_down_tasks_still_succeed_with_bounded_warnings(
    pg_url, make_client_app, start_worker
):
    proxy = TcpProxy("127.0.0.1", 5432).start()
    down_url = pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    proxy.cut()
    worker = start_worker(store_url=down_url, concurrency=2)
    client = make_client_app(down_url)

    assert run_tasks(client, 100) == [2 * i for i in range(100)]

    warnings = recovery_warnings(worker.log)
    # One warning per process per outage (two pool processes, perhaps the main one).
    assert 1 <= len(warnings) <= 6, "\n".join(warnings)
    assert "failed while" in warnings[0] and "Tasks keep running" in warnings[0]
    # The store returns before teardown, so closing the client drains its buffered
    # records instead of waiting out its flush timeouts against a dead store.
    proxy.start()


def test_records_written_behind_reach_the_store_when_it_returns(
    pg_url, make_client_app, start_worker
):
    proxy = TcpProxy("127.0.0.1", 5432).start()
    flaky_url = pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    worker = start_worker(store_url=flaky_url, concurrency=2)
    client = make_client_app(pg_url)
    store = Store(pg_url)
    # The main process and two pool processes.
    wait_for(lambda: len(store.jobs.list_jobs(JobType.WORKER)) == 3, what="jobs before the outage")

    proxy.cut()
    results = [client.send_task("lifecycle.add", (i, 1)) for i in range(20)]
    assert [r.get(timeout=30) for r in results] == [i + 1 for i in range(20)]
    # Twenty short tasks can finish before a writer's batch is due (150 ms): keep the
    # store away until a process has found it unreachable, so that what it buffers is
    # written behind, once the store answers again.
    wait_for(
        lambda: "the metadata store failed while" in worker.log,
        30,
        what="a worker process to find the store unreachable",
    )
    proxy.start()

    def all_recorded():
        tries = [t for r in results for t in store.tries.history(r.id)]
        return len(tries) == 20 and all(t["state"] == TaskState.SUCCESS for t in tries)

    wait_for(all_recorded, 45, interval=0.25, what="buffered records to be written")
    assert "answers again" in worker.log
    store.dispose()
    proxy.cut()


def test_unmigrated_postgres_store_warns_once_and_tasks_run(make_client_app, start_worker):
    name = f"celery_recovery_empty_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        worker = start_worker(store_url=url)
        client = make_client_app(None)
        assert run_tasks(client, 20) == [2 * i for i in range(20)]
        warnings = recovery_warnings(worker.log)
        assert 1 <= len(warnings) <= 6
        assert "celery-recovery db upgrade" in warnings[0]
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_sqlite_store_that_cannot_be_opened_does_not_stop_tasks(
    tmp_path, make_client_app, start_worker
):
    missing = tmp_path / "not-created-yet"
    url = f"sqlite:///{missing / 'recovery.sqlite3'}"
    worker = start_worker(store_url=url, concurrency=1)
    client = make_client_app(None)
    assert run_tasks(client, 10) == [2 * i for i in range(10)]
    assert 1 <= len(recovery_warnings(worker.log)) <= 4

    missing.mkdir()
    store = Store(url)
    store.ensure_ready()
    wait_for(lambda: store.jobs.list_jobs(JobType.WORKER), 45, interval=0.25, what="the job row")
    store.dispose()
