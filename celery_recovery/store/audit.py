"""Writing the recovery audit log: a decision joins the transaction that applies it."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.engine import Connection

from celery_recovery.core.audit import Decision
from celery_recovery.store.schema import audit_log


def append_decision(conn: Connection, decision: Decision | None) -> None:
    """Log ``decision`` in the transaction of ``conn`` (the one that applied it)."""
    if decision is not None:
        conn.execute(audit_log.insert().values(**decision.row()))


def append_decisions(conn: Connection, decisions: Sequence[Decision]) -> None:
    """Log several decisions in the transaction of ``conn``, as one statement."""
    conn.execute(audit_log.insert(), [d.row() for d in decisions])
