"""``celery-recovery inspect ...``: what the store knows, as tables or JSON.

Each view answers one operator question; the rows are built here from store
rows (never the raw records, which hold task arguments) so the table and the
JSON show the same facts.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from celery_recovery.cli.output import ROW_COUNT, Column, age_seconds, emit, seconds_text, yes_no
from celery_recovery.cli.support import CLIError, dead_after, settings_of, store_of
from celery_recovery.core.consumer import stalled_reason
from celery_recovery.core.overdue import OverduePolicy
from celery_recovery.core.records import ZombieRow
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.core.states import JobState, JobType, TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.core.urls import mask_secrets, mask_url
from celery_recovery.store import MISSING_JOB_GRACE

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print a JSON list of objects instead of a table."
)
limit_option = click.option(
    "--limit", default=500, show_default=True, type=ROW_COUNT, help="Rows at most."
)


@click.group()
def inspect() -> None:
    """Show zombies, orphaned triggers, deferred and overdue tasks, jobs, tries, locks, schedules.

    \b
    Example:
      celery-recovery --app proj.celery:app inspect zombies
      celery -A proj recovery inspect jobs --json | jq '.[] | select(.alive == false)'
    """


@inspect.command("zombies")
@json_option
@limit_option
@click.pass_context
def zombies(ctx: click.Context, as_json: bool, limit: int) -> None:
    """Running tries whose worker stopped heartbeating (older than recovery_zombie_threshold).

    These are what the next sweep will probe, then retry or fail.  Running
    tries whose worker is already silent (no heartbeat for two intervals) but
    not yet past the threshold are listed too, with the time left before they
    are judged: right after a kill, that is where the killed worker's tasks are.

    \b
    Example:
      celery-recovery --app proj.celery:app inspect zombies
    """
    now = utcnow()
    with store_of(ctx) as (store, settings):
        silent_after = SILENT_HEARTBEATS * settings.heartbeat_interval
        found = store.try_recovery.find_zombies(
            now, min(silent_after, settings.zombie_threshold), limit
        )
    rows = [_zombie_row(r, now, settings.zombie_threshold) for r in found]
    columns = [
        Column("TASK ID", "task_id"),
        Column("TRY", "try_number"),
        Column("TASK", "task_name"),
        Column("WORKER", "worker"),
        Column("PID", "worker_pid"),
        Column("HEARTBEAT AGE", "heartbeat_age", seconds_text),
        Column("STATUS", "status"),
        Column("STARTED", "started_at"),
    ]
    emit(
        rows,
        columns,
        as_json,
        f"no zombies: every running try's worker heartbeat is under {silent_after:g}s old",
    )
    silent = [r for r in rows if r["judged_in"]]
    if silent and not as_json:
        soonest = min(r["judged_in"] for r in silent)
        click.echo(
            f"{len(silent)} running {'try has' if len(silent) == 1 else 'tries have'} a silent "
            f"worker, not yet a zombie: judged at recovery_zombie_threshold="
            f"{settings.zombie_threshold:g}s, the first in {soonest:.1f}s"
        )


#: Heartbeat intervals without a beat after which a worker counts as silent.
SILENT_HEARTBEATS = 2


def _zombie_row(r: ZombieRow, now: datetime, threshold: float) -> dict[str, Any]:
    """One row of `inspect zombies`: a zombie, or a silent worker's try with the seconds
    left before the sweep's own test (store.try_recovery.find_zombies) calls it one."""
    age = age_seconds(now, r["job_heartbeat"])
    judged_in: float | None = None
    if r["adopted_until"] is None:
        if r["job_state"] == JobState.RUNNING and age is not None and age < threshold:
            judged_in = threshold - age
        elif r["job_state"] is None and r["started_at"] is not None:
            # A job that never registered gets a grace period on top of the threshold.
            left = threshold + MISSING_JOB_GRACE - (now - r["started_at"]).total_seconds()
            judged_in = left if left > 0 else None
    silent = judged_in is not None
    return {
        "task_id": r["task_id"],
        "try_number": r["try_number"],
        "task_name": r["task_name"],
        "queue": r["queue"],
        # The Celery node name (celery@host), as `inspect tasks` and Celery's own tools show.
        "worker": r["job_node_name"] or r["worker_hostname"],
        "worker_pid": r["job_pid"] or r["worker_pid"],
        "job_id": r["job_id"],
        "job_state": r["job_state"],
        "heartbeat_age": age,
        "status": "silent" if silent else "zombie",
        "judged_in": round(judged_in, 1) if judged_in is not None else None,
        "started_at": r["started_at"],
    }


