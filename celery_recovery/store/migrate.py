"""Schema migrations: apply the shipped Alembic revisions, and check the version.

``celery-recovery db upgrade`` applies them; on SQLite they are also applied
automatically the first time a process uses the store (under a file lock, so
the children of a prefork worker starting together do not race).

Alembic is imported only to migrate.  Every process that records tasks
checks the store's revision once, which is one ``SELECT``; importing Alembic
for it (with Mako and Pygments) would add about 110 modules and 20,000
objects to every worker, pool process and publisher, and each full pass of
the garbage collector walks them all.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import column, inspect, select, table
from sqlalchemy.engine import Connection, Engine

from celery_recovery.core.errors import StoreSchemaError
from celery_recovery.core.urls import mask_url

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
VERSION_TABLE = "recovery_alembic_version"
#: The newest revision in ``migrations/versions`` (a test keeps the two the same).
HEAD_REVISION = "0014"

_VERSION = table(VERSION_TABLE, column("version_num"))


def alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision this package ships, as Alembic reads it from the scripts."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the store at ``engine`` is at, or ``None`` when it has no schema.

    Read as Alembic stores it (one row in the version table; the revisions form
    one line, so there is never more than one head).
    """
    with engine.connect() as conn:
        if not inspect(conn).has_table(VERSION_TABLE):
            return None
        revisions = conn.execute(select(_VERSION.c.version_num)).scalars().all()
    if len(revisions) > 1:
        raise StoreSchemaError(
            f"the store at {mask_url(engine.url)} records several schema revisions "
            f"({', '.join(sorted(revisions))}) in {VERSION_TABLE}; this package's "
            "revisions form one line: keep the newest and run `celery-recovery db upgrade`"
        )
    return revisions[0] if revisions else None


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the store's schema up to ``revision``."""
    from alembic import command

    with _migration_lock(engine), engine.begin() as conn:
        command.upgrade(alembic_config(conn), revision)


def ensure_schema(engine: Engine) -> None:
    """Make sure the store can be used: upgrade SQLite, verify PostgreSQL.

    Raises :class:`StoreSchemaError` when a PostgreSQL store is not at the
    head revision, with the command that fixes it.
    """
    head = HEAD_REVISION
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
