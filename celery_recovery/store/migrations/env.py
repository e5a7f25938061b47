"""Alembic environment for the celery-recovery store (run by ``celery-recovery db upgrade``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from celery_recovery.store.schema import metadata

config = context.config


def run_migrations() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        version_table="recovery_alembic_version",
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
