"""Leases with fencing tokens: one holder at a time for work such as the fallback sweep."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    case,
    func,
    or_,
    select,
    update,
)

from celery_recovery.store.repository import Repository
from celery_recovery.store.schema import (
    leases,
)


class LeaseRepository(Repository):
    """Take or extend a named lease."""

    def acquire_lease(self, name: str, holder: str, now: datetime, ttl: float) -> int | None:
        """Take or extend lease ``name``; returns its fencing token, or None when held elsewhere.

        The token grows by one with every new holder, so work guarded by an
        older token can be told apart from the current holder's.
        """
        expires = now + timedelta(seconds=ttl)
        with self.transaction() as conn:
            conn.execute(
                self._insert(leases)
                .values(name=name, token=0)
                .on_conflict_do_nothing(index_elements=["name"])
            )
            stmt = (
                update(leases)
                .where(
                    leases.c.name == name,
                    or_(
                        leases.c.holder == holder,
                        leases.c.expires_at.is_(None),
                        leases.c.expires_at < now,
                    ),
                )
                .values(
                    token=func.coalesce(
                        # Same holder extending keeps its token; a new holder gets the next one.
                        _same_holder_token(holder),
                        leases.c.token + 1,
                    ),
                    holder=holder,
                    expires_at=expires,
                )
                .returning(leases.c.token)
            )
            row = conn.execute(stmt).first()
        return int(row[0]) if row else None

    def take_over_lease(
        self, name: str, holder: str, dead_holder: str, dead_token: int, now: datetime, ttl: float
    ) -> int | None:
        """Take lease ``name`` from ``dead_holder`` before it expires (its process was seen
        dead), only while that holder still holds it with ``dead_token``; the new token."""
        stmt = (
            update(leases)
            .where(
                leases.c.name == name,
                leases.c.holder == dead_holder,
                leases.c.token == dead_token,
            )
            .values(
                token=leases.c.token + 1,
                holder=holder,
                expires_at=now + timedelta(seconds=ttl),
            )
            .returning(leases.c.token)
        )
        with self.transaction() as conn:
            row = conn.execute(stmt).first()
        return int(row[0]) if row else None

    def release_lease(self, name: str, holder: str) -> bool:
        """Give up lease ``name`` if ``holder`` holds it, so that another may take it now."""
        stmt = (
            update(leases)
            .where(leases.c.name == name, leases.c.holder == holder)
            .values(holder=None, expires_at=None)
        )
        with self.transaction() as conn:
            return conn.execute(stmt).rowcount == 1

    def lease(self, name: str) -> dict[str, Any] | None:
        """Lease ``name``'s holder, token and expiry, or None when never taken."""
        stmt = select(leases.c.holder, leases.c.token, leases.c.expires_at).where(
            leases.c.name == name
        )
        with self.transaction() as conn:
            row = conn.execute(stmt).mappings().first()
        return dict(row) if row is not None else None


def _same_holder_token(holder: str) -> Any:
    return case((leases.c.holder == holder, leases.c.token), else_=None)
