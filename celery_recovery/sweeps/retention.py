"""Retention of finished history: ``db clean`` and the ``celery_recovery.db_clean`` task.

Finished jobs, finished tries, stale callback rows, triggers of finished
tries and recovery audit rows older than a cutoff are deleted in batches,
each its own short transaction (see :mod:`celery_recovery.store.retention`), so a clean of
millions of rows never holds a lock a sweep needs for longer than one batch.

Schedule it from beat::

    from celery.schedules import crontab
    app.conf.beat_schedule["celery-recovery-db-clean"] = {
        "task": "celery_recovery.db_clean",
        "schedule": crontab(hour=3, minute=0),
        "kwargs": {"older_than": "30d"},
    }
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.timeutils import as_utc, utcnow
from celery_recovery.store import RETENTION_TABLES

if TYPE_CHECKING:
    from celery_recovery.runtime.context import RecoveryContext
    from celery_recovery.store import Store

CLEAN_TASK = "celery_recovery.db_clean"
#: Rows deleted per transaction: large enough to be fast, small enough that one
#: batch holds its row locks for well under a second.
DEFAULT_BATCH_SIZE = 10_000

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_cutoff(value: str | float | timedelta | datetime, now: datetime) -> datetime:
    """The cutoff for ``--before``: an ISO 8601 timestamp (naive means UTC), an age
    such as ``30d``, ``12h``, ``90m``, ``45s`` or ``2w``, a number of seconds, or a
    ``timedelta``/``datetime``.  A cutoff in the future is refused."""
    try:
        cutoff = _cutoff(value, now)
    except (OverflowError, ValueError) as exc:
        if isinstance(exc, ConfigurationError):
            raise
        raise ConfigurationError(
            f"--before={value!r} is out of range ({exc}); give an age such as 30d "
            "or a timestamp after year 1"
        ) from None
    if cutoff > now:
        raise ConfigurationError(
            f"--before={value!r} is in the future ({cutoff.isoformat()}); "
            "retention only deletes history older than a past time"
        )
    return cutoff


def _cutoff(value: str | float | timedelta | datetime, now: datetime) -> datetime:
    if isinstance(value, timedelta):
        cutoff = now - value
    elif isinstance(value, datetime):
        cutoff = as_utc(value)  # type: ignore[assignment]
    elif isinstance(value, int | float) and not isinstance(value, bool):
        cutoff = now - timedelta(seconds=float(value))
    elif isinstance(value, str) and (match := _AGE.match(value.lower())):
        cutoff = now - timedelta(seconds=float(match[1]) * _UNIT_SECONDS[match[2]])
    else:
        parsed = as_utc(value) if isinstance(value, str) else None
        if parsed is None:
            raise ConfigurationError(
                f"--before={value!r} is neither an ISO 8601 timestamp "
                "(e.g. 2024-05-01T00:00:00Z) nor an age (e.g. 30d, 12h, 90m)"
            )
        cutoff = parsed
    return cutoff


def check_tables(tables: Sequence[str] | None) -> tuple[str, ...]:
    """The tables to clean, in purge order; all of them when none are named."""
    if not tables:
        return RETENTION_TABLES
    unknown = sorted(set(tables) - set(RETENTION_TABLES))
    if unknown:
        raise ConfigurationError(
            f"unknown table {', '.join(unknown)} for retention; "
            f"choose from {', '.join(RETENTION_TABLES)}"
        )
    return tuple(t for t in RETENTION_TABLES if t in tables)


@dataclass
class CleanReport:
    """What a clean deleted, per table, and how long its longest batch took (seconds)."""

    cutoff: datetime
    deleted: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    longest_batch: float = 0.0
    duration: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "cutoff": self.cutoff.isoformat(),
            "deleted": dict(self.deleted),
            "batches": self.batches,
            "longest_batch": round(self.longest_batch, 4),
            "duration": round(self.duration, 4),
        }


def count_expired(
    store: Store, cutoff: datetime, tables: Sequence[str], now: datetime | None = None
) -> dict[str, int]:
    """Rows per table a clean would delete now."""
    now = now or utcnow()
    return {name: store.retention.count_expired(name, cutoff, now) for name in tables}


def clean(
    store: Store,
    cutoff: datetime,
    tables: Sequence[str] = RETENTION_TABLES,
    batch_size: int = DEFAULT_BATCH_SIZE,
    now: datetime | None = None,
) -> CleanReport:
    """Delete expired rows of ``tables`` in batches of ``batch_size`` until none are left.

    A table is done when a batch deletes nothing; rows skipped because another
    transaction held them are left for the next clean.
    """
    if batch_size < 1:
        raise ConfigurationError(f"batch_size={batch_size!r} must be at least 1")
    now = now or utcnow()
    report = CleanReport(cutoff=cutoff)
    started = time.perf_counter()
    for name in tables:
        report.deleted[name] = 0
        while True:
            batch_started = time.perf_counter()
            deleted = store.retention.delete_expired_batch(name, cutoff, now, batch_size)
            report.longest_batch = max(report.longest_batch, time.perf_counter() - batch_started)
            if deleted == 0:
                break
            report.batches += 1
            report.deleted[name] += deleted
    report.duration = time.perf_counter() - started
    return report


def register_clean_task(context: RecoveryContext) -> None:
    """Register ``celery_recovery.db_clean`` on the app, for beat to schedule."""

    @context.app.task(name=CLEAN_TASK, shared=False, ignore_result=True)
    def db_clean(
        older_than: str | float = "30d",
        tables: list[str] | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> dict[str, Any]:
        """Delete celery-recovery history older than ``older_than`` (e.g. ``"30d"``)."""
        now = utcnow()
        cutoff = parse_cutoff(older_than, now)
        return clean(context.store, cutoff, check_tables(tables), batch_size, now).as_dict()
