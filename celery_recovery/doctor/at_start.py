"""A worker runs the doctor once when it is ready and logs each finding.

In a daemon thread of the worker's main process: the checks talk to servers (a
few seconds at most each when one does not answer), and must neither delay the
worker nor, if they fail, break it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery_recovery.core.settings import RecoverySettings
from celery_recovery.doctor.findings import Report
from celery_recovery.doctor.registry import diagnose
from celery_recovery.store import Store

logger = logging.getLogger("celery_recovery.doctor")

_started: set[int] = set()
_lock = threading.Lock()


def start(app: Any, settings: RecoverySettings, store: Store) -> threading.Thread | None:
    """Run the doctor in a thread and log what it finds; once per app and process."""
    with _lock:
        if id(app) in _started:
            return None
        _started.add(id(app))
    thread = threading.Thread(
        target=_run, args=(app, settings, store), name="celery-recovery-doctor", daemon=True
    )
    thread.start()
    return thread


def _run(app: Any, settings: RecoverySettings, store: Store) -> None:
    try:
        log(diagnose(app, settings=settings, store=store))
    except Exception:
        logger.warning("celery-recovery doctor could not run", exc_info=True)


def log(report: Report) -> None:
    """One warning per finding (id, subject, problem, fix); one info line per question
    that could not be answered, and a summary."""
    for finding in report.findings:
        logger.warning(
            "doctor finding %s (%s) in %s: %s Fix: %s",
            finding.id,
            finding.severity.value,
            finding.subject,
            finding.problem,
            finding.fix,
        )
    for unknown in report.unknowns:
        logger.info(
            "doctor cannot tell (%s) %s: %s", unknown.check, unknown.subject, unknown.reason
        )
    logger.info(
        "doctor: %d finding(s), %d question(s) it cannot tell; "
        "`celery-recovery doctor` shows what it read (docs/doctor.md)",
        len(report.findings),
        len(report.unknowns),
    )
