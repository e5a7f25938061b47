"""The result backend: the sweeps ask it what became of a task whose worker died
before it could say (adoption, reconciliation); without one they cannot tell a
finished task from a lost one."""

from __future__ import annotations

from celery_recovery.core.urls import mask_url
from celery_recovery.doctor.deployment import Deployment
from celery_recovery.doctor.findings import Report, Severity

NAME = "result backend"

#: Backends a sweep in another process cannot read a task's state from.
UNREADABLE = {
    "disabled": "no result backend is configured",
    "rpc": "the rpc:// backend sends each result to the process that sent the task only",
}
#: Names of tasks listed in a finding before "and N more".
SHOWN_TASKS = 5


def check(d: Deployment, report: Report) -> None:
    url = d.backend_url
    scheme = (url or "disabled").partition("://")[0].lower()
    report.note(f"result_backend: {mask_url(url) if url else 'none'}")
    if scheme in UNREADABLE:
        report.found(
            "no-result-backend",
            Severity.ERROR,
            "result_backend",
            f"{UNREADABLE[scheme]}: a sweep cannot ask what became of a task whose worker "
            "died, so a task that had finished is run again, and a task another worker "
            "still runs is not adopted but run a second time.",
            "app.conf.result_backend = 'redis://HOST:6379/1' (or any backend other "
            "processes can read: 'db+postgresql://...'); with Redis, give it its own "
            "database number",
        )
        return
    ignoring = [task.name for task in d.tasks if task.ignore_result]
    if d.app.conf.task_ignore_result or ignoring:
        names = ", ".join(ignoring[:SHOWN_TASKS]) + (
            f" and {len(ignoring) - SHOWN_TASKS} more" if len(ignoring) > SHOWN_TASKS else ""
        )
        report.found(
            "results-ignored",
            Severity.WARNING,
            "task_ignore_result" if d.app.conf.task_ignore_result else f"tasks {names}",
            "these tasks store no result: when a worker dies just after one finished, before "
            "its outcome reached the store, the backend reads PENDING and the sweep runs the "
            "finished task again.",
            "app.conf.task_ignore_result = False (or ignore_result=False on the task); set "
            "result_expires to bound what is kept",
        )
