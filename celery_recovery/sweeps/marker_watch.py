"""The marker watch: a dead process found within about a second, whatever the sweep interval.

The sweep looks at liveness markers once per pass and, since it cannot tell a
dead holder from one reconnecting, also waits for a late heartbeat.  The
watch runs beside whoever sweeps (``sweep --loop``, a beat process that
schedules the sweep, a worker's fallback while it sweeps, every triggerer)
and looks twice a second:

- at the process markers it can check (jobs on this host, in this pid
  namespace): a process that is gone died, so its job is failed at once;
- at the advisory locks held in ``pg_locks`` (one statement for every job):
  a lock seen held and then missing for a second, on the same server, is a
  holder that died (:mod:`celery_recovery.liveness.absences`).

A paused, swapping or busy process keeps both markers and is left to the
zombie threshold, as is a job whose marker the watch never saw.  Each death is
a compare-and-set on the heartbeat the watch read, so a process that beat in
between is left alone; a pool process's death under a live main process is
still its parent's to record (:mod:`.parents`).  After a death the watch runs
a sweep at once, whose steps recover the dead job's tries as they always do.
Two watches at once (a beat and its standby) fail each job once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery_recovery.liveness import Verdict
from celery_recovery.liveness.absences import LockAbsences
from celery_recovery.liveness.job import uses_lock_marker
from celery_recovery.liveness.process import check_process, process_view
from celery_recovery.sweeps.jobs import report_dead_job
from celery_recovery.sweeps.liveness import LOCK_GONE, PROCESS_GONE
from celery_recovery.sweeps.parents import awaits_parent, parents_by_process
from celery_recovery.telemetry import metrics

if TYPE_CHECKING:
    from celery_recovery.runtime.context import RecoveryContext

logger = logging.getLogger("celery_recovery.sweep")

#: Seconds between two looks.
WATCH_INTERVAL = 0.5
#: Seconds a seen lock must stay missing: a live holder takes it again within
#: RECONNECT_DELAY (0.25 s) of the store answering, a dead one never does.
LOCK_CONFIRM = 1.0
#: Seconds between two readings of the store's clock (it drifts slowly).
CLOCK_EVERY = 30.0


class MarkerWatch:
    """Looks at the markers every :data:`WATCH_INTERVAL`; ``on_deaths`` runs after a look
    that failed a job (by default a sweep, in the watch's thread)."""

    def __init__(
        self,
        context: RecoveryContext,
        on_deaths: Callable[[], Any] | None = None,
        interval: float = WATCH_INTERVAL,
    ) -> None:
        self.context = context
        self.on_deaths = on_deaths or self._sweep
        self.interval = interval
        self.locks = LockAbsences(confirm=max(LOCK_CONFIRM, 2 * interval))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._clock_read = float("-inf")
        self.pid = os.getpid()

    def start(self) -> MarkerWatch:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="celery-recovery-marker-watch", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                failed = self.look()
            except Exception as exc:  # the store is away: the next look starts afresh
                self.locks.forget()
                logger.debug("celery-recovery: marker watch skipped a look: %s", exc)
                continue
            if failed:
                try:
                    self.on_deaths()
                except Exception:
                    logger.exception("celery-recovery: the sweep after a marker death failed")

    def look(self, at: float | None = None) -> int:
        """One look at every marker this process can check; the number of jobs failed."""
        context = self.context
        if context.settings.liveness_markers == "off":
            return 0
        at = time.monotonic() if at is None else at
        if at - self._clock_read >= CLOCK_EVERY:
            context.store.follow_clock()
            self._clock_read = at
        return self._look_at_processes() + self._look_at_locks(at)

    def _look_at_processes(self) -> int:
        view = process_view()
        if view is None:
            return 0
        local = self.context.store.liveness.jobs_in_view(view)
        if not local:
            return 0
        dead = [
            job for job in local if check_process(job["process_marker"], job["pid"]) == Verdict.GONE
        ]
        if not dead:
            return 0
        now = self.context.clock()
        settings = self.context.settings
        parents = parents_by_process(local)
        judged = [
            job
            for job in dead
            if not awaits_parent(
                job["hostname"],
                job["parent_pid"],
                job["latest_heartbeat"],
                parents,
                now,
                settings,
                settings.heartbeat_interval,
            )
        ]
        return self._fail(judged, "process", PROCESS_GONE, now)

    def _look_at_locks(self, at: float) -> int:
        store = self.context.store
        if store.dialect != "postgresql" or not uses_lock_marker(self.context.settings):
            return 0
        store_now, server, held = store.liveness.lock_view()
        gone = self.locks.look(server, held, at, store_now)
        if not gone:
            return 0
        since = {v.key: v.missing_since for v in gone}
        holders = store.liveness.jobs_holding(since)
        # A process that beat after its lock vanished is alive and taking it back.
        silent = [j for j in holders if j["latest_heartbeat"] <= since[j["marker_lock"]]]
        return self._fail(silent, "lock", LOCK_GONE, self.context.clock())

    def _fail(self, dead: Iterable[dict[str, Any]], marker: str, how: str, now: datetime) -> int:
        store = self.context.store
        failed = 0
        for job in dead:
            if store.liveness.fail_job_if_silent(job["id"], job["latest_heartbeat"], now):
                failed += 1
                metrics.marker_death("watch", marker)
                report_dead_job(job, f"{how} (marker watch)", now)
        return failed

    def _sweep(self) -> None:
        from celery_recovery.sweeps.runner import run_sweep

        run_sweep(self.context)


#: This process's watches, one per installation (by its context's id).
_watches: dict[int, MarkerWatch] = {}
_watch_lock = threading.Lock()


def start_marker_watch(
    context: RecoveryContext, on_deaths: Callable[[], Any] | None = None
) -> MarkerWatch | None:
    """Start ``context``'s watch in this process (one per installation, the first caller's
    ``on_deaths``); None when markers are off."""
    if context.settings.liveness_markers == "off":
        return None
    with _watch_lock:
        watch = _watches.get(id(context))
        if watch is None or watch.pid != os.getpid() or watch.context is not context:
            watch = _watches[id(context)] = MarkerWatch(context, on_deaths)
        return watch.start()


def stop_marker_watch(context: RecoveryContext) -> None:
    """Stop ``context``'s watch in this process, if one runs (a look under way ends first)."""
    with _watch_lock:
        watch = _watches.get(id(context))
        if watch is None or watch.context is not context or watch.pid != os.getpid():
            return
        del _watches[id(context)]
    watch.stop()
