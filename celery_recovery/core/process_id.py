"""This process's id, read once and again after each fork, and its host's name.

``os.getpid()`` is a system call: the per-task handlers ask for it several
times (which process owns the runtime, which pid ran the try), and on the
hot path those calls cost more than the rest of the lookup.  Python runs
``register_at_fork`` hooks in every child that ``os.fork`` makes (billiard's
prefork pool included), so the cached id is never a parent's.
"""

from __future__ import annotations

import os
import socket

_pid = os.getpid()

#: This host's name, as jobs record it (a fork keeps the host).
HOSTNAME = socket.gethostname()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def current_pid() -> int:
    """``os.getpid()``, without the system call."""
    return _pid
