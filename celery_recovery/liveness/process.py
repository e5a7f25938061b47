"""The process marker: process id, start time and the process-id namespace it lives in.

A process id alone is reused by the kernel; with its start time (in clock
ticks since boot, field 22 of ``/proc/<pid>/stat``) it names one process for
the life of the machine.  The boot id and the pid namespace are part of the
marker because a sweep in another container can share the host name (host
networking) without seeing the same process ids: there the marker is
``UNKNOWN``, never ``GONE``.  Linux only; elsewhere no marker is recorded.
"""

from __future__ import annotations

import os
from functools import cache

from celery_recovery.liveness.verdict import Verdict


@cache
def _view() -> str | None:
    """Boot id and pid namespace of this process: where its process ids mean something."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{namespace}"


def process_view() -> str | None:
    """Where this process's ids mean something (boot id and pid namespace): the prefix of
    the process markers it can check; None where it can check none."""
    return _view()


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if fields[0] == b"Z":
        return None  # a zombie process has died; only its exit status is left
    return int(fields[19])


def process_marker(pid: int | None = None) -> str | None:
    """The marker of process ``pid`` (this process by default), or None where there is none."""
    view = _view()
    if view is None:
        return None
    ticks = _start_ticks(os.getpid() if pid is None else pid)
    return None if ticks is None else f"{view}/{ticks}"


def check_process(marker: str | None, pid: int) -> Verdict:
    """Whether the process that recorded ``marker`` as ``pid`` still lives, seen from here."""
    view = _view()
    if not marker or view is None or marker.rpartition("/")[0] != view:
        return Verdict.UNKNOWN
    try:
        ticks = _start_ticks(pid)
    except (OSError, ValueError, IndexError):
        return Verdict.UNKNOWN
    if ticks is None:
        return Verdict.GONE
    return Verdict.PRESENT if f"{view}/{ticks}" == marker else Verdict.GONE
