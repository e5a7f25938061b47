"""Apps for the doctor's tests, and reading its reports."""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_recovery.doctor import Report, diagnose


def make_app(broker: str, backend: str | None, store_url: str | None = None, **conf: Any) -> Celery:
    """A Celery app (celery-recovery not installed: the doctor reads any app)."""
    app = Celery("doctor_test", broker=broker, backend=backend, set_as_current=False)
    if store_url is not None:
        app.conf.recovery_database_url = store_url
    app.conf.update(conf)
    return app


def ids(report: Report) -> list[str]:
    return sorted(finding.id for finding in report.findings)


def finding(report: Report, id: str) -> Any:
    found = [f for f in report.findings if f.id == id]
    assert len(found) == 1, (id, report.as_dict())
    return found[0]


def run(app: Celery) -> Report:
    return diagnose(app)
