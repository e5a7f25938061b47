"""The markers a new job records, and the holder its process starts for them."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import make_url

from celery_recovery.liveness import postgres
from celery_recovery.liveness.process import process_marker
from celery_recovery.store import behind_pooler


def uses_lock_marker(settings: Any) -> bool:
    """Whether processes hold, and sweeps check, the PostgreSQL advisory lock marker.

    Not behind a transaction-mode pooler: a session lock would stay with a server
    session the pooler hands to others.  A store that cannot be reached to find out
    gets no lock either (the process marker and the heartbeat judge this process)."""
    if (
        settings.liveness_markers != "auto"
        or make_url(settings.database_url).get_backend_name() != "postgresql"
    ):
        return False
    try:
        return not behind_pooler(
            settings.database_url, getattr(settings, "database_pooler", "auto")
        )
    except Exception:
        return False


def start_lock_marker(settings: Any, label: str) -> None:
    """Hold this process tree's advisory lock, unless a parent already does.

    A prefork worker calls this in its main process before the pool forks:
    its pool processes then record the parent's key and open no connection.
    """
    if uses_lock_marker(settings) and not postgres.has_holder():
        postgres.hold_marker(settings.database_url, settings.heartbeat_interval, label)


def job_markers(settings: Any, label: str) -> dict[str, Any]:
    """The marker columns of a job starting in this process."""
    if settings.liveness_markers == "off":
        return {}
    start_lock_marker(settings, label)
    return {
        "process_marker": process_marker(),
        "marker_lock": postgres.marker_lock_key() if uses_lock_marker(settings) else None,
    }
