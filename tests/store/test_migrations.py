"""Migrations that move data: what a store of the previous revision holds survives them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import text

from celery_recovery.store.engine import create_store_engine
from celery_recovery.store.migrate import alembic_config, upgrade
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
