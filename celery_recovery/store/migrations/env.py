"""Alembic environment for the celery-recovery store (run by ``celery-recovery db upgrade``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection

from celery_recovery.store.schema import metadata

config = context.config


def run_migrations() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("alembic: no connection given and no sqlalchemy.url set")
    engine = create_engine(url)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        version_table="recovery_alembic_version",
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
