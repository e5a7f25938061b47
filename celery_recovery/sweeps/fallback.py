"""No single point of failure: workers run the sweep themselves when beat's stop.

Each worker process's heartbeat thread checks, once per sweep interval,
when a sweep last finished cleanly (no step failing).  If none has for
``3 x recovery_sweep_interval`` (beat down, no beat configured, or a sweeper
whose every pass fails a step: one started without its app's framework set up
cannot ask a Django result backend anything), the first process to take the
``sweep-fallback`` lease runs it; the lease's fencing token grows with each
new holder, so only one process at a time sweeps this way.  The sweep runs
in a thread of its own: a long pass (slow callbacks) must not hold up the
heartbeat that proves this process alive.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import TYPE_CHECKING

from celery_recovery.core.errors import StoreError
from celery_recovery.sweeps.marker_watch import start_marker_watch, stop_marker_watch
from celery_recovery.sweeps.runner import CLEAN_SWEEP, run_sweep

if TYPE_CHECKING:
    from celery_recovery.runtime.context import RecoveryContext

logger = logging.getLogger("celery_recovery.sweep")

LEASE = "sweep-fallback"
#: Sweep intervals without a finished sweep before workers take over.
MISSED_SWEEPS = 3


class SweepFallback:
    """Called from a worker's heartbeat thread on every beat."""

    def __init__(self, context: RecoveryContext, holder: str) -> None:
        self.context = context
        self.holder = holder
        self.started = time.monotonic()
        self._next_check = 0.0
        self._active = False
        self._own_completion: datetime | None = None
        self._sweeping: threading.Thread | None = None

    def __call__(self) -> None:
        interval = self.context.settings.sweep_interval
        if time.monotonic() < self._next_check:
            return
        self._next_check = time.monotonic() + interval
        try:
            self._check(interval)
        except StoreError as exc:
            logger.debug("celery-recovery: sweep fallback skipped: %s", exc)

    def _check(self, interval: float) -> None:
        store = self.context.store
        now = self.context.clock()
        allowed = MISSED_SWEEPS * interval
        last = store.checkins.last_completed(CLEAN_SWEEP)
        if self._active and last is not None and last != self._own_completion:
            # Someone else (beat back, or another fallback) finished a sweep.
            self._active = False
            stop_marker_watch(self.context)
        if not self._active:
            if last is not None and (now - last).total_seconds() < allowed:
                return
            if last is None and time.monotonic() - self.started < allowed:
                return
        # Renewed every interval: a holder that died is replaced once 3 intervals pass.
        token = store.leases.acquire_lease(LEASE, self.holder, now, ttl=allowed)
        if token is None:
            if self._active:
                stop_marker_watch(self.context)
            self._active = False
            return
        if not self._active:
            logger.warning(
                "celery-recovery: no sweep has finished cleanly for %ss (is beat running? "
                "does the sweeper's log show a step failing on every pass?); "
                "this worker sweeps every %ss until one does (fallback lease token %s)",
                allowed,
                interval,
                token,
            )
            self._active = True
        # Between its sweeps, this process also watches the markers (sweeps/marker_watch.py);
        # a sweep after a death is this fallback's own, not another sweeper's coming back.
        start_marker_watch(self.context, on_deaths=self._sweep)
        if self._sweeping is not None and self._sweeping.is_alive():
            return  # the previous pass is still running
        self._sweeping = threading.Thread(
            target=self._sweep, name="celery-recovery-fallback-sweep", daemon=True
        )
        self._sweeping.start()

    def _sweep(self) -> None:
        try:
            run_sweep(self.context)
            self._own_completion = self.context.store.checkins.last_completed(CLEAN_SWEEP)
        except Exception:
            logger.exception("celery-recovery: the fallback sweep failed; trying again later")
