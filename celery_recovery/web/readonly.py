"""A read-only connection to the store: the console can look, never change anything.

PostgreSQL sessions start with ``default_transaction_read_only`` (the server
refuses any write) and a short statement timeout; SQLite connections run with
``PRAGMA query_only`` and take no write lock (no ``BEGIN IMMEDIATE``, unlike
the store's own engine).  The schema is never created or migrated from here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, create_engine, make_url
from sqlalchemy.exc import DBAPIError, ProgrammingError

from celery_recovery.core.errors import StoreError, StoreSchemaError, StoreUnavailableError
from celery_recovery.core.urls import mask_secrets, mask_url
from celery_recovery.store.engine import per_session

#: Milliseconds one console query may take on PostgreSQL before it is cancelled.
STATEMENT_TIMEOUT_MS = 5_000


def read_only_engine(url: str, pooler: str = "auto") -> Engine:
    """An engine whose every transaction is read-only, for the store at ``url``
    (reached directly or through a pooler: ``recovery_database_pooler``)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(parsed, connect_args={"timeout": 5, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA query_only = ON")
            cursor.close()

        return engine
    engine = create_engine(
        parsed,
        connect_args={"connect_timeout": 3},
        pool_size=4,
        max_overflow=4,
        pool_pre_ping=True,
    )
    per_session(
        engine,
        parsed,
        pooler,
        {"default_transaction_read_only": "on", "statement_timeout": STATEMENT_TIMEOUT_MS},
    )
    return engine


def fetch_rows(conn: Connection, stmt: Any) -> list[dict[str, Any]]:
    """The rows ``stmt`` selects, as plain dicts."""
    return [dict(row) for row in conn.execute(stmt).mappings()]


class ReadOnlyStore:
    """Short read-only transactions on the store; errors become :class:`StoreError`."""

    def __init__(self, url: str, pooler: str = "auto") -> None:
        self.url = url
        self.masked_url = mask_url(url)
        self.engine = read_only_engine(url, pooler)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        try:
            with self.engine.connect() as conn, conn.begin():
                yield conn
        except DBAPIError as exc:
            first = str(getattr(exc, "orig", None) or exc).strip().splitlines()
            detail = mask_secrets(first[0] if first else type(exc).__name__)
            if isinstance(exc, ProgrammingError) or "no such table" in detail:
                raise StoreSchemaError(
                    f"store {self.masked_url}: {detail}; create or migrate its tables with "
                    "`celery-recovery db upgrade` (the console never changes the store)"
                ) from exc
            error = StoreUnavailableError if exc.connection_invalidated else StoreError
            raise error(f"store {self.masked_url}: {detail}") from exc

    def dispose(self) -> None:
        self.engine.dispose()
