"""What a task run again sends again: a chain's next step, a chord, a child with a set id.

A try killed after its body published other tasks, and before its own outcome
was stored, is run again (the zombie sweep's next try, the broker's redelivery
of an ``acks_late`` message).  The new run publishes the same messages again,
and Celery gives canvas parts ids fixed when the canvas was frozen: a chain's
next step, a chord's header parts and its body come back under the ids they
already ran as.  Nothing in Celery tells the copy from the original, so the
step after a killed one, or a chord it started, would run twice.

The publisher marks them.  A publish made while this process runs a try that
may be a run again (``retries`` above 0, or a delivery the broker marks
redelivered) carries :data:`RESENT_HEADER`; a task that carries it hands it on
to what it publishes, for :data:`MAX_HOPS` generations, so the body that a
chord's new unlock task publishes is marked too.  A task's own retry (its own
id) is not marked: try numbers already tell those apart.

A marked delivery is checked as it starts (see
:mod:`celery_recovery.deliveries.redundant_deliveries`):
dropped when its try already finished or runs in a live job, as any redundant
delivery, and also when the result backend already holds a finished state for
its id (the original ran, and its worker died before its outcome reached the
store).  The check costs a store read and a backend read, paid only by marked
deliveries.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery_recovery.messages.headers import RESENT_HEADER

#: Generations a mark is handed on: enough for a chord's unlock and the body it
#: publishes, nested once more; bounded so a long lineage does not pay for ever.
MAX_HOPS = 4


_again = threading.local()


@contextmanager
def sending_again() -> Iterator[None]:
    """Mark what this thread publishes inside as a copy of an earlier publish that may
    have happened (a beat sending a run another leader claimed and may have sent)."""
    _again.on = True
    try:
        yield
    finally:
        _again.on = False


def resent_hops(app: Any, task_id: str | None) -> int | None:
    """The mark a publish of ``task_id`` made now in this process carries, or None."""
    if getattr(_again, "on", False):
        return 1
    task = app.current_worker_task
    if task is None:
        return None
    request = task.request
    if request.id == task_id:
        return None  # the task's own retry
    hops = _hops(request)
    if hops:
        return hops + 1 if hops < MAX_HOPS else None
    if request.retries or (request.delivery_info or {}).get("redelivered"):
        return 1
    return None


def is_resent(request: Any) -> bool:
    """True for a delivery a run that may repeat an earlier one published."""
    return _hops(request) > 0


def _hops(request: Any) -> int:
    hops = getattr(request, RESENT_HEADER, None)
    return hops if isinstance(hops, int) and hops > 0 else 0
