"""SQLAlchemy engines for the store, tuned per database.

SQLite runs in WAL mode with a busy timeout and takes its write lock at the
start of each transaction (``BEGIN IMMEDIATE``), which is what makes it safe
for the several processes of one machine.  PostgreSQL connections time out
quickly so that an unreachable store degrades recovery instead of stalling
the user's tasks, directly or through a transaction-mode pooler (PgBouncer),
which keeps no session state from one transaction to the next.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, create_engine, make_url
from sqlalchemy.exc import OperationalError

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
#: Seconds a thread waits for its process's one store connection while another thread
#: uses it: past the statement timeout, so that only a connection stuck on a dead socket
#: makes it wait that long (the store then counts as unavailable for that thread).
PG_POOL_TIMEOUT = 15.0
#: Seconds SQLite waits for another process's write lock.
SQLITE_BUSY_TIMEOUT = 30.0


#: The values of ``recovery_database_pooler``: find a pooler by asking (``auto``), or say.
POOLER_MODES = ("auto", "none", "transaction")

#: Per database URL (password included), whether this process tree reaches it through
#: a transaction-mode pooler: found once, inherited across forks.
_behind_pooler: dict[str, bool] = {}


def behind_pooler(url: str | URL, mode: str = "auto") -> bool:
    """Whether the PostgreSQL store at ``url`` is reached through a pooler that hands
    each transaction its own server session (PgBouncer, Odyssey, PgCat, Supavisor or
    RDS Proxy in transaction mode): no session state may then be relied on (startup
    options, server-side prepared statements, session advisory locks).

    ``mode`` ``none`` or ``transaction`` says so; ``auto`` asks once per URL, on a
    connection of its own: a pooler answers the client's startup with a backend
    process id of its own making (its cancel key), which ``pg_backend_pid()``, run on
    the real server session, then contradicts.  Raises the driver's error when the
    store cannot be reached (as SQLAlchemy's ``OperationalError``; nothing is cached).
    """
    if mode != "auto":
        return mode == "transaction"
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return False
    key = parsed.render_as_string(hide_password=False)
    found = _behind_pooler.get(key)
    if found is None:
        found = _behind_pooler[key] = _answers_as_pooler(parsed)
    return found


def _answers_as_pooler(url: URL) -> bool:
    import psycopg

    conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=PG_CONNECT_TIMEOUT) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            return row is None or int(row[0]) != conn.info.backend_pid
    except psycopg.Error as exc:
        raise OperationalError("finding out whether a pooler stands in front", None, exc) from exc


#: A session default whose own transaction's setting is another name: a transaction
#: that has begun takes no new default.
_IN_TRANSACTION = {"default_transaction_read_only": "transaction_read_only"}


def per_session(engine: Engine, url: URL, mode: str, settings: dict[str, str | int]) -> None:
    """Give every transaction of ``engine`` the server ``settings``, with or without a pooler.

    Reached directly, they are the connection's startup options (free: they travel with
    the connection request).  Behind a transaction-mode pooler, which refuses or drops
    startup options and hands each transaction another server session, they are set
    with ``SET LOCAL`` as each transaction begins (one more statement per transaction,
    only there), and psycopg prepares no statement on the server (a prepared statement
    lives in one server session; the next transaction may run on another).  The first
    connection finds out which (see :func:`behind_pooler`).
    """

    @event.listens_for(engine, "do_connect")
    def _on_do_connect(_dialect: Any, record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        pooled = behind_pooler(url, mode)
        record.info["behind_pooler"] = pooled
        if pooled:
            cparams["prepare_threshold"] = None
        elif settings:
            ours = " ".join(f"-c {k}={v}" for k, v in settings.items())
            # Options of the URL's own (?options=...) come first; ours are added to them.
            cparams["options"] = f"{cparams.get('options') or ''} {ours}".strip()

    if not settings:
        return
    set_local = "; ".join(
        f"SET LOCAL {_IN_TRANSACTION.get(k, k)} = {v}" for k, v in settings.items()
    )

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        if conn.info.get("behind_pooler"):
            conn.exec_driver_sql(set_local)


def create_store_engine(
    url: str | URL, *, for_migrations: bool = False, pooler: str = "auto"
) -> Engine:
    """An engine for the store at ``url`` (already normalised by the settings), reached
    directly or through a pooler (``pooler``, see :func:`behind_pooler`)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed)
    engine = create_engine(
        parsed,
        connect_args={"connect_timeout": PG_CONNECT_TIMEOUT},
        # One connection per process, whatever its threads (writer, heartbeat, the task's
        # own checks), so that a worker holds concurrency + 2 (its marker's included):
        # their transactions are short and never wait on anything but the database.
        pool_size=1,
        max_overflow=0,
        pool_timeout=PG_POOL_TIMEOUT,
        # No pre-ping: it costs a round trip per write on the hot path.  A dead
        # connection fails one write, which is kept and retried, and the pool
        # replaces it.
        pool_recycle=1800,
    )
    timeouts: dict[str, str | int] = {}
    if not for_migrations:
        timeouts = {
            "statement_timeout": PG_STATEMENT_TIMEOUT_MS,
            "idle_in_transaction_session_timeout": PG_IDLE_IN_TRANSACTION_TIMEOUT_MS,
        }
    per_session(engine, parsed, pooler, timeouts)
    return engine


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
