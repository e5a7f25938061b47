"""What one sweep pass carries: the installation, the time, the report, error isolation."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import metrics
from ..audit import AuditAction, AuditReason, Decision
from ..errors import StoreError
from ..states import JobType

if TYPE_CHECKING:
    from ..recovery import Recovery

logger = logging.getLogger("celery_recovery.sweep")


@dataclass
class SweepReport:
    """Counts of what one sweep pass found and did; ``duration`` in seconds."""

    zombies: int = 0
    #: Queued tries found reserved (received, not started) by a dead worker.
    reserved: int = 0
    reserved_republished: int = 0
    republished: int = 0
    failed: int = 0
    adopted: int = 0
    reconciled: int = 0
    lost_messages: int = 0
    lost_republished: int = 0
    #: Overdue queued tries ended ``revoked`` (revoked, expired or purged) instead.
    revoked: int = 0
    dead_jobs: int = 0
    #: Of the dead jobs, those found by their liveness markers before the threshold.
    marker_deaths: int = 0
    callbacks_delivered: int = 0
    callbacks_failed: int = 0
    deferred_timeouts: int = 0
    unserved_triggers: int = 0
    races_lost: int = 0
    errors: int = 0
    #: Seconds left in which no process is judged dead (after a gap in sweeping).
    heartbeat_grace: float = 0.0
    duration: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SweepContext:
    recovery: Recovery
    now: datetime
    report: SweepReport
    holder: str

    def live_workers(self) -> dict[tuple[Any, Any], dict[str, Any]]:
        """Worker jobs beating within the zombie threshold, by (node name, pid): what the
        result backend's STARTED meta names."""
        store = self.recovery.store
        threshold = self.recovery.settings.zombie_threshold
        return {
            (job["node_name"], job["pid"]): job
            for job in store.live_jobs(self.now, threshold, JobType.WORKER)
        }

    def decision(
        self,
        action: AuditAction,
        reason: AuditReason,
        record: dict[str, Any],
        detail: str | None = None,
    ) -> Decision:
        """The audit row of a decision this pass takes about the try ``record``."""
        return Decision.of(self.now, action, reason, record, detail, actor=self.holder)

    @contextmanager
    def isolated(self, what: str) -> Iterator[None]:
        """Run one item; any error is logged and counted, never raised out of the sweep."""
        try:
            yield
        except Exception as exc:
            self.report.errors += 1
            if isinstance(exc, StoreError):
                metrics.store_error(exc)
            logger.exception("celery-recovery: sweep failed on %s; continuing", what)
