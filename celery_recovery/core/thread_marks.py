"""The per-thread mark of how a delivery ended when its body did not end it.

A mechanism that ends a delivery its own way (dropped as redundant, failed
instead of run, deferred, postponed) marks it in its own module, as it ends
it; ``task_postrun`` takes the mark once, for every task, and settles the
delivery by it instead of recording the state Celery reports.  One mark
suffices: a delivery ends once, and the thread runs one delivery at a time.

A plain ``threading.local()`` raises ``AttributeError`` inside
``getattr(local, name, None)`` for an attribute never set in that thread,
about 0.7 µs each time, the usual case on every task; a subclass whose
attributes have class-level defaults reads them in about 0.07 µs.
"""

from __future__ import annotations

import enum
import threading
from typing import NamedTuple


class Ending(enum.Enum):
    """How a delivery ended without its body returning or raising."""

    #: Its body skipped, as redundant or as a try another process failed meanwhile:
    #: the try's record belongs to the delivery that was not dropped.
    DROPPED = "dropped"
    #: Its try's runs were used up: failed without running, its FAILURE stored at
    #: ``task_postrun`` (so that it replaces the STARTED Celery stored before).
    FAILED_INSTEAD = "failed instead of run"
    #: ``defer()``: the try waits for its trigger.
    DEFERRED = "deferred"
    #: Published again for later as the same try, which is ``queued`` again.
    POSTPONED = "postponed"


class Ended(NamedTuple):
    """A delivery's mark: its task id, how it ended, and the error it failed with."""

    task_id: str
    how: Ending
    error: BaseException | None = None


class DeliveryEnding(threading.local):
    """How the delivery this thread runs ended, if a mechanism ended it."""

    ended: Ended | None = None

    def mark(self, task_id: str, how: Ending, error: BaseException | None = None) -> None:
        self.ended = Ended(task_id, how, error)

    def peek(self, task_id: str) -> Ended | None:
        """The mark of ``task_id``'s delivery, left in place."""
        ended = self.ended
        return ended if ended is not None and ended.task_id == task_id else None

    def take(self, task_id: str) -> Ended | None:
        """The mark of ``task_id``'s delivery (once: it is cleared)."""
        ended = self.ended
        if ended is None or ended.task_id != task_id:
            return None
        self.ended = None
        return ended


#: The one mark, shared by every mechanism.
delivery_ending = DeliveryEnding()
