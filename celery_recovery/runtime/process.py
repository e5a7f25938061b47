"""What one process holds for one installed app: store health, writer, job.

A forked child must not share its parent's threads, buffers or connections,
so :meth:`celery_recovery.Recovery.runtime` builds a new :class:`ProcessRuntime`
whenever the process id changes.
"""

from __future__ import annotations

import atexit
import logging
import os
import uuid
from collections.abc import Callable
from typing import Any

from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.process_id import HOSTNAME, current_pid
from celery_recovery.core.records import WriteKind
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.core.states import JobState, JobType
from celery_recovery.core.timeutils import utcnow
from celery_recovery.liveness.job import job_markers
from celery_recovery.liveness.postgres import stop_holder
from celery_recovery.locks import IdempotencyLocks, LeaseRenewer
from celery_recovery.runtime.health import StoreHealth
from celery_recovery.runtime.job_heartbeat import HeartbeatThread
from celery_recovery.runtime.write_behind import WriteBehindWriter
from celery_recovery.store import Store

logger = logging.getLogger("celery_recovery.runtime")

#: Seconds a starting process waits for its job row before it takes work.
REGISTRATION_WAIT = 1.0


class ProcessRuntime:
    """Per-process state of an installed :class:`~celery_recovery.Recovery`."""

    def __init__(self, store: Store, settings: RecoverySettings) -> None:
        self.pid = current_pid()
        self.store = store
        self.settings = settings
        self.health = StoreHealth(settings.masked_database_url)
        self.writer = WriteBehindWriter(store.tries, health=self.health)
        self.heartbeat: HeartbeatThread | None = None
        self._locks: tuple[IdempotencyLocks, LeaseRenewer] | None = None
        atexit.register(self.close)

    def locks(self) -> tuple[IdempotencyLocks, LeaseRenewer]:
        """This process's Redis idempotency locks and lease renewer (created on first use)."""
        if self._locks is None:
            url = self.settings.redis_url
            if not url:
                raise ConfigurationError(
                    "@recoverable needs Redis: set recovery_redis_url (the broker is not Redis, "
                    "so there is no default)"
                )
            locks = IdempotencyLocks.from_url(url)
            self._locks = (locks, LeaseRenewer(locks))
        return self._locks

    @property
    def job_id(self) -> str | None:
        """The id of this process's job, when it is a worker process, beat or triggerer."""
        return self.heartbeat.job_id if self.heartbeat is not None else None

    def write(self, kind: WriteKind, item: Any) -> None:
        """Queue a write for the flusher thread; never blocks on the store."""
        self.writer.submit(kind, item)

    def record_start(self, record: dict[str, Any]) -> None:
        """Queue the ``running`` claim of a try (handed over: the writer folds the
        outcome into it); it is committed within the writer's claim interval (20 ms)
        while the task body runs on, or with its outcome when the task ends first."""
        self.writer.submit(WriteKind.RUNNING, record)

    def start_job(
        self,
        job_type: JobType,
        node_name: str | None = None,
        on_beat: Callable[[], None] | None = None,
        queues: str | None = None,
        parent_pid: int | None = None,
        consumer: Callable[[], dict[str, Any]] | None = None,
    ) -> str:
        """Make this process a job (once) and start its heartbeat thread; returns the job id.

        ``consumer`` (a worker's main process) gives the consumer state each beat writes.
        """
        if self.heartbeat is not None:
            return self.heartbeat.job_id
        now = utcnow()
        job = {
            "id": uuid.uuid4().hex,
            "job_type": job_type,
            "hostname": HOSTNAME,
            "node_name": node_name,
            "pid": os.getpid(),
            "parent_pid": parent_pid,
            "state": JobState.RUNNING,
            "start_date": now,
            "latest_heartbeat": now,
            "queues": queues,
            **job_markers(self.settings, f"{job_type} {HOSTNAME}:{os.getpid()}"),
        }
        self.heartbeat = HeartbeatThread(
            self.store,
            self.health,
            job,
            self.settings.heartbeat_interval,
            on_beat=on_beat,
            consumer=consumer,
        )
        self.heartbeat.start()
        # A process that takes work before its job row lands (a slow or contended store
        # at start) leaves tries no sweep can judge until MISSING_JOB_GRACE passes, should
        # it die at once.  Wait a little for it; never long: a pool process must report
        # ready to its pool within seconds, and the store may be down.
        if not self.heartbeat.wait_registered(REGISTRATION_WAIT):
            logger.info(
                "celery-recovery: %s job %s not registered within %.1fs; carrying on",
                job_type,
                job["id"],
                REGISTRATION_WAIT,
            )
        logger.info("celery-recovery: %s job %s started (pid %s)", job_type, job["id"], job["pid"])
        return str(job["id"])

    def stop_job(self, state: JobState = JobState.SUCCESS) -> None:
        """Flush pending writes, stop the heartbeat and record how the job ended."""
        self.writer.flush()
        heartbeat, self.heartbeat = self.heartbeat, None
        if heartbeat is not None:
            heartbeat.stop(state)

    def close(self) -> None:
        """At interpreter exit: flush what is buffered and end the job cleanly."""
        if current_pid() != self.pid:
            return
        self.stop_job(JobState.SUCCESS)
        self.writer.close()
        stop_holder()
