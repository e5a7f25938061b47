"""What a trigger's event does: decided once in the store, then carried out.

Runs in a worker thread of the triggerer (never on its event loop), a batch
at a time: one transaction fires the batch's triggers (compare-and-set while
this triggerer still holds them), then, with no transaction open, resumed
tries are published again and completed or failed ones are written to the
result backend, then one transaction gives the tries their outcome and
deletes the rows.  A fired row left behind by a dead triggerer is finished
by its next claimer from the event stored on it, without running the
trigger again.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import states
from celery.app.task import Context

from celery_recovery.core.audit import AuditAction, AuditReason, Decision
from celery_recovery.core.errors import DeferralError, TriggerFailedError, TriggerTimeoutError
from celery_recovery.core.records import TriggerRow
from celery_recovery.core.timeutils import utcnow
from celery_recovery.deliveries.deferral import resume_header
from celery_recovery.messages.headers import RESUME_HEADER
from celery_recovery.messages.republish import republish
from celery_recovery.messages.result_backends import caller_request
from celery_recovery.store import FAILURE, RESUME, SUCCESS, Finish, Firing
from celery_recovery.telemetry import metrics
from celery_recovery.triggers.base import TaskFailedEvent, TaskSuccessEvent, TriggerEvent
from celery_recovery.triggers.loading import check_json

if TYPE_CHECKING:
    from celery_recovery.runtime.context import RecoveryContext

logger = logging.getLogger("celery_recovery.triggerer")

#: How the error of a trigger whose run() raised begins.
RAISED = "the trigger raised:"
#: Longest error text kept for a failed trigger.
MAX_ERROR_LENGTH = 4000


@dataclass(frozen=True)
class Outcome:
    """The event one trigger produced (or the failure it met), for its row."""

    row: TriggerRow
    kind: str
    payload: Any = None

    @property
    def trigger_id(self) -> int:
        return int(self.row["id"])


def from_event(row: TriggerRow, event: Any) -> Outcome:
    """The outcome of an event a trigger yielded; a malformed event fails the task."""
    if isinstance(event, TriggerEvent):
        kind, payload = RESUME, event.payload
    elif isinstance(event, TaskSuccessEvent):
        kind, payload = SUCCESS, event.value
    elif isinstance(event, TaskFailedEvent):
        return failure(row, str(event.error))
    else:
        return failure(
            row,
            f"the trigger yielded {event!r}, not a TriggerEvent, "
            "TaskSuccessEvent or TaskFailedEvent",
        )
    try:
        check_json(payload, "the event's payload")
    except DeferralError as exc:
        return failure(row, str(exc))
    return Outcome(row, kind, payload)


def failure(row: TriggerRow, error: str, exception: type = TriggerFailedError) -> Outcome:
    return Outcome(
        row, FAILURE, {"error": error[:MAX_ERROR_LENGTH], "exception": exception.__name__}
    )


def crashed(row: TriggerRow) -> Outcome:
    """The outcome of a trigger whose ``run()`` raised (call inside ``except``)."""
    return failure(row, RAISED + "\n" + traceback.format_exc())


def timed_out(row: TriggerRow) -> Outcome:
    return failure(
        row,
        f"the deferral timed out at {row['timeout_at']} before its trigger fired",
        TriggerTimeoutError,
    )


def stored(row: TriggerRow) -> Outcome:
    """The outcome already recorded on a fired row."""
    # Only fired rows (event_kind set) are read back this way.
    return Outcome(row, row["event_kind"] or "", row["event"])


class OutcomeApplier:
    """Fires, carries out and finishes batches of outcomes for one triggerer."""

    def __init__(self, context: RecoveryContext) -> None:
        self.context = context
        self.store = context.store

    def apply(self, owner: str, outcomes: list[Outcome]) -> set[int]:
        """Apply a batch; returns the ids of the triggers finished.

        Raises :class:`~celery_recovery.core.errors.StoreError`; applying the same
        batch again is safe (a fired row keeps its first event).
        """
        if not outcomes:
            return set()
        firings = [self._firing(o) for o in outcomes]
        decided, to_publish = self.store.triggers.fire_triggers(owner, firings, utcnow())
        done: list[Finish] = []
        retry_later: list[int] = []
        for outcome in outcomes:
            if outcome.trigger_id not in decided:
                continue  # another triggerer holds it now
            # A row fired earlier keeps the event it was fired with.
            outcome = Outcome(outcome.row, *decided[outcome.trigger_id])
            if self._carry_out(outcome, to_publish.get(outcome.trigger_id)):
                done.append(self._finish(outcome))
            else:
                retry_later.append(outcome.trigger_id)
        self.store.triggers.finish_triggers(owner, done, utcnow())
        if retry_later:
            # Fired but not carried out (result backend down): any triggerer,
            # this one included, finishes them from the stored event later.
            self.store.triggers.release_triggers(owner, retry_later)
        for finish in done:
            metrics.trigger_event(_metric_kind(finish))
        return {f.trigger_id for f in done}

    def _firing(self, outcome: Outcome) -> Firing:
        row = outcome.row
        header = None
        if outcome.kind == RESUME:
            header = (
                RESUME_HEADER,
                resume_header(row.get("method_name"), row.get("method_kwargs"), outcome.payload),
            )
        return Firing(
            int(row["id"]),
            row["task_id"],
            int(row["try_number"]),
            outcome.kind,
            outcome.payload,
            header,
        )

    def _carry_out(self, outcome: Outcome, record: dict[str, Any] | None) -> bool:
        """The event's effect outside the store; False to try again later."""
        row = outcome.row
        app = self.context.app
        task_id = row["task_id"]
        try:
            if outcome.kind == RESUME:
                if record is not None:
                    republish(app, record, int(row["try_number"]))
            elif outcome.kind == SUCCESS:
                request = self._caller_request(task_id, int(row["try_number"]))
                app.backend.store_result(task_id, outcome.payload, states.SUCCESS, request=request)
            else:
                request = self._caller_request(task_id, int(row["try_number"]))
                app.backend.mark_as_failure(task_id, _exception(outcome.payload), request=request)
        except Exception as exc:
            if outcome.kind == RESUME:
                # The try is queued: the lost-message sweep publishes it when overdue.
                logger.warning(
                    "celery-recovery: could not publish the resume of %s (%s); the "
                    "lost-message sweep will",
                    task_id,
                    exc,
                )
                return True
            logger.warning(
                "celery-recovery: could not store the outcome of %s in the result backend "
                "(%s); will try again",
                task_id,
                exc,
            )
            return False
        return True

    def _caller_request(self, task_id: str, try_number: int) -> Context | None:
        """Where the outcome reaches the caller, when the backend replies to it (rpc://):
        the route its try's record keeps; None for a backend that stores by task id."""
        if not self.context.routes_replies:
            return None
        for record in self.store.tries.history(task_id):
            if record["try_number"] == try_number and isinstance(record.get("headers"), dict):
                return caller_request(task_id, record["headers"])
        return None

    def _finish(self, outcome: Outcome) -> Finish:
        row = outcome.row
        kind = outcome.kind
        if kind == FAILURE:
            payload = outcome.payload or {}
            return Finish(
                int(row["id"]),
                row["task_id"],
                int(row["try_number"]),
                kind,
                reason="failed by its trigger",
                error=str(payload.get("error")),
                exception=str(payload.get("exception") or TriggerFailedError.__name__),
                audit=_failed_for_good(row, payload),
            )
        reason = "completed by its trigger" if kind == SUCCESS else "resumed by its trigger"
        return Finish(int(row["id"]), row["task_id"], int(row["try_number"]), kind, reason)


def _failed_for_good(row: TriggerRow, payload: dict[str, Any]) -> Decision:
    timeout = payload.get("exception") == TriggerTimeoutError.__name__
    why = AuditReason.TRIGGER_TIMEOUT if timeout else AuditReason.TRIGGER_FAILED
    # The triggerer that held it (a sweep's holder name when a sweep timed it out).
    actor = str(row.get("triggerer_id") or "")[:64] or None
    detail = str(payload.get("error") or "the trigger failed")[:MAX_ERROR_LENGTH]
    return Decision.of(utcnow(), AuditAction.FAILED, why, row, detail, actor)


def _metric_kind(finish: Finish) -> str:
    if finish.kind == RESUME:
        return "resumed"
    if finish.kind == SUCCESS:
        return "succeeded"
    if finish.exception == TriggerTimeoutError.__name__:
        return "timed_out"
    return "error" if (finish.error or "").startswith(RAISED) else "failed"


def _exception(payload: Any) -> Exception:
    payload = payload or {}
    cls = TriggerTimeoutError if payload.get("exception") == "TriggerTimeoutError" else None
    return (cls or TriggerFailedError)(str(payload.get("error") or "the trigger failed"))
