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
