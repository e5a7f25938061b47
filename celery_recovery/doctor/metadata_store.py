"""The metadata store: migrated, answering, and (SQLite) used by one host only."""

from __future__ import annotations

from celery_recovery.core.errors import StoreError, StoreSchemaError
from celery_recovery.core.states import JobType
from celery_recovery.core.timeutils import utcnow
from celery_recovery.core.urls import mask_secrets, mask_url
from celery_recovery.doctor.deployment import Deployment, sqlite_path
from celery_recovery.doctor.findings import Report, Severity
from celery_recovery.store import Store

NAME = "store"


def check(d: Deployment, report: Report) -> None:
    url = d.database_url
    if url is None:
        return  # the settings were refused: the thresholds check says why
    where = mask_url(url)
    store = d.store()
    if store is None:
        report.note(f"store {where}: no such SQLite file yet (no process has recorded anything)")
        return
    try:
        store.ensure_ready()
        live = _live_jobs(d, store)
    except StoreSchemaError as exc:
        report.found(
            "store-not-migrated",
            Severity.ERROR,
            where,
            f"{mask_secrets(str(exc))}. Every process logs a warning and runs its tasks "
            "unrecorded: no sweep can recover a task of a dead worker or a lost message.",
            "celery-recovery --app PROJ db upgrade (or: celery -A PROJ recovery db upgrade)",
        )
        return
    except StoreError as exc:
        report.cannot_tell(NAME, where, f"the store did not answer: {mask_secrets(str(exc))}")
        return
    hosts = sorted({job["hostname"] for job in live})
    report.note(
        f"store {where}: {len(live)} live jobs on {len(hosts)} host(s)"
        + (f" ({', '.join(hosts)})" if hosts else "")
    )
    try:
        _connections(store, where, len(live), report)
    except StoreError as exc:
        report.cannot_tell(NAME, where, f"could not read its connections: {mask_secrets(str(exc))}")
    if sqlite_path(url) is not None and len(hosts) > 1:
        report.found(
            "sqlite-several-hosts",
            Severity.ERROR,
            where,
            f"processes of {len(hosts)} hosts ({', '.join(hosts)}) write one SQLite file: "
            "its locking is not reliable over a network filesystem, so writes are lost or "
            "the file is corrupted, and each host waits for the others' write locks.",
            "app.conf.recovery_database_url = 'postgresql+psycopg://USER@HOST/DB', then "
            "celery-recovery --app PROJ db upgrade",
        )


def _live_jobs(d: Deployment, store: Store) -> list:
    values = d.values or {}
    now = utcnow()
    live = []
    for job_type, threshold in (
        (JobType.WORKER, values.get("zombie_threshold", 30.0)),
        (JobType.BEAT, values.get("health_check_threshold", 30.0)),
        (JobType.TRIGGERER, values.get("health_check_threshold", 30.0)),
    ):
        live.extend(store.jobs.live_jobs(now, threshold, job_type))
    return live


#: Store connections one live job may hold at once (docs/tuning.md's connection table):
#: its one pooled connection, and its worker's liveness marker, shared with its pool.
CONNECTIONS_PER_JOB = 2
#: Share of the server's connections past which the doctor warns.
CONNECTIONS_SHARE = 0.8


def _connections(store: Store, where: str, live_jobs: int, report: Report) -> None:
    """Say whether a pooler stands in front, and whether the fleet fits the server."""
    use = store.db.connection_use()
    if use is None:
        return
    open_now, allowed = use
    if store.db.behind_pooler:
        report.note(
            f"store {where}: reached through a transaction-mode pooler (PgBouncer or "
            "alike): timeouts are set per transaction, psycopg prepares no statement on "
            "the server, and processes hold no advisory-lock marker (a dead process is "
            "found by its process marker on its own host, else by its heartbeat)"
        )
    report.note(f"store {where}: {open_now} server connections open of {allowed} allowed")
    needed = live_jobs * CONNECTIONS_PER_JOB
    if store.db.behind_pooler or max(open_now, needed) < CONNECTIONS_SHARE * allowed:
        return
    report.found(
        "store-connections",
        Severity.WARNING,
        where,
        f"{live_jobs} live jobs may hold up to {needed} store connections "
        f"({CONNECTIONS_PER_JOB} each) and {open_now} are open now, against the "
        f"{allowed} the server allows: past it new processes cannot record anything, "
        "and neither can the sweeps (the user's tasks still run, unrecorded).",
        "put a transaction-mode pooler in front of the store (PgBouncer: docs/tuning.md "
        "gives a configuration), or raise max_connections",
    )
