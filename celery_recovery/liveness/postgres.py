"""The PostgreSQL marker: a session-level advisory lock on a connection of its own.

PostgreSQL frees a session's advisory locks the moment its connection ends,
and the kernel ends the connection the moment the process dies, so a lock
missing from ``pg_locks`` says "this process is gone" within milliseconds,
long before a heartbeat could.  A paused or busy process keeps its
connection and its lock.

One holder per process tree, not per process: the worker's main process
takes the lock before it forks its pool, and each pool process records the
same key on its job (it inherits the key, never the connection).  That costs
one connection per worker, beat and triggerer instead of one per pool
process.  A pool process killed alone is reported by Celery itself.

The holder watches its socket: a connection the server closed (a restart,
``pg_terminate_backend``) is replaced and the lock taken again at once, so a
sweep sees the lock missing only briefly; it needs to see it missing twice,
a while apart, before it believes it (see :mod:`celery_recovery.sweeps.liveness`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import select
import threading
from typing import Any

from sqlalchemy.engine import make_url

from celery_recovery.core.urls import mask_secrets

logger = logging.getLogger("celery_recovery.liveness")

#: Seconds between two attempts to reconnect a lost marker connection, or to take a lock
#: its old session still holds (a connection the server has not yet seen end): well
#: within the marker watch's confirmation (1 s), so a live holder is never judged dead.
RECONNECT_DELAY = 0.25
#: Seconds a connection attempt may take.
CONNECT_TIMEOUT = 3


class MarkerHolder(threading.Thread):
    """Holds one advisory lock, on a connection of its own, for as long as the process lives."""

    def __init__(self, url: str, interval: float, label: str) -> None:
        super().__init__(name="celery-recovery-liveness-marker", daemon=True)
        self.conninfo = make_url(url).set(drivername="postgresql").render_as_string(False)
        self.interval = interval
        self.label = label
        #: A random key: nothing else in the database uses it, and a restarted process
        #: never takes the key of the one it replaces.
        self.key = secrets.randbits(62) + 1
        self.pid = os.getpid()
        self._conn: Any = None
        self._held = threading.Event()
        self._stop_event = threading.Event()

    @property
    def held(self) -> bool:
        return self._held.is_set()

    @property
    def session_pid(self) -> int | None:
        """The server process of the marker's session (``pg_stat_activity.pid``)."""
        conn = self._conn
        return None if conn is None else int(conn.info.backend_pid)

    def acquire(self) -> bool:
        """Connect and take the lock now (called once before the thread starts)."""
        try:
            self._connect()
        except Exception as exc:
            logger.warning(
                "celery-recovery: cannot hold a liveness marker (%s); this process will be "
                "judged by its heartbeat alone until it can",
                _first_line(exc),
            )
        return self.held

    def run(self) -> None:
        while not self._stop_event.is_set():
            if self._conn is None:
                try:
                    self._connect()
                except Exception as exc:
                    logger.debug("celery-recovery: marker reconnect failed: %s", exc)
                    self._stop_event.wait(RECONNECT_DELAY)
                    continue
            self._watch()

    def stop(self) -> None:
        self._stop_event.set()
        self._drop()

    def _connect(self) -> None:
        import psycopg

        idle = max(1, int(self.interval))
        conn = psycopg.connect(
            self.conninfo,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            application_name=f"celery-recovery marker {self.label}"[:63],
            keepalives=1,
            keepalives_idle=idle,
            keepalives_interval=idle,
            keepalives_count=3,
            # The server notices a vanished host (no FIN, e.g. a node lost) in seconds.
            options=(
                f"-c tcp_keepalives_idle={idle} -c tcp_keepalives_interval={idle} "
                "-c tcp_keepalives_count=3"
            ),
        )
        self._conn = conn
        if not self._take(conn):
            logger.info(
                "celery-recovery: liveness marker key %s is still held by this process's "
                "previous session; taking it when that session ends",
                self.key,
            )

    def _take(self, conn: Any) -> bool:
        # The key is random and ours: a session holding it is this process's previous
        # one, which the server has not yet seen end (a cut network, no FIN).
        got = conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
        if got and got[0]:
            self._held.set()
            return True
        self._held.clear()
        return False

    def _watch(self) -> None:
        """Wait for the server to close the connection, or check it once per interval
        (every RECONNECT_DELAY while the lock is not yet ours again)."""
        conn = self._conn
        held = self.held
        try:
            # Readable means the server sent something unasked: it is ending the session,
            # and the round trip below reads why.  Otherwise, once per interval, the round
            # trip catches a connection that ended without a word.
            select.select([conn.fileno()], [], [], self.interval if held else RECONNECT_DELAY)
            if self._stop_event.is_set():
                return
            if held:
                conn.execute("SELECT 1")
            elif self._take(conn):
                logger.info("celery-recovery: liveness marker key %s taken again", self.key)
        except Exception as exc:
            logger.info("celery-recovery: liveness marker connection lost (%s); retaking", exc)
            self._drop()

    def _drop(self) -> None:
        self._held.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def forget_in_child(self) -> None:
        """In a forked child: let go of the parent's connection without closing it."""
        conn, self._conn = self._conn, None
        self._stop_event.set()
        if conn is None:
            return
        try:
            fd = conn.fileno()
        except Exception:
            return
        # Point the inherited descriptor at /dev/null: when the copy is collected, the
        # goodbye message libpq sends must not reach (and end) the parent's session.
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
        _kept_in_child.append(conn)


#: Inherited connections a child must never close or let be collected while in use.
_kept_in_child: list[Any] = []

_holder: MarkerHolder | None = None
_holder_lock = threading.Lock()


def hold_marker(url: str, interval: float, label: str) -> MarkerHolder:
    """Start this process's marker holder (once per process)."""
    global _holder
    with _holder_lock:
        if _holder is not None and _holder.pid == os.getpid():
            return _holder
        holder = MarkerHolder(url, interval, label)
        holder.acquire()
        holder.start()
        _holder = holder
        return holder


def marker_lock_key() -> int | None:
    """The key this process's job records: its own holder's, or the one its parent held
    when it forked this process; None when no lock is held."""
    holder = _holder
    if holder is None or not holder.held:
        return None
    return holder.key


def has_holder() -> bool:
    """Whether this process, or the parent it was forked from, started a holder."""
    return _holder is not None


def _after_fork_in_child() -> None:
    holder = _holder
    if holder is not None and holder.pid != os.getpid():
        holder.forget_in_child()


def stop_holder() -> None:
    """Release the marker (a clean shutdown: the job is ended first)."""
    global _holder
    with _holder_lock:
        holder, _holder = _holder, None
    if holder is not None and holder.pid == os.getpid():
        holder.stop()


def _first_line(exc: BaseException) -> str:
    return mask_secrets(
        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    )


os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["MarkerHolder", "has_holder", "hold_marker", "marker_lock_key", "stop_holder"]
