"""Whether an entry's previous run is still going, as the store knows it.

The workers record every try's state (``queued`` when published, ``running``,
then an outcome); a run retried is going while its latest try is.  A run whose
record is gone (retention) counts as done.
"""

from __future__ import annotations

from celery_recovery.core.records import BeatEntryRow
from celery_recovery.core.states import TaskState
from celery_recovery.store import Store

#: States of a task's latest try that mean the task is done.
DONE = frozenset({TaskState.SUCCESS, TaskState.FAILED, TaskState.REVOKED})


def previous_run_going(store: Store, row: BeatEntryRow) -> str | None:
    """The state of the entry's last sent run while it is not done (else None)."""
    task_id = row.get("last_task_id")
    if not task_id:
        return None
    tries = store.tries.history(task_id)
    if not tries:
        return None
    state = tries[-1]["state"]
    return None if state in DONE else str(state)
