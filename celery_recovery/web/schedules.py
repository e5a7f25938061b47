"""The console's Schedules page: the HA beat's entries, their runs, and who leads."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select

from celery_recovery.store import BEAT_LEASE
from celery_recovery.store.schema import beat_entries, leases
from celery_recovery.web.readonly import ReadOnlyStore, fetch_rows


def schedules(store: ReadOnlyStore, now: datetime) -> dict[str, Any]:
    """Every stored beat entry (by name) and the lead: holder, token, seconds left."""
    with store.reading() as conn:
        rows = fetch_rows(conn, select(beat_entries).order_by(beat_entries.c.name))
        lease = fetch_rows(conn, select(leases).where(leases.c.name == BEAT_LEASE))
    leader = None
    if lease and lease[0]["holder"] and lease[0]["expires_at"] and lease[0]["expires_at"] > now:
        left = (lease[0]["expires_at"] - now).total_seconds()
        leader = {"holder": lease[0]["holder"], "token": lease[0]["token"], "seconds_left": left}
    return {"leader": leader, "rows": rows}
