"""A death has one judge: a pool process that dies under a live main process is its parent's.

When a prefork pool process dies, the worker's main process sees it within
about a second and records Celery's verdict (:mod:`celery_recovery.deliveries.worker_lost`
for ``WorkerLostError``, :mod:`celery_recovery.deliveries.time_limits` for a hard time
limit), with the callbacks Celery runs on that version.  A sweep that judged
the same death from the process marker or the heartbeat would reset the try
as well: its body would run again and both ``on_retry`` and ``on_failure``
would fire.  So while the parent lives and beats, a sweep leaves the dead pool
process's tries alone for :data:`PARENT_VERDICT_GRACE` seconds beyond its usual
bound.  If they are still running after that (the parent could not write), or
the parent is gone, or silent past the zombie threshold (dead itself, or paused
or cut off), the sweep acts as for any dead process.  A parent whose heartbeat
is merely late (a loaded host: seen in CI, two intervals late while it was
about to record the death) is waited for: the grace bounds the wait anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from celery_recovery.core.settings import RecoverySettings
from celery_recovery.liveness import Verdict
from celery_recovery.liveness.process import check_process

#: Seconds a live parent is given, beyond a step's usual bound, to record the death of its
#: pool process: Celery notices within about a second, and the main process's writer
#: commits within a fifth of one.
PARENT_VERDICT_GRACE = 3.0

ParentsByProcess = Mapping[tuple[Any, Any], Mapping[str, Any]]


def parents_by_process(jobs: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, Any], Any]:
    """Running jobs by (host name, process id): where a pool process's parent is found."""
    return {(job["hostname"], job["pid"]): job for job in jobs}


def awaits_parent(
    hostname: Any,
    parent_pid: int | None,
    heartbeat: datetime | None,
    parents: ParentsByProcess,
    now: datetime,
    settings: RecoverySettings,
    bound: float,
) -> bool:
    """Whether the death of a pool process (its host, parent's pid and last heartbeat) is
    still its parent's to record, ``bound`` seconds being the sweep step's own."""
    if parent_pid is None or heartbeat is None:
        return False
    parent = parents.get((hostname, parent_pid))
    if parent is None or not _beating(parent, now, settings):
        return False
    if heartbeat < now - timedelta(seconds=bound + PARENT_VERDICT_GRACE):
        return False  # the grace is over: the parent could not record it
    return check_process(parent.get("process_marker"), parent["pid"]) != Verdict.GONE


def _beating(parent: Mapping[str, Any], now: datetime, settings: RecoverySettings) -> bool:
    """Not silent past the zombie threshold: a parent judged dead, paused or cut off records
    nothing, so it is not waited for; one whose heartbeat is only late still may."""
    silent_before = now - timedelta(seconds=settings.zombie_threshold)
    return bool(parent["latest_heartbeat"] >= silent_before)
