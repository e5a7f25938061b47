"""The result backend: the sweeps ask it what became of a task whose worker died
before it could say (adoption, reconciliation); without one they cannot tell a
finished task from a lost one."""

from __future__ import annotations

from celery_recovery.core.urls import mask_url
from celery_recovery.doctor.deployment import Deployment
from celery_recovery.doctor.findings import Report, Severity

NAME = "result backend"

#: Names of tasks listed in a finding before "and N more".
SHOWN_TASKS = 5
#: How each finished task that must not run twice can say so, whatever the backend.
_ONCE = (
    "; for a task that must never run twice, recovery_unknown_outcome = 'fail' (or the "
    "task attribute of that name), or @recoverable"
)


def check(d: Deployment, report: Report) -> None:
    url = d.backend_url
    scheme = (url or "disabled").partition("://")[0].lower()
    report.note(f"result_backend: {mask_url(url) if url else 'none'}")
    if scheme == "disabled":
        report.found(
            "no-result-backend",
            Severity.WARNING,
            "result_backend",
            "no result backend is configured, so a sweep cannot ask what became of a task "
            "whose worker died. Recovery goes on from the store alone: a task that never "
            "started is published again as always, but a running task of a dead worker is "
            "run again even when it had finished just before the death (its outcome not yet "
            "in the store), and a task another worker still runs is not adopted. Callers "
            "have no result to wait for.",
            "app.conf.result_backend = 'redis://HOST:6379/1' (or any backend other processes "
            f"can read: 'db+postgresql://...'){_ONCE}",
        )
        return
    if scheme == "rpc":
        report.found(
            "rpc-result-backend",
            Severity.WARNING,
            "result_backend",
            "rpc:// sends each result only to the process that sent the task, so a sweep "
            "cannot ask what became of a task whose worker died: a running task of a dead "
            "worker is run again even when it had finished just before the death (its "
            "outcome not yet in the store), and a task another worker still runs is not "
            "adopted. Results still reach their caller after a recovery (a try published "
            "again keeps the caller's reply queue), while the caller's process lives.",
            "app.conf.result_backend = 'redis://HOST:6379/1' (or 'db+postgresql://...') where "
            f"a second run costs more than a shared backend{_ONCE}",
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
