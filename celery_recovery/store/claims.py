"""Publish-once claims: the first process to claim a name publishes, the others do not.

A claim is a row of the ``publish_claims``
table: held (``holder`` set, ``expires_at`` in the future) while its
holder publishes, then completed (``completed_at`` set) for good.  A holder
that dies between claiming and completing leaves a claim that expires, so a
later contender can take it over: the work is never lost, only delayed.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import and_, or_, select, update

from celery_recovery.store.repository import Repository
from celery_recovery.store.schema import publish_claims

#: Every claim's name starts with it: it names what the claim is for in the audit
#: and the console, beside other named rows (leases, check-ins).
CLAIM_PREFIX = "claim:"
#: Longest claim name (the ``publish_claims.name`` column).
CLAIM_NAME_MAX = 64


class Claim(StrEnum):
    """What :meth:`ClaimRepository.claim_once` found."""

    WON = "won"  # the caller holds the claim: do the work, then complete it
    DONE = "done"  # another holder completed it: the work is done
    HELD = "held"  # another live holder is doing it now


class ClaimRepository(Repository):
    """Store methods for publish-once claims, in the ``publish_claims`` table."""

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
                self._insert(publish_claims)
                .values(name=name, holder=holder, token=1, expires_at=expires)
                .on_conflict_do_nothing(index_elements=["name"])
                .returning(publish_claims.c.token)
            ).first()
            if inserted is not None:
                return Claim.WON
            # Compare-and-set: take over only a claim that is not done and whose holder
            # let it expire (it died between claiming and completing).
            taken = conn.execute(
                update(publish_claims)
                .where(
                    publish_claims.c.name == name,
                    publish_claims.c.completed_at.is_(None),
                    or_(publish_claims.c.expires_at.is_(None), publish_claims.c.expires_at < now),
                )
                .values(holder=holder, token=publish_claims.c.token + 1, expires_at=expires)
                .returning(publish_claims.c.token)
            ).first()
            if taken is not None:
                return Claim.WON
            done = conn.execute(
                select(publish_claims.c.completed_at).where(publish_claims.c.name == name)
            ).scalar()
        return Claim.DONE if done is not None else Claim.HELD

    def complete_claim(self, name: str, holder: str, now: datetime) -> bool:
        """Mark ``name`` done for good; False when ``holder`` no longer held it."""
        with self.transaction() as conn:
            row = conn.execute(
                update(publish_claims)
                .where(publish_claims.c.name == name, publish_claims.c.holder == holder)
                .values(completed_at=now, expires_at=None)
                .returning(publish_claims.c.token)
            ).first()
        return row is not None

    def release_claim(self, name: str, holder: str) -> None:
        """Give up an undone claim (the work failed) so that a later contender may do it."""
        with self.transaction() as conn:
            conn.execute(
                update(publish_claims)
                .where(
                    and_(
                        publish_claims.c.name == name,
                        publish_claims.c.holder == holder,
                        publish_claims.c.completed_at.is_(None),
                    )
                )
                .values(holder=None, expires_at=None)
            )
