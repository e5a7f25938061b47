"""Revocations and purges made through a Recovery app's control object.

Rows are only inserted and
read: the lost-message sweep consults them before it publishes an overdue
queued try again (see :mod:`celery_recovery.sweeps.revocations`); ``db clean`` ages
them out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, or_, select

from celery_recovery.store.repository import Repository, rows_of
from celery_recovery.store.schema import revocations


class RevocationRepository(Repository):
    """Store methods for :mod:`celery_recovery.sweeps.revocations`."""

    def record_revocations(self, rows: Sequence[dict[str, Any]]) -> None:
        """Insert revocation rows (``kind`` task/stamp/purge, ``created_at``, and their key)."""
        if not rows:
            return
        with self.transaction() as conn:
            conn.execute(revocations.insert(), [_uniform(row) for row in rows])

    def revocations_for(self, task_ids: Iterable[str], since: datetime) -> list[dict[str, Any]]:
        """Revocations that may concern these tries: their ids, any stamp, purges after ``since``.

        Celery's workers discard a revoked id or stamp whenever they meet it,
        before or after the revoke, so those rows count whatever their age; a
        purge only removed what was waiting in the queue when it ran.
        """
        ids = sorted(set(task_ids))
        if not ids:
            return []
        c = revocations.c
        stmt = select(revocations).where(
            or_(
                and_(c.kind == "task", c.task_id.in_(ids)),
                c.kind == "stamp",
                and_(c.kind == "purge", c.created_at > since),
            )
        )
        with self.transaction() as conn:
            return rows_of(conn.execute(stmt))


def _uniform(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "task_id": None,
        "header": None,
        "value": None,
        "queue": None,
        **row,
    }
