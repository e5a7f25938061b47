"""The per-process heartbeat thread that keeps a job's ``latest_heartbeat`` fresh.

One daemon thread per participating process (not per task) inserts the job
row, then refreshes it every ``recovery_heartbeat_interval`` seconds.  While
the store is failing it keeps trying every interval (reporting through the
process's :class:`StoreHealth`), so that it is seen alive as soon as the store
answers again; the user's tasks never wait for it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from celery_recovery.core.errors import StoreError
from celery_recovery.core.states import JobState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.runtime.health import StoreHealth
from celery_recovery.store import Store

logger = logging.getLogger("celery_recovery.heartbeat")


class HeartbeatThread(threading.Thread):
    """Registers one job and beats for it until stopped."""

    def __init__(
        self,
        store: Store,
        health: StoreHealth,
        job: dict[str, Any],
        interval: float,
        on_beat: Callable[[], None] | None = None,
        consumer: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(name=f"celery-recovery-heartbeat-{job['job_type']}", daemon=True)
        self.store = store
        self.health = health
        self.job = job
        self.interval = interval
        self.on_beat = on_beat
        #: A worker main process's consumer state, written with each beat.
        self.consumer = consumer
        self._stop_event = threading.Event()
        self._registered = False
        self._first_beat = threading.Event()

    @property
    def job_id(self) -> str:
        return str(self.job["id"])

    @property
    def registered(self) -> bool:
        """True once the job row was written (a triggerer claims work only then)."""
        return self._registered

    def wait_registered(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the first beat; True if the job row is written."""
        self._first_beat.wait(timeout)
        return self._registered

    def run(self) -> None:
        while True:
            # Beat even while the store is backing off: one tiny write per interval is
            # the normal load, and after an outage every live process must be seen
            # alive again within an interval, before a sweep judges it.
            self._beat()
            self._first_beat.set()
            if self.on_beat is not None:
                try:
                    self.on_beat()
                except Exception:
                    logger.exception("celery-recovery: heartbeat hook failed; beating on")
            if self._stop_event.wait(self.interval):
                return

    def stop(self, state: JobState = JobState.SUCCESS, timeout: float = 5.0) -> None:
        """Stop beating and record how the job ended (best effort)."""
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
        if not self._registered:
            return
        try:
            self.store.jobs.end_job(self.job_id, state, utcnow())
        except StoreError as exc:
            logger.info("celery-recovery: could not record the end of job %s: %s", self.job_id, exc)

    def _consumer_state(self) -> dict[str, Any] | None:
        if self.consumer is None:
            return None
        try:
            return self.consumer()
        except Exception:
            logger.exception("celery-recovery: reading the consumer's state failed; beating on")
            return None

    def _beat(self) -> None:
        # The store's clock, read again on every beat: heartbeats are written and judged
        # on one clock, whatever this host's says.  (A store that fails here fails the
        # beat below too, which says so.)
        with contextlib.suppress(StoreError):
            self.store.follow_clock()
        now = utcnow()
        consumer = self._consumer_state()
        try:
            if not self._registered:
                job = {**self.job, "start_date": now, "latest_heartbeat": now}
                if consumer is not None:
                    job["consumer"] = consumer
                self.store.jobs.add_job(job)
                self._registered = True
            elif not self.store.jobs.heartbeat(self.job_id, now, consumer):
                self._on_missing_row(now)
        except StoreError as exc:
            self.health.record_failure(exc, f"heartbeating job {self.job_id}")
            return
        self.health.record_success()

    def _on_missing_row(self, now: Any) -> None:
        job = self.store.jobs.get_job(self.job_id)
        if job is None:
            # Deleted by retention or lost with a restored database: register again.
            self.store.jobs.add_job({**self.job, "latest_heartbeat": now})
            return
        # A sweep declared this process dead (it was paused past the threshold) and
        # has recovered its tries.  Carry on under a new job, so that new tries are
        # not taken for the dead job's.
        old = self.job_id
        self.job = {**self.job, "id": uuid.uuid4().hex, "start_date": now, "latest_heartbeat": now}
        self.store.jobs.add_job(self.job)
        logger.warning(
            "celery-recovery: job %s (pid %s) was marked %s while this process was alive "
            "(its heartbeat was late past the threshold); continuing as job %s",
            old,
            self.job["pid"],
            job["state"],
            self.job_id,
        )
