"""Writing the recovery audit log: a decision joins the transaction that applies it."""

from __future__ import annotations

from sqlalchemy.engine import Connection

from ..audit import Decision
from .schema import audit_log


def append_decision(conn: Connection, decision: Decision | None) -> None:
    """Log ``decision`` in the transaction of ``conn`` (the one that applied it)."""
    if decision is not None:
        conn.execute(audit_log.insert().values(**decision.row()))
