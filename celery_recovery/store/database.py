"""The store's database: this process's engines, transactions and error translation.

One :class:`Database` per store URL, safe across threads and forks.  Every
repository method runs in one short transaction taken here; database errors
leave it as :class:`~celery_recovery.core.errors.StoreError`s.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from celery_recovery.core.errors import StoreError, StoreSchemaError, StoreUnavailableError
from celery_recovery.core.urls import mask_secrets, mask_url
from celery_recovery.store.engine import behind_pooler, create_store_engine
from celery_recovery.store.forks import ForkGate
from celery_recovery.store.migrate import ensure_schema


class Database:
    """The metadata store's database at one URL."""

    def __init__(self, url: str, pooler: str = "auto") -> None:
        self.url = url
        #: ``recovery_database_pooler``: how to know whether a pooler stands in front.
        self.pooler = pooler
        self._engine: Engine | None = None
        self._pid = 0
        self._ready = False
        self._lock = threading.Lock()
        self._statements: dict[Any, Any] = {}
        self._gate = ForkGate(in_child=self._forget_parent_locks)

    def __repr__(self) -> str:
        return f"<Store {mask_url(self.url)}>"

    @property
    def engine(self) -> Engine:
        """This process's engine; a forked child never reuses its parent's connections."""
        pid = os.getpid()
        if self._engine is None or self._pid != pid:
            with self._lock:
                if self._engine is None or self._pid != pid:
                    if self._engine is not None:
                        self._engine.dispose(close=False)
                    self._engine = create_store_engine(self.url, pooler=self.pooler)
                    self._pid = pid
                    self._ready = False
        return self._engine

    def _forget_parent_locks(self) -> None:
        # In a forked child: a lock the parent's threads held is held by no one here.
        self._lock = threading.Lock()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def ensure_ready(self) -> None:
        """Check (PostgreSQL) or create (SQLite) the schema, once per process."""
        with self._gate.using():
            self._ensure_ready()

    def _ensure_ready(self) -> None:
        engine = self.engine
        if self._ready:
            return
        with self.translate_errors():
            ensure_schema(engine)
        self._ready = True

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One short transaction; database errors become :class:`StoreError`s."""
        with self._gate.using():
            self._ensure_ready()
            with self.translate_errors(), self.engine.begin() as conn:
                yield conn

    @contextmanager
    def single_statement(self) -> Iterator[Connection]:
        """A connection for one atomic statement: autocommitted on PostgreSQL (one round
        trip instead of three), on the process's one connection; a short transaction on
        SQLite, and behind a pooler (where its timeout is set in its transaction)."""
        with self._gate.using():
            self._ensure_ready()
            if self.dialect != "postgresql" or self.behind_pooler:
                with self.translate_errors(), self.engine.begin() as conn:
                    yield conn
                return
            with self.translate_errors(), self.engine.connect() as conn:
                # psycopg's autocommit is a client-side switch, reset when the connection
                # goes back to the pool: no round trip either way.
                yield conn.execution_options(isolation_level="AUTOCOMMIT")

    @property
    def behind_pooler(self) -> bool:
        """Whether the store is reached through a transaction-mode pooler (known once a
        connection was made; asks on a connection of its own before that)."""
        if self.dialect != "postgresql":
            return False
        with self.translate_errors():
            return behind_pooler(self.url, self.pooler)

    def read_clock(self) -> tuple[datetime, float, float] | None:
        """The database server's clock, and the monotonic instants between which it was
        read; None on SQLite (the store is the one machine's file: its clock is
        this host's)."""
        if self.dialect != "postgresql":
            return None
        with self.single_statement() as conn:
            asked = time.monotonic()
            value = conn.exec_driver_sql("SELECT clock_timestamp()").scalar_one()
            answered = time.monotonic()
        return value, asked, answered

    def connection_use(self) -> tuple[int, int] | None:
        """(server sessions now open to this database, the connections the server allows
        clients: ``max_connections`` less those reserved for superusers); None on SQLite."""
        if self.dialect != "postgresql":
            return None
        with self.transaction() as conn:
            row = conn.exec_driver_sql(
                "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = "
                "current_database()), current_setting('max_connections')::int - "
                "current_setting('superuser_reserved_connections')::int"
            ).one()
        return int(row[0]), int(row[1])

    def statement(self, key: Any, build: Callable[[], Any]) -> Any:
        """Statements are built once per store: building one costs more than running it."""
        stmt = self._statements.get(key)
        if stmt is None:
            stmt = self._statements[key] = build()
        return stmt

    def dispose(self) -> None:
        if self._engine is not None and self._pid == os.getpid():
            self._engine.dispose()
        self._engine = None

    @contextmanager
    def translate_errors(self) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except PoolTimeoutError as exc:
            # Another thread of this process holds its one connection past the pool's
            # wait (a statement stuck on a frozen socket): the store is unavailable here.
            raise StoreUnavailableError(
                f"store {mask_url(self.url)} unavailable: {_short(exc)}"
            ) from exc
        except (OperationalError, InterfaceError) as exc:
            raise StoreUnavailableError(
                f"store {mask_url(self.url)} unavailable: {_short(exc)}{_pooler_hint(exc)}"
            ) from exc
        except ProgrammingError as exc:
            if _pooler_hint(exc):
                raise StoreError(
                    f"store {mask_url(self.url)} error: {_short(exc)}{_pooler_hint(exc)}"
                ) from exc
            raise StoreSchemaError(
                f"store {mask_url(self.url)} schema problem: {_short(exc)}; "
                "run `celery-recovery db upgrade`"
            ) from exc
        except DBAPIError as exc:
            raise StoreError(f"store {mask_url(self.url)} error: {_short(exc)}") from exc

    def insert(self, table: Any) -> Any:
        module = postgresql if self.dialect == "postgresql" else sqlite
        return module.insert(table)


#: What a pooler's refusal of session state reads like, from the server or the pooler.
_POOLER_SYMPTOMS = ("unsupported startup parameter", "prepared statement")


def _pooler_hint(exc: BaseException) -> str:
    """Where an error is a pooler refusing session state, what to set; else ""."""
    text = str(getattr(exc, "orig", None) or exc)
    if not any(symptom in text for symptom in _POOLER_SYMPTOMS):
        return ""
    return (
        " (a connection pooler in transaction mode, such as PgBouncer, refuses session "
        "state: set recovery_database_pooler = 'transaction'; this is not a schema problem)"
    )


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return mask_secrets(text[0] if text else type(exc).__name__)
