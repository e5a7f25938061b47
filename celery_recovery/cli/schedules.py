"""``celery-recovery inspect schedules``: the HA beat's entries, their runs, and who leads."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click
from celery.schedules import maybe_schedule

from celery_recovery.beat.leadership import LEASE
from celery_recovery.beat.times import next_after
from celery_recovery.cli.output import Column, emit
from celery_recovery.cli.support import store_of
from celery_recovery.core.records import BeatEntryRow
from celery_recovery.core.timeutils import utcnow


@click.command("schedules")
@click.option(
    "--json", "as_json", is_flag=True, help="Print a JSON list of objects instead of a table."
)
@click.pass_context
def schedules(ctx: click.Context, as_json: bool) -> None:
    """Beat entries kept by celery_recovery.beat:Scheduler: last and next run, missed runs.

    Shows, for each entry, its last run sent (scheduled time and task id), a run
    claimed and not yet confirmed sent, the next scheduled time (with --app, from
    the app's beat_schedule), and how many runs were missed and why; and which
    beat leads, with its fencing token.

    \b
    Example:
      celery-recovery --app proj.celery:app inspect schedules
    """
    now = utcnow()
    app = ctx.find_root().meta.get("celery_recovery", {}).get("app")
    with store_of(ctx) as (store, _settings):
        found = store.beat.entries()
        lease = store.leases.lease(LEASE)
    leading = lease is not None and lease["holder"] and lease["expires_at"] > now
    leader = lease["holder"] if leading and lease else None
    token = lease["token"] if leading and lease else None
    configured = (app.conf.beat_schedule or {}) if app is not None else {}
    rows = [_row(r, configured.get(r["name"]), app, now, leader, token) for r in found]
    columns = [
        Column("ENTRY", "name"),
        Column("TASK", "task"),
        Column("SCHEDULE", "schedule"),
        Column("LAST RUN", "last_run_at"),
        Column("LAST TASK ID", "last_task_id"),
        Column("UNSENT", "pending_task_id"),
        Column("NEXT RUN", "next_run_at"),
        Column("MISSED", "missed_count"),
        Column("WHY MISSED", "last_missed_reason"),
    ]
    if not as_json:
        click.echo(
            f"leader: {leader} (fencing token {token})"
            if leader
            else "leader: none (no beat holds the lease: is a beat with "
            "celery_recovery.beat:Scheduler running?)"
        )
    emit(rows, columns, as_json, "no beat entries in the store")


def _row(
    r: BeatEntryRow,
    spec: dict[str, Any] | None,
    app: Any,
    now: datetime,
    leader: str | None,
    token: int | None,
) -> dict[str, Any]:
    upcoming = None
    if spec is not None and "schedule" in spec:
        try:
            sched = maybe_schedule(spec["schedule"], spec.get("relative", False), app=app)
            upcoming = next_after(sched, r["last_run_at"], now)
        except Exception:  # a schedule the CLI cannot evaluate: shown as unknown
            upcoming = None
    return {
        "name": r["name"],
        "task": r["task"],
        "schedule": r.get("schedule"),
        "last_run_at": r.get("last_sent_run_at"),
        "last_task_id": r.get("last_task_id"),
        "last_sent_at": r.get("last_sent_at"),
        "pending_task_id": r.get("pending_task_id"),
        "pending_run_at": r.get("pending_run_at"),
        "next_run_at": upcoming,
        "decided_until": r["last_run_at"],
        "total_run_count": r.get("total_run_count"),
        "missed_count": r.get("missed_count"),
        "last_missed_at": r.get("last_missed_at"),
        "last_missed_reason": r.get("last_missed_reason"),
        "leader": leader,
        "leader_token": token,
    }