@inspect.command("orphans")
@json_option
@limit_option
@click.pass_context
def orphans(ctx: click.Context, as_json: bool, limit: int) -> None:
    """Triggers that no live triggerer runs (unassigned, or their triggerer is dead).

    A triggerer is live while its job is running and its heartbeat is younger
    than recovery_health_check_threshold.  Queues whose waiting triggers are
    held by no live triggerer at all are flagged.

    \b
    Example:
      celery-recovery --app proj.celery:app inspect orphans
    """
    now = utcnow()
    with store_of(ctx) as (store, settings):
        threshold = settings.health_check_threshold
        found = store.triggers.orphan_triggers(now, threshold, limit)
        served = store.triggers.queues_served(now, threshold)
        live_triggerers = store.jobs.live_jobs(now, threshold, JobType.TRIGGERER)
    rows = [
        {
            "trigger_id": r["id"],
            "classpath": r["classpath"],
            "task_id": r["task_id"],
            "try_number": r["try_number"],
            "queue": r["queue"],
            "timeout_at": r["timeout_at"],
            "created_at": r["created_at"],
            "triggerer_id": r["triggerer_id"],
            "triggerer_state": r["triggerer_state"],
            "triggerer_heartbeat_age": age_seconds(now, r["triggerer_heartbeat"]),
            "queue_without_live_triggerer": r["queue"] not in served,
        }
        for r in found
    ]
    columns = [
        Column("TRIGGER", "trigger_id"),
        Column("TASK ID", "task_id"),
        Column("TRY", "try_number"),
        Column("QUEUE", "queue"),
        Column("CLASS", "classpath"),
        Column("TRIGGERER", "triggerer_id", lambda v: v or "(unassigned)"),
        Column("TRIGGERER STATE", "triggerer_state"),
        Column("HEARTBEAT AGE", "triggerer_heartbeat_age", seconds_text),
        Column("CREATED", "created_at"),
    ]
    emit(rows, columns, as_json, "no orphaned triggers")
    if as_json:
        return
    unserved = sorted({r["queue"] or "(none)" for r in rows if r["queue_without_live_triggerer"]})
    note = "no live triggerer holds any of them" if live_triggerers else "no triggerer is live"
    for queue in unserved:
        click.echo(click.style(f"queue {queue}: triggers waiting, {note}", fg="red"))


@inspect.command("deferred")
@json_option
@limit_option
@click.pass_context
def deferred(ctx: click.Context, as_json: bool, limit: int) -> None:
    """Deferred tries with their trigger, queue and triggerer (and whether it is live).

    \b
    Example:
      celery-recovery --app proj.celery:app inspect deferred --json
    """
    now = utcnow()
    with store_of(ctx) as (store, settings):
        found = store.triggers.deferred_tries(now, settings.health_check_threshold, limit)
    rows = [
        {
            "task_id": r["task_id"],
            "try_number": r["try_number"],
            "task_name": r["task_name"],
            "queue": r["trigger_queue"] or r["task_queue"],
            "trigger_id": r["trigger_id"],
            "classpath": r["classpath"],
            "timeout_at": r["timeout_at"],
            "triggerer_id": r["triggerer_id"],
            "triggerer_alive": r["triggerer_alive"],
            "deferred_at": r["deferred_at"],
        }
        for r in found
    ]
    columns = [
        Column("TASK ID", "task_id"),
        Column("TRY", "try_number"),
        Column("TASK", "task_name"),
        Column("QUEUE", "queue"),
        Column("TRIGGER", "trigger_id"),
        Column("CLASS", "classpath"),
        Column("TRIGGERER", "triggerer_id", lambda v: v or "(unassigned)"),
        Column("LIVE", "triggerer_alive", yes_no, coloured=True),
        Column("TIMEOUT", "timeout_at"),
    ]
    emit(rows, columns, as_json, "no deferred tries")


