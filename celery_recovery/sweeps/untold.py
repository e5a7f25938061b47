"""Tries whose outcome nothing can tell: the result backend's answer does not say whether
a dead worker's try had finished.

That is so with no result backend and with ``rpc://`` (neither answers another
process: :func:`celery_recovery.messages.result_backends.unaskable_because`), and for a
task that stores no result (``ignore_result``), whose finished run reads PENDING
(or the STARTED of its start).  The store is then the only witness: a try that
never started runs again as always; a running try of a dead worker runs again
(at least once), unless ``recovery_unknown_outcome`` (or the task attribute of
that name) says ``fail``.  Either way the decision's reason, and so its audit
row, says that the backend could not tell.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from celery import states

from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.log_once import LogOnce
from celery_recovery.core.setting_parsers import unknown_outcome
from celery_recovery.messages.backend_probe import UNASKABLE, Probe
from celery_recovery.messages.result_backends import unaskable_because
from celery_recovery.sweeps.context import SweepContext

logger = logging.getLogger("celery_recovery.sweep")

#: The task attribute that overrides ``recovery_unknown_outcome`` for one task.
ATTRIBUTE = "recovery_unknown_outcome"

_bad = LogOnce()


def untold_because(ctx: SweepContext, record: Mapping[str, Any], seen: Probe) -> str | None:
    """Why the backend's answer ``seen`` cannot tell whether ``record``'s try finished;
    None when it can (or when it told: a finished state is an answer)."""
    if seen.state == UNASKABLE:
        return f"the result backend cannot be asked ({unaskable_because(ctx.app.backend)})"
    if seen.state in (states.PENDING, states.STARTED) and _results_ignored(ctx, record):
        return "the task stores no result (ignore_result), so the result backend cannot tell"
    return None


def fails_when_untold(ctx: SweepContext, task_name: str) -> bool:
    """Whether a running try of ``task_name`` whose outcome nothing can tell is failed
    instead of run again (the task's attribute, else the app's setting)."""
    task = ctx.app.tasks.get(task_name)
    value = getattr(task, ATTRIBUTE, None) if task is not None else None
    if value is None:
        return ctx.settings.unknown_outcome == "fail"
    try:
        return unknown_outcome(f"{task_name}.{ATTRIBUTE}", value) == "fail"
    except ConfigurationError as exc:
        if _bad.first(task_name):
            logger.error("celery-recovery: %s; recovery_unknown_outcome applies", exc)
        return ctx.settings.unknown_outcome == "fail"


def _results_ignored(ctx: SweepContext, record: Mapping[str, Any]) -> bool:
    """Whether the try's result is not stored: ``apply_async(ignore_result=True)``, the
    task's ``ignore_result`` or the app's ``task_ignore_result``."""
    headers = record.get("headers")
    if isinstance(headers, Mapping) and headers.get("ignore_result") is not None:
        return bool(headers["ignore_result"])
    task = ctx.app.tasks.get(record.get("task_name") or "")
    if task is not None:
        return bool(task.ignore_result)
    return bool(ctx.app.conf.task_ignore_result)
