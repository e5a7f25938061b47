"""The metadata store: one database and the repositories that read and change it.

``store.jobs``, ``store.tries`` (with ``store.try_recovery``, what the sweeps read
and change of tries), ``store.triggers``, ``store.outbox`` and ``store.leases`` are
the main repositories; the smaller ones each keep one
table (reservations, revocations, publish-once claims, check-ins, liveness
markers of jobs, retention, beat schedules, overdue tries).  Every repository method is one short
transaction of its own; no caller code runs while one is open.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Connection, Engine

from celery_recovery.core.timeutils import follow_store_clock
from celery_recovery.core.urls import mask_url
from celery_recovery.store.beat import BeatRepository
from celery_recovery.store.checkins import CheckinRepository
from celery_recovery.store.claims import ClaimRepository
from celery_recovery.store.database import Database
from celery_recovery.store.jobs import JobRepository
from celery_recovery.store.leases import LeaseRepository
from celery_recovery.store.liveness import LivenessRepository
from celery_recovery.store.outbox import OutboxRepository
from celery_recovery.store.overdue import OverdueReads
from celery_recovery.store.reservations import ReservationRepository
from celery_recovery.store.retention import RetentionRepository
from celery_recovery.store.revocations import RevocationRepository
from celery_recovery.store.task_heartbeats import TaskHeartbeatRepository
from celery_recovery.store.tries import TryRepository
from celery_recovery.store.triggers import TriggerRepository
from celery_recovery.store.try_recovery import TryRecovery


class Store:
    """The metadata store at one database URL, safe across threads and forks."""

    def __init__(self, url: str, pooler: str = "auto") -> None:
        self.db = Database(url, pooler)
        self.jobs = JobRepository(self.db)
        self.liveness = LivenessRepository(self.db)
        self.reservations = ReservationRepository(self.db)
        self.tries = TryRepository(self.db, self.reservations)
        self.try_recovery = TryRecovery(self.db)
        self.revocations = RevocationRepository(self.db)
        self.triggers = TriggerRepository(self.db)
        self.outbox = OutboxRepository(self.db)
        self.leases = LeaseRepository(self.db)
        self.claims = ClaimRepository(self.db)
        self.checkins = CheckinRepository(self.db)
        self.retention = RetentionRepository(self.db)
        self.task_heartbeats = TaskHeartbeatRepository(self.db)
        self.beat = BeatRepository(self.db)
        self.overdue = OverdueReads(self.db)

    def __repr__(self) -> str:
        return f"<Store {mask_url(self.url)}>"

    @property
    def url(self) -> str:
        return self.db.url

    @property
    def engine(self) -> Engine:
        """This process's engine; a forked child never reuses its parent's connections."""
        return self.db.engine

    @property
    def dialect(self) -> str:
        return self.db.dialect

    def follow_clock(self) -> None:
        """Make this process's clock the store's (see
        :func:`celery_recovery.core.timeutils.follow_store_clock`): a time that decides
        liveness or ownership, written by one host and compared by another, is then one
        clock's.  Raises :class:`StoreError`."""
        read = self.db.read_clock()
        if read is not None:
            follow_store_clock(*read)

    def ensure_ready(self) -> None:
        """Check (PostgreSQL) or create (SQLite) the schema, once per process."""
        self.db.ensure_ready()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One short transaction; database errors become :class:`StoreError`s."""
        with self.db.transaction() as conn:
            yield conn

    def dispose(self) -> None:
        self.db.dispose()
