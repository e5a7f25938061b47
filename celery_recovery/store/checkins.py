"""Check-ins: when a named piece of recurring work (the sweep) last finished, and its report."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    select,
)

from celery_recovery.store.repository import Repository
from celery_recovery.store.schema import (
    checkins,
)


class CheckinRepository(Repository):
    """Record and read the last completion of named work."""

    def mark_completed(
        self, name: str, now: datetime, report: dict[str, Any] | None = None
    ) -> None:
        """Record that the work named ``name`` (e.g. a sweep) finished at ``now``, and
        what it reported (kept when ``report`` is None)."""
        done: dict[str, Any] = {"completed_at": now}
        if report is not None:
            done["report"] = report
        with self.transaction() as conn:
            conn.execute(
                self._insert(checkins)
                .values(name=name, **done)
                .on_conflict_do_update(index_elements=["name"], set_=done)
            )

    def last(self, name: str) -> tuple[datetime, dict[str, Any]] | None:
        """When the work named ``name`` last finished, and its report ({} if none)."""
        with self.transaction() as conn:
            row = conn.execute(
                select(checkins.c.completed_at, checkins.c.report).where(checkins.c.name == name)
            ).first()
        if row is None:
            return None
        return row.completed_at, row.report if isinstance(row.report, dict) else {}

    def last_completed(self, name: str) -> datetime | None:
        with self.transaction() as conn:
            return conn.execute(
                select(checkins.c.completed_at).where(checkins.c.name == name)
            ).scalar()
