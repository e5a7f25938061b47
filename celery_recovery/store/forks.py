"""A fork waits until no thread of the process is using the store.

A prefork worker's main process forks a new pool process right after one
died, which is exactly when its writer thread records that death.  A child
forked while another thread of its parent is inside SQLite (or holds a
connection pool's lock) inherits those locks held by no thread, and its own
store calls then hang for ever.  So every store call enters the gate, and a
fork (``os.register_at_fork``) waits for the calls in progress to leave and
keeps new ones out until it is done.  Store calls are short; a fork waits at
most :data:`MAX_FORK_WAIT` seconds for them.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: Longest a fork waits for the store calls in progress (a store that hangs
#: must not stop a worker from replacing its pool processes).
MAX_FORK_WAIT = 10.0

_gates: weakref.WeakSet[ForkGate] = weakref.WeakSet()
#: The gates closed for the fork in progress (a gate made meanwhile is not one).
_closed: list[ForkGate] = []


class ForkGate:
    """Many threads use the store at once; a fork waits until none does."""

    def __init__(self, in_child: Callable[[], None]) -> None:
        self._in_child = in_child
        self._reset()
        _gates.add(self)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._users = 0
        self._forking = False

    @contextmanager
    def using(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._forking)
            self._users += 1
        try:
            yield
        finally:
            with self._cond:
                self._users -= 1
                if not self._users:
                    self._cond.notify_all()

    def before_fork(self) -> None:
        # The condition's lock stays held across the fork: the child's copy is replaced.
        self._cond.acquire()
        self._forking = True
        self._cond.wait_for(lambda: self._users == 0, timeout=MAX_FORK_WAIT)

    def after_fork_in_parent(self) -> None:
        self._forking = False
        self._cond.notify_all()
        self._cond.release()

    def after_fork_in_child(self) -> None:
        self._reset()
        self._in_child()


def _before() -> None:
    _closed[:] = list(_gates)
    for gate in _closed:
        gate.before_fork()


def _after_in_parent() -> None:
    for gate in _closed:
        gate.after_fork_in_parent()
    _closed.clear()


def _after_in_child() -> None:
    for gate in _closed:
        gate.after_fork_in_child()
    _closed.clear()


os.register_at_fork(
    before=_before, after_in_parent=_after_in_parent, after_in_child=_after_in_child
)
