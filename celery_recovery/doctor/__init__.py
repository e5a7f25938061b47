"""``celery-recovery doctor``: names each setting of a deployment that loses or
duplicates tasks silently, with its fix (docs/doctor.md).

It reads the app's configuration, its broker, result backend and Redis servers, and
the metadata store.  :func:`diagnose` returns a :class:`Report`; the CLI prints it,
and a worker logs it once at start (:mod:`.at_start`).
"""

from celery_recovery.doctor.findings import ExitStatus, Finding, Report, Severity, Unknown
from celery_recovery.doctor.registry import CHECKS, diagnose

__all__ = ["CHECKS", "ExitStatus", "Finding", "Report", "Severity", "Unknown", "diagnose"]