@inspect.command("overdue")
@json_option
@limit_option
@click.pass_context
def overdue(ctx: click.Context, as_json: bool, limit: int) -> None:
    """Running tries far past their task's usual duration: possibly hung.

    A try is overdue once it has run recovery_overdue_factor times the 95th
    percentile of its task's last 200 successful runs (USUAL), and at least
    recovery_overdue_min_seconds; a task with fewer than recovery_overdue_min_runs
    successful runs is never judged.  Nothing is done to an overdue try.  LAST BEAT
    is how long ago it called heartbeat(), for tasks that do (docs/stuck.md).

    \b
    Example:
      celery-recovery --app proj.celery:app inspect overdue
    """
    now = utcnow()
    with store_of(ctx) as (store, settings):
        found = store.overdue.find(now, OverduePolicy.of(settings), limit)
    keys = ("task_id", "try_number", "task_name", "queue", "job_id", "worker_pid", "started_at")
    rows = [
        {key: r[key] for key in keys}
        | {"worker": r["worker_hostname"], "age": r["age"], "bound": r["bound"]}
        | {"usual": r["usual"], "runs": r["runs"], "last_beat": r["last_beat"]}
        | {"beat_age": age_seconds(now, r["last_beat"])}
        for r in found
    ]
    columns = [
        Column("TASK ID", "task_id"),
        Column("TRY", "try_number"),
        Column("TASK", "task_name"),
        Column("WORKER", "worker"),
        Column("RUNNING FOR", "age", seconds_text),
        Column("OVERDUE AFTER", "bound", seconds_text),
        Column("USUAL", "usual", seconds_text),
        Column("LAST BEAT", "beat_age", seconds_text),
    ]
    emit(
        rows,
        columns,
        as_json,
        f"no overdue tries: none has run {settings.overdue_factor:g} times its task's usual "
        f"duration (and {settings.overdue_min_seconds:g}s)",
    )


@inspect.command("jobs")
@click.option(
    "--job-type", type=click.Choice([t.value for t in JobType]), help="Only jobs of this type."
)
@click.option("--all", "include_ended", is_flag=True, help="Also jobs that have ended.")
@json_option
@limit_option
@click.pass_context
def jobs_view(
    ctx: click.Context, job_type: str | None, include_ended: bool, as_json: bool, limit: int
) -> None:
    """Workers, beats and triggerers: state, host, pid, heartbeat age and whether alive.

    Alive means running with a heartbeat younger than recovery_zombie_threshold
    (workers) or recovery_health_check_threshold (beat, triggerer).  CONSUMER is a
    worker main process's own verdict on its consumer: "consuming", or "stalled: why"
    (docs/stuck.md).

    \b
    Example:
      celery-recovery --app proj.celery:app inspect jobs --job-type worker
    """
    now = utcnow()
    with store_of(ctx) as (store, settings):
        found = store.jobs.jobs_overview(job_type, include_ended, limit)
    rows = [_job_row(job, now, settings) for job in found]
    columns = [
        Column("JOB ID", "id"),
        Column("TYPE", "job_type"),
        Column("STATE", "state", coloured=True),
        Column("HOST", "hostname"),
        Column("NODE", "node_name"),
        Column("PID", "pid"),
        Column("HEARTBEAT AGE", "heartbeat_age", seconds_text),
        Column("ALIVE", "alive", yes_no, coloured=True),
        Column("CONSUMER", "consumer", lambda v: v or ""),
        Column("STARTED", "start_date"),
    ]
    emit(rows, columns, as_json, "no jobs" if include_ended else "no running jobs (try --all)")


def _job_row(job: dict[str, Any], now: datetime, settings: RecoverySettings) -> dict[str, Any]:
    age = age_seconds(now, job["latest_heartbeat"])
    alive = (
        job["state"] == JobState.RUNNING.value
        and age is not None
        and age <= dead_after(job["job_type"], settings)
    )
    return {
        "id": job["id"],
        "job_type": job["job_type"],
        "state": job["state"],
        "hostname": job["hostname"],
        "node_name": job["node_name"],
        "pid": job["pid"],
        "start_date": job["start_date"],
        "end_date": job["end_date"],
        "latest_heartbeat": job["latest_heartbeat"],
        "heartbeat_age": age,
        "alive": alive,
        # A worker main process's consumer: "stalled: why", "consuming", or None.
        "consumer": _consumer_text(job.get("consumer")) if alive else None,
        "consumer_state": job.get("consumer"),
    }


def _consumer_text(consumer: dict[str, Any] | None) -> str | None:
    if not consumer:
        return None
    reason = stalled_reason(consumer)
    return f"stalled: {reason}" if reason else "consuming"


