"""Fixtures for infrastructure faults: private servers that the tests may restart."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from celery_recovery.store.engine import create_store_engine
from celery_recovery.store.migrate import upgrade
from celery_recovery.store.schema import metadata
from tests.faults.servers import PG_BIN, PrivatePostgres, PrivateRedis
from tests.services import in_ci

STORE_DB = "recovery"


def require_binary(path: str) -> None:
    if shutil.which(path):
        return
    message = f"{path} is not installed"
    if in_ci():
        pytest.fail(f"{message} (CI=true: fault tests must not be skipped)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def private_pg() -> Iterator[PrivatePostgres]:
    """One private cluster per session (initdb costs seconds), with a migrated store."""
    require_binary(str(PG_BIN / "initdb"))
    cluster = PrivatePostgres().init()
    admin = create_engine(cluster.url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{STORE_DB}"'))
    admin.dispose()
    engine = create_store_engine(cluster.url(STORE_DB), for_migrations=True)
    upgrade(engine)
    engine.dispose()
    yield cluster
    cluster.destroy()


@pytest.fixture
def fault_pg_url(private_pg: PrivatePostgres) -> str:
    """The private cluster's store, emptied for this test."""
    engine = create_engine(private_pg.url(STORE_DB))
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(t.name for t in metadata.sorted_tables)}"))
    engine.dispose()
    return private_pg.url(STORE_DB)


@pytest.fixture
def private_redis(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[PrivateRedis]:
    require_binary("redis-server")
    persistent = getattr(request, "param", False)
    server = PrivateRedis(tmp_path, persistent=persistent).start()
    yield server
    server.stop()
