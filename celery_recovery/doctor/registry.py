"""The checks, in the order they run, and :func:`diagnose`, which runs them.

Each check family is a module with a ``NAME`` and a ``check(deployment, report)``.
A check that fails is reported as "cannot tell", never as an exception: the doctor
runs inside workers too."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery_recovery.core.settings import RecoverySettings
from celery_recovery.core.urls import mask_secrets
from celery_recovery.doctor import (
    backend,
    metadata_store,
    rabbitmq,
    redis_servers,
    thresholds,
    transports,
    visibility,
)
from celery_recovery.doctor.deployment import Deployment
from celery_recovery.doctor.findings import Report
from celery_recovery.store import Store

logger = logging.getLogger("celery_recovery.doctor")

Check = Callable[[Deployment, Report], None]

#: (family name, check), in the order they run and report.
CHECKS: tuple[tuple[str, Check], ...] = tuple(
    (module.NAME, module.check)
    for module in (
        thresholds,
        metadata_store,
        backend,
        transports,
        redis_servers,
        visibility,
        rabbitmq,
    )
)


def diagnose(
    app: Any,
    settings: RecoverySettings | None = None,
    store: Store | None = None,
    **overrides: Any,
) -> Report:
    """Read ``app``'s configuration, broker, result backend and store; return what loses
    or duplicates tasks silently, what could not be told, and what was read.

    ``settings`` and ``store``: those of an installed ``Recovery`` (a worker); without
    them they are read from the app (with ``overrides``, as ``Recovery(app, **overrides)``
    would) and the store is opened and closed here.  Never raises for what it reads.
    """
    deployment = Deployment(app, settings=settings, store=store, overrides=overrides)
    report = Report()
    try:
        for name, check in CHECKS:
            try:
                check(deployment, report)
            except Exception as exc:
                logger.debug("doctor check %s failed", name, exc_info=True)
                report.cannot_tell(name, "check", f"the check failed: {mask_secrets(repr(exc))}")
    finally:
        deployment.close()
    return report
