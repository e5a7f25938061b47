"""SQLAlchemy engines for the store, tuned per database.

SQLite runs in WAL mode with a busy timeout and takes its write lock at the
start of each transaction (``BEGIN IMMEDIATE``), which is what makes it safe
for the several processes of one machine.  PostgreSQL connections time out
quickly so that an unreachable store degrades recovery instead of stalling
the user's tasks.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, create_engine, make_url

#: Seconds a connection attempt to PostgreSQL may take before the store counts as down.
PG_CONNECT_TIMEOUT = 3
#: Milliseconds one statement may take on PostgreSQL before it is cancelled.
PG_STATEMENT_TIMEOUT_MS = 10_000
#: Milliseconds a PostgreSQL session may sit inside an open transaction, doing
#: nothing, before the server ends it.  Our transactions never span a publish, a
#: callback or a task, so a session idle that long belongs to a process that is
#: paused (SIGSTOP, a frozen VM) or starved: ending it frees the row locks that
#: would otherwise hold its successor (a standby beat, a sweep) for the whole
#: pause, and its transaction, when the process wakes, fails instead of
#: committing a stale decision.
PG_IDLE_IN_TRANSACTION_TIMEOUT_MS = 2_000
#: Seconds SQLite waits for another process's write lock.
SQLITE_BUSY_TIMEOUT = 30.0


def create_store_engine(
    url: str | URL, *, for_migrations: bool = False, autocommit: bool = False
) -> Engine:
    """An engine for the store at ``url`` (already normalised by the settings).

    ``autocommit`` (PostgreSQL only) gives an engine for single atomic
    statements: one round trip each, no BEGIN, COMMIT or rollback-on-return.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed)
    connect_args: dict[str, Any] = {"connect_timeout": PG_CONNECT_TIMEOUT}
    if not for_migrations:
        connect_args["options"] = (
            f"-c statement_timeout={PG_STATEMENT_TIMEOUT_MS} "
            f"-c idle_in_transaction_session_timeout={PG_IDLE_IN_TRANSACTION_TIMEOUT_MS}"
        )
    extra: dict[str, Any] = {}
    if autocommit:
        extra = {"isolation_level": "AUTOCOMMIT", "pool_reset_on_return": None}
    return create_engine(
        parsed,
        connect_args=connect_args,
        **extra,
        pool_size=2,
        max_overflow=4,
        # No pre-ping: it costs a round trip per write on the hot path.  A dead
        # connection fails one write, which is kept and retried, and the pool
        # replaces it.
        pool_recycle=1800,
    )


def _sqlite_engine(url: URL) -> Engine:
    engine = create_engine(
        url,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT, "check_same_thread": False},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the sqlite3 module so BEGIN IMMEDIATE works.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT * 1000)}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Deferred transactions that later write can fail with SQLITE_BUSY at
        # once instead of waiting; taking the lock up front makes them queue.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