@inspect.command("tasks")
@click.option(
    "--state", type=click.Choice([s.value for s in TaskState]), help="Only tries in this state."
)
@click.option("--task-name", metavar="NAME", help="Only tries of this task name.")
@click.option("--limit", default=50, show_default=True, type=ROW_COUNT, help="Rows at most.")
@json_option
@click.pass_context
def tasks(
    ctx: click.Context, state: str | None, task_name: str | None, limit: int, as_json: bool
) -> None:
    """Task tries, most recently changed first, filtered by state and task name.

    LAST BEAT is how long ago a try last called heartbeat(); --json also gives its
    time and details (docs/stuck.md).  OVERDUE marks a running try far past its
    task's usual duration (see `inspect overdue`).

    \b
    Example:
      celery-recovery --app proj.celery:app inspect tasks --state failed --task-name shop.charge
    """
    now = utcnow()
    with store_of(ctx) as (store, settings):
        found = store.tries.list_tries(state=state, task_name=task_name, limit=limit)
        beats = store.task_heartbeats.beats_of((r["task_id"], r["try_number"]) for r in found)
        overdue: set[tuple[str, int]] = set()
        if any(r["state"] == TaskState.RUNNING for r in found):
            policy = OverduePolicy.of(settings)
            overdue = {(r["task_id"], r["try_number"]) for r in store.overdue.find(now, policy)}
    rows = [
        {
            key: r[key]
            for key in (
                "task_id",
                "try_number",
                "task_name",
                "state",
                "queue",
                "worker_pid",
                "job_id",
                "queued_at",
                "started_at",
                "ended_at",
                "updated_at",
                "state_reason",
                "error",
            )
        }
        | {"worker": r["worker_hostname"]}  # Celery's node name, as in `inspect zombies`
        | _beat_of(beats.get((r["task_id"], r["try_number"])), now)
        | {"overdue": (r["task_id"], r["try_number"]) in overdue}
        for r in found
    ]
    columns = [
        Column("TASK ID", "task_id"),
        Column("TRY", "try_number"),
        Column("TASK", "task_name"),
        Column("STATE", "state", coloured=True),
        Column("QUEUE", "queue"),
        Column("WORKER", "worker"),
        Column("UPDATED", "updated_at"),
        Column("LAST BEAT", "beat_age", seconds_text),
        Column("OVERDUE", "overdue", lambda v: "overdue" if v else "-"),
        Column("REASON", "state_reason", lambda v: _clip(v or "-", 60)),
    ]
    emit(rows, columns, as_json, "no tries match")


def _beat_of(beat: dict[str, Any] | None, now: datetime) -> dict[str, Any]:
    """A try's last ``heartbeat()`` (docs/stuck.md): when, how long ago, its details."""
    if beat is None:
        return {"last_beat": None, "beat_age": None, "beat_details": None}
    at = beat["beat_at"]
    return {"last_beat": at, "beat_age": age_seconds(now, at), "beat_details": beat["details"]}


@inspect.command("locks")
@json_option
@limit_option
@click.pass_context
def locks(ctx: click.Context, as_json: bool, limit: int) -> None:
    """Idempotency keys held in Redis now: holder, fencing token and lease left.

    Reads recovery_redis_url (default: the app's broker when it is Redis).

    \b
    Example:
      CELERY_RECOVERY_REDIS_URL=redis://redis:6379/0 celery-recovery inspect locks
    """
    import redis

    from celery_recovery.locks.inspect import held_locks

    settings = settings_of(ctx)
    if not settings.redis_url:
        raise CLIError(
            "no Redis to inspect: set recovery_redis_url (or CELERY_RECOVERY_REDIS_URL), "
            "or pass --app whose broker is Redis"
        )
    now = utcnow()
    try:
        rows = held_locks(settings.redis_url, now, limit)
    except (redis.RedisError, ValueError) as exc:
        raise CLIError(
            f"cannot read locks from {mask_url(settings.redis_url)}: {mask_secrets(str(exc))}"
        ) from None
    columns = [
        Column("KEY", "key"),
        Column("HOLDER", "holder"),
        Column("TOKEN", "token"),
        Column("LEASE LEFT", "ttl", seconds_text),
        Column("EXPIRES", "expires_at"),
    ]
    emit(rows, columns, as_json, "no idempotency locks held")


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
