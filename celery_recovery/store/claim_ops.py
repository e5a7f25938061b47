"""Publish-once claims: the first process to claim a name publishes, the others do not.

Mixed into :class:`~celery_recovery.store.Store`.  A claim is a row of the
``leases`` table: held (``holder`` set, ``expires_at`` in the future) while its
holder publishes, then completed (``completed_at`` set) for good.  A holder
that dies between claiming and completing leaves a claim that expires, so a
later contender can take it over: the work is never lost, only delayed.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.engine import Connection

from .schema import leases

#: Every claim's name starts with it (``db clean`` tells claims from other leases by it).
CLAIM_PREFIX = "claim:"
#: Longest claim name (the ``leases.name`` column).
CLAIM_NAME_MAX = 64


class Claim(StrEnum):
    """What :meth:`ClaimOperations.claim_once` found."""

    WON = "won"  # the caller holds the claim: do the work, then complete it
    DONE = "done"  # another holder completed it: the work is done
    HELD = "held"  # another live holder is doing it now


class ClaimOperations:
    """Store methods for publish-once claims, in the ``leases`` table."""

    def transaction(self) -> AbstractContextManager[Connection]:  # pragma: no cover
        raise NotImplementedError

    def _insert(self, table: Any) -> Any:  # pragma: no cover
        raise NotImplementedError

    def claim_once(self, name: str, holder: str, now: datetime, ttl: float) -> Claim:
        """Claim ``name`` for ``holder`` for ``ttl`` seconds, unless done or held elsewhere.

        ``name`` starts with :data:`CLAIM_PREFIX` and is at most :data:`CLAIM_NAME_MAX`
        characters.
        """
        if not name.startswith(CLAIM_PREFIX) or len(name) > CLAIM_NAME_MAX:
            raise ValueError(
                f"claim name {name!r}: must start with {CLAIM_PREFIX!r}, "
                f"{CLAIM_NAME_MAX} characters at most"
            )
        expires = now + timedelta(seconds=ttl)
        with self.transaction() as conn:
            inserted = conn.execute(
                self._insert(leases)
                .values(name=name, holder=holder, token=1, expires_at=expires)
                .on_conflict_do_nothing(index_elements=["name"])
                .returning(leases.c.token)
            ).first()
            if inserted is not None:
                return Claim.WON
            # Compare-and-set: take over only a claim that is not done and whose holder
            # let it expire (it died between claiming and completing).
            taken = conn.execute(
                update(leases)
                .where(
                    leases.c.name == name,
                    leases.c.completed_at.is_(None),
                    or_(leases.c.expires_at.is_(None), leases.c.expires_at < now),
                )
                .values(holder=holder, token=leases.c.token + 1, expires_at=expires)
                .returning(leases.c.token)
            ).first()
            if taken is not None:
                return Claim.WON
            done = conn.execute(select(leases.c.completed_at).where(leases.c.name == name)).scalar()
        return Claim.DONE if done is not None else Claim.HELD

    def complete_claim(self, name: str, holder: str, now: datetime) -> bool:
        """Mark ``name`` done for good; False when ``holder`` no longer held it."""
        with self.transaction() as conn:
            row = conn.execute(
                update(leases)
                .where(leases.c.name == name, leases.c.holder == holder)
                .values(completed_at=now, expires_at=None)
                .returning(leases.c.token)
            ).first()
        return row is not None

    def release_claim(self, name: str, holder: str) -> None:
        """Give up an undone claim (the work failed) so that a later contender may do it."""
        with self.transaction() as conn:
            conn.execute(
                update(leases)
                .where(
                    and_(
                        leases.c.name == name,
                        leases.c.holder == holder,
                        leases.c.completed_at.is_(None),
                    )
                )
                .values(holder=None, expires_at=None)
            )
