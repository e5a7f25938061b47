"""Schema migrations: apply the shipped Alembic revisions, and check the version.

``celery-recovery db upgrade`` applies them; on SQLite they are also applied
automatically the first time a process uses the store (under a file lock, so
the children of a prefork worker starting together do not race).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

from celery_recovery.core.errors import StoreSchemaError
from celery_recovery.core.urls import mask_url

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
VERSION_TABLE = "recovery_alembic_version"


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision this package ships."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the store at ``engine`` is at, or ``None`` when it has no schema."""
    with engine.connect() as conn:
        return MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE}
        ).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the store's schema up to ``revision``."""
    with _migration_lock(engine), engine.begin() as conn:
        command.upgrade(alembic_config(conn), revision)


def ensure_schema(engine: Engine) -> None:
    """Make sure the store can be used: upgrade SQLite, verify PostgreSQL.

    Raises :class:`StoreSchemaError` when a PostgreSQL store is not at the
    head revision, with the command that fixes it.
    """
    head = head_revision()
    current = current_revision(engine)
    if current == head:
        return
    if engine.dialect.name == "sqlite":
        upgrade(engine)
        return
    raise StoreSchemaError(
        f"the store at {mask_url(engine.url)} is at schema revision {current or 'none'}, "
        f"this package needs {head}; run `celery-recovery db upgrade`"
    )


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    if engine.dialect.name != "sqlite" or not engine.url.database:
        yield
        return
    lock_path = os.path.abspath(engine.url.database) + ".migrate-lock"
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
