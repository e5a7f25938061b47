"""Migrations that move data: what a store of the previous revision holds survives them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import text

from celery_recovery.core.errors import StoreSchemaError
from celery_recovery.store.engine import create_store_engine
from celery_recovery.store.migrate import (
    HEAD_REVISION,
    VERSION_TABLE,
    alembic_config,
    current_revision,
    ensure_schema,
    head_revision,
    upgrade,
)
from tests.services import PG_ADMIN_URL, create_pg_database, require

DONE = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LATER = datetime(2026, 11, 30, 12, 5, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_at_0009(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.sqlite3'}"
        engine = create_store_engine(url, for_migrations=True)
        upgrade(engine, "0009")
        engine.dispose()
        yield url
        return
    require("PostgreSQL", PG_ADMIN_URL, 5432)
    url, drop = create_pg_database("celery_recovery_migration", revision="0009")
    yield url
    drop()


def rows(engine, sql: str) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


def test_0010_moves_claims_and_the_sweep_check_in_out_of_leases_and_back(store_at_0009):
    # Given a 0009 store whose leases table holds a lease, a done claim, a held claim
    # and the sweep's completion row
    engine = create_store_engine(store_at_0009, for_migrations=True)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO leases (name, holder, token, expires_at, completed_at) VALUES "
                "('sweep-fallback', 'w1:7', 3, :later, NULL), "
                "('claim:chord-body:u1', 'w2:8', 1, :done, :done), "
                "('claim:chord-body:u2', 'w3:9', 2, :later, NULL), "
                "('sweep', NULL, 0, NULL, :done)"
            ),
            {"done": DONE, "later": LATER},
        )
    # When it is upgraded
    upgrade(engine)
    # Then leases keeps only the lease; claims and the check-in have tables of their own
    assert rows(engine, "SELECT name, holder, token FROM leases") == [("sweep-fallback", "w1:7", 3)]
    assert sorted(rows(engine, "SELECT name, holder, token FROM publish_claims")) == [
        ("claim:chord-body:u1", "w2:8", 1),
        ("claim:chord-body:u2", "w3:9", 2),
    ]
    done = rows(engine, "SELECT completed_at FROM publish_claims WHERE holder = 'w2:8'")
    assert done[0][0] is not None
    assert rows(engine, "SELECT name FROM checkins") == [("sweep",)]
    # And a downgrade puts them back where 0009 reads them
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0009")
    assert sorted(r[0] for r in rows(engine, "SELECT name FROM leases")) == [
        "claim:chord-body:u1",
        "claim:chord-body:u2",
        "sweep",
        "sweep-fallback",
    ]
    swept = rows(engine, "SELECT completed_at FROM leases WHERE name = 'sweep'")
    assert swept[0][0] is not None
    engine.dispose()


def test_the_head_revision_the_store_is_checked_against_is_the_newest_script():
    # ensure_schema compares with HEAD_REVISION without loading Alembic: a new
    # migration must move it too, or every process would refuse (or re-upgrade) the store.
    assert head_revision() == HEAD_REVISION


def test_a_store_behind_the_head_is_refused_on_postgresql_and_upgraded_on_sqlite(store_at_0009):
    engine = create_store_engine(store_at_0009, for_migrations=True)
    assert current_revision(engine) == "0009"
    if engine.dialect.name == "postgresql":
        needs = rf"revision 0009.*needs {HEAD_REVISION}.*db upgrade"
        with pytest.raises(StoreSchemaError, match=needs):
            ensure_schema(engine)
    else:
        ensure_schema(engine)
        assert current_revision(engine) == HEAD_REVISION
    engine.dispose()


def test_a_version_table_with_two_revisions_is_refused_with_what_to_do(tmp_path):
    engine = create_store_engine(f"sqlite:///{tmp_path / 's.sqlite3'}", for_migrations=True)
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ('0010')"))
    with pytest.raises(
        StoreSchemaError, match=rf"several schema revisions \(0010, {HEAD_REVISION}\)"
    ):
        ensure_schema(engine)
    engine.dispose()


def test_a_process_that_records_tasks_never_loads_alembic(tmp_path):
    # Given a store at the head revision
    url = f"sqlite:///{tmp_path / 'ready.sqlite3'}"
    engine = create_store_engine(url, for_migrations=True)
    upgrade(engine)
    engine.dispose()
    # When a fresh process installs Recovery, publishes a task and writes its record
    script = f"""
import sys
from celery import Celery
from celery_recovery import Recovery
app = Celery("p", broker="memory://", backend="cache+memory://")
app.conf.recovery_database_url = {url!r}
recovery = Recovery(app)
@app.task(name="p.noop")
def noop():
    pass
result = noop.delay()
assert recovery.flush(), "the record was not written"
assert [t["state"] for t in recovery.store.tries.history(result.id)] == ["queued"]
print(sorted(m for m in ("alembic", "mako", "pygments") if m in sys.modules))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    # Then neither Alembic nor what it brings was imported
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
