"""The store: one SQLite file written by several hosts, and a PostgreSQL store that
was never migrated."""

from __future__ import annotations

import uuid

from sqlalchemy import create_engine, text

from celery_recovery.doctor import ExitStatus, Severity
from celery_recovery.store import Store
from tests.builders import add_job
from tests.doctor.helpers import finding, ids, make_app, run
from tests.services import PG_ADMIN_URL

#: The doctor reads no Redis or RabbitMQ server with these.
BROKER = "memory://"
BACKEND = "db+sqlite:///doctor-results.sqlite3"


def store_app(url: str):
    # memory:// is a finding of its own; the tests look at the store's findings.
    return make_app(BROKER, BACKEND, url)


def test_live_workers_of_two_hosts_on_one_sqlite_file(sqlite_url):
    store = Store(sqlite_url)
    store.ensure_ready()
    add_job(store, "worker", heartbeat_age=1, hostname="host-a")
    add_job(store, "worker", heartbeat_age=1, hostname="host-a")
    add_job(store, "worker", heartbeat_age=3600, hostname="host-gone")  # dead: not counted
    assert "sqlite-several-hosts" not in ids(run(store_app(sqlite_url)))

    add_job(store, "worker", heartbeat_age=2, hostname="host-b")
    store.dispose()
    shared = finding(run(store_app(sqlite_url)), "sqlite-several-hosts")
    assert shared.severity is Severity.ERROR
    assert "processes of 2 hosts (host-a, host-b)" in shared.problem
    assert shared.fix.startswith("app.conf.recovery_database_url = 'postgresql+psycopg://")


def test_several_hosts_on_postgresql_are_fine(pg_url):
    store = Store(pg_url)
    add_job(store, "worker", heartbeat_age=1, hostname="host-a")
    add_job(store, "worker", heartbeat_age=1, hostname="host-b")
    store.dispose()
    report = run(store_app(pg_url))
    assert "sqlite-several-hosts" not in ids(report)
    assert any("2 live jobs on 2 host(s) (host-a, host-b)" in line for line in report.read)


def test_a_sqlite_file_nobody_created_is_left_uncreated(tmp_path):
    url = f"sqlite:///{tmp_path / 'none.sqlite3'}"
    run(store_app(url))
    assert not (tmp_path / "none.sqlite3").exists()


def test_an_unmigrated_postgresql_store(pg_database_url):
    name = f"doctor_empty_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
        missing = finding(run(store_app(url)), "store-not-migrated")
        assert "db upgrade" in missing.fix and "runs its tasks unrecorded" in missing.problem
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_a_store_that_does_not_answer_cannot_be_told(closed_port):
    report = run(store_app(f"postgresql+psycopg://postgres@127.0.0.1:{closed_port}/none"))
    assert [u.check for u in report.unknowns] == ["store"]
    assert ids(report) == ["broker-not-persistent"]  # memory://
    assert report.exit_status is ExitStatus.FINDINGS


def test_a_store_behind_a_pooler_is_named_with_what_it_changes(pgbouncer_url):
    report = run(store_app(pgbouncer_url))
    (pooled,) = [line for line in report.read if "transaction-mode pooler" in line]
    assert "no advisory-lock marker" in pooled and "per transaction" in pooled
    assert "store-connections" not in ids(report)  # the pooler bounds the server's share


def test_a_fleet_the_servers_connections_cannot_hold(pg_url):
    store = Store(pg_url)
    open_now, allowed = store.db.connection_use()
    assert 0 < open_now < allowed
    # Given live jobs that would hold more connections than the server allows,
    for n in range(allowed // 2 + 1):
        add_job(store, "worker", heartbeat_age=1, hostname=f"host-{n % 7}")
    store.dispose()
    report = run(store_app(pg_url))
    full = finding(report, "store-connections")
    assert full.severity is Severity.WARNING
    assert f"{allowed // 2 + 1} live jobs may hold up to" in full.problem
    assert f"against the {allowed} the server allows" in full.problem
    assert "PgBouncer" in full.fix
    assert not any("transaction-mode pooler" in line for line in report.read)
