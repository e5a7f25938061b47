"""How long a worker may hold a message unacknowledged: the longest run of an
``acks_late`` task (its hard ``time_limit``) and the longest countdown or ETA (a
worker holds an ETA message until it is due).  A broker that takes a message back
sooner (a visibility timeout, RabbitMQ's consumer timeout) hands it to a second
worker while the first still holds it."""

from __future__ import annotations

from dataclasses import dataclass, field

from celery_recovery.core.errors import StoreError
from celery_recovery.doctor.deployment import Deployment

#: Names of tasks listed in a note before "and N more".
SHOWN_TASKS = 5


@dataclass(frozen=True)
class Hold:
    """A time a message is held, in seconds, and where the doctor read it."""

    seconds: float
    source: str


@dataclass
class Holds:
    """The longest hold known, and what the doctor read (or could not) to find it."""

    longest: Hold | None = None
    notes: list[str] = field(default_factory=list)

    def offer(self, hold: Hold) -> None:
        if self.longest is None or hold.seconds > self.longest.seconds:
            self.longest = hold


def longest_hold(d: Deployment) -> Holds:
    holds = Holds()
    late = [task for task in d.tasks if task.acks_late]
    bounded = [task for task in late if task.time_limit]
    for task in bounded:
        holds.offer(
            Hold(
                task.time_limit or 0.0,
                f"time_limit={task.time_limit:g}s of the acks_late task {task.name}",
            )
        )
    unbounded = [task.name for task in late if not task.time_limit]
    holds.notes.append(
        f"tasks: {len(d.tasks)} registered, {len(late)} acks_late, "
        f"{len(bounded)} of them with a time_limit (task attributes, task_time_limit and "
        "task_annotations)"
    )
    if unbounded:
        more = len(unbounded) - SHOWN_TASKS
        names = ", ".join(unbounded[:SHOWN_TASKS]) + (f" and {more} more" if more > 0 else "")
        holds.notes.append(
            f"acks_late tasks without a time_limit (a run may last any time, so any broker "
            f"timeout may be too short for it): {names}"
        )
    declared = (d.values or {}).get("longest_eta")
    if declared:
        holds.offer(Hold(declared, f"recovery_longest_eta={declared:g}s"))
        holds.notes.append(f"longest countdown/ETA: recovery_longest_eta={declared:g}s")
        return holds
    _farthest_queued_eta(d, holds)
    return holds


def _farthest_queued_eta(d: Deployment, holds: Holds) -> None:
    store = d.store()
    if store is None:
        holds.notes.append("longest countdown/ETA: unknown (recovery_longest_eta unset, no store)")
        return
    try:
        farthest = store.tries.farthest_eta()
    except StoreError:
        holds.notes.append("longest countdown/ETA: unknown (the store did not answer)")
        return
    if farthest is None or farthest[2] is None:
        holds.notes.append(
            "longest countdown/ETA: none queued in the store now (recovery_longest_eta unset)"
        )
        return
    name, eta, queued_at = farthest[0], farthest[1], farthest[2]
    seconds = max((eta - queued_at).total_seconds(), 0.0)
    holds.offer(
        Hold(
            seconds,
            f"the farthest ETA of a queued task in the store ({name}, "
            f"{seconds:.0f}s after it was published)",
        )
    )
    holds.notes.append(
        f"longest countdown/ETA: {seconds:.0f}s ({name}, the farthest ETA queued in the store; "
        "declare the longest you use with recovery_longest_eta)"
    )
