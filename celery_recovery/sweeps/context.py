"""What one sweep pass carries: the installation, the time, the report, error isolation."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery_recovery.core.audit import AuditAction, AuditReason, Decision
from celery_recovery.core.errors import StoreError
from celery_recovery.core.records import JobRow, SweepReport
from celery_recovery.core.states import JobType
from celery_recovery.core.urls import mask_secrets
from celery_recovery.telemetry import metrics

if TYPE_CHECKING:
    from celery import Celery

    from celery_recovery.core.settings import RecoverySettings
    from celery_recovery.runtime.context import RecoveryContext
    from celery_recovery.store import Store

logger = logging.getLogger("celery_recovery.sweep")


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, for a report and a console cell."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@dataclass
class SweepContext:
    context: RecoveryContext
    now: datetime
    report: SweepReport
    holder: str
    #: What a step leaves for the later steps of the same pass (the workers' answers
    #: over the broker, :mod:`celery_recovery.sweeps.second_opinion`).
    extras: dict[str, Any] = field(default_factory=dict)
    #: The step running now (its failures are reported under its name).
    step: str | None = None

    @property
    def store(self) -> Store:
        return self.context.store

    @property
    def settings(self) -> RecoverySettings:
        return self.context.settings

    @property
    def app(self) -> Celery:
        return self.context.app

    def live_workers(self) -> dict[tuple[Any, Any], JobRow]:
        """Worker jobs beating within the zombie threshold, by (node name, pid): what the
        result backend's STARTED meta names."""
        store = self.store
        threshold = self.settings.zombie_threshold
        return {
            (job["node_name"], job["pid"]): job
            for job in store.jobs.live_jobs(self.now, threshold, JobType.WORKER)
        }

    def decision(
        self,
        action: AuditAction,
        reason: AuditReason,
        record: Mapping[str, Any],
        detail: str | None = None,
    ) -> Decision:
        """The audit row of a decision this pass takes about the try ``record``."""
        return Decision.of(self.now, action, reason, record, detail, actor=self.holder)

    def failed(self, error: str, what: str | None = None) -> None:
        """Count a failed item in the report, under the step running now."""
        self.report.errors += 1
        step = self.step or what or "the sweep"
        if step not in self.report.failing_steps:
            self.report.failing_steps.append(step)
        if self.report.first_error is None:
            # Kept in the store and shown by the console: no password of a URL in it.
            self.report.first_error = mask_secrets(error)

    @contextmanager
    def isolated(self, what: str) -> Iterator[None]:
        """Run one item; any error is logged and counted, never raised out of the sweep."""
        try:
            yield
        except Exception as exc:
            self.failed(one_line(exc), what)
            if isinstance(exc, StoreError):
                metrics.store_error(exc)
            logger.exception("celery-recovery: sweep failed on %s; continuing", what)
