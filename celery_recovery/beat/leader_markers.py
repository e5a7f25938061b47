"""Whether the beat holding the lead is dead, from its liveness markers.

The lease's holder name carries the leader's process id and host
(:func:`.leadership.holder_name`); its beat job there recorded its markers.  The
leader is dead when that job has ended, when its process is gone (checked from
the same host and pid namespace), or when its advisory lock was missing at two
looks in a row (a live holder whose connection was cut takes it again within
a fraction of a second).  Anything else (no job yet, a marker that cannot be
checked from here) leaves the lease to run out as before.
"""

from __future__ import annotations

from typing import Any

from celery_recovery.core.settings import RecoverySettings
from celery_recovery.core.states import JobState, JobType
from celery_recovery.liveness import Verdict
from celery_recovery.liveness.job import uses_lock_marker
from celery_recovery.liveness.process import check_process
from celery_recovery.store import Store


def holder_process(holder: str) -> tuple[str, int] | None:
    """(host, pid) from a holder name ``<id>:<pid>@<host>``; None for another form."""
    _, _, rest = holder.partition(":")
    pid, at, host = rest.partition("@")
    if not at or not pid.isdigit() or not host:
        return None
    return host, int(pid)


class LeaderMarkers:
    """A standby's looks at the leader's markers, one per attempt to take the lead."""

    def __init__(self, store: Store, settings: RecoverySettings) -> None:
        self.store = store
        self.settings = settings
        #: (holder, key) of the lock found missing at the previous look.
        self._missing: tuple[str, int] | None = None

    def dead_holder(self, lease: dict[str, Any] | None) -> tuple[str, int] | None:
        """(holder, token) of a lease whose holder is dead; None when alive or unknown."""
        holder = lease.get("holder") if lease else None
        process = holder_process(holder) if holder else None
        if lease is None or holder is None or process is None:
            self._missing = None
            return None
        job = self.store.liveness.process_job(JobType.BEAT.value, *process)
        if job is None:
            return None
        if job["state"] != JobState.RUNNING:
            return holder, int(lease["token"])
        if check_process(job["process_marker"], job["pid"]) == Verdict.GONE:
            return holder, int(lease["token"])
        key = job["marker_lock"]
        if key is None or not uses_lock_marker(self.settings):
            return None
        if self.store.liveness.lock_held(int(key)):
            self._missing = None
            return None
        if self._missing == (holder, key):
            self._missing = None
            return holder, int(lease["token"])
        self._missing = (holder, key)
        return None
