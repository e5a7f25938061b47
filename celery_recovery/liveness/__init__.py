"""Liveness markers: tell a process that died from one that is only slow.

A heartbeat cannot tell them apart: both stop beating.  But when a process
dies the kernel closes its sockets and frees its process id at once, while a
paused or busy process keeps both.  So each job records markers bound to its
life, which a sweep can check without waiting for the zombie threshold:

- :mod:`.process`: the process's id with its start time, checked on the same
  host (and the same process-id namespace) through ``/proc``;
- :mod:`.postgres`: a session-level advisory lock on a connection of its own,
  held by the worker's main process for all its pool processes, visible to a
  sweep in ``pg_locks``.

A job whose marker is gone and whose heartbeat is late is dead now; a job
whose marker is present, or unknown, is judged by the threshold as before.
"""

from celery_recovery.liveness.verdict import Verdict

__all__ = ["Verdict"]
