"""Worker side: a try goes ``running`` → ``success`` | ``failed`` | ``up_for_retry`` | ``revoked``.

Every task class of the app gets a ``before_start`` (:func:`hook_task_classes`)
that queues the try's ``running`` claim, committed within the writer's flush
interval (so a process killed mid-task is known to be running it), or drops a
redundant delivery by raising ``Ignore`` (see :mod:`..redundant_deliveries`).
Celery calls it in the pool process just before the body, after storing
``STARTED``; a hook costs a task less than a ``task_prerun`` receiver, whose
signal Celery skips when nothing is connected to it.  The outcome follows at
``task_postrun`` through the same ordered buffer, and for a short task both
land as one row write.  If an outcome is lost, the sweeps reconcile it from
the result backend.  Exceptions and retry reasons are kept aside by
``task_failure`` / ``task_retry`` and written once, at ``task_postrun``.
The same signals sent from the worker's main process about a pool process
that died are handled by :mod:`celery_recovery.deliveries.worker_lost`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from billiard.exceptions import WorkerLostError
from celery import Task
from celery import states as celery_states
from celery.exceptions import Ignore, Reject
from celery.signals import (
    task_failure,
    task_postrun,
    task_retry,
    task_revoked,
    worker_init,
)

from celery_recovery.core.errors import LostWorkerError, StoreError
from celery_recovery.core.patching import wrap_once, wrapped_here
from celery_recovery.core.records import Transition, WriteKind
from celery_recovery.core.states import NEVER_RAN_REASON, TaskState
from celery_recovery.core.thread_marks import Ended, Ending, delivery_ending
from celery_recovery.core.timeutils import utcnow
from celery_recovery.deliveries.deferral import install_resume, note_delivery
from celery_recovery.deliveries.redundant_deliveries import drop_if_redundant
from celery_recovery.deliveries.time_limits import install as install_time_limits
from celery_recovery.deliveries.time_limits import note_failure_signal, soft_limit_reason
from celery_recovery.deliveries.worker_lost import (
    claim_counting_deaths,
    failing_request,
    install_failure_context,
    is_lost_process_retry,
    record_lost_process,
    record_lost_retry,
    store_refused_failure,
)
from celery_recovery.messages.records import claim_from_request, published_alongside, try_number_of
from celery_recovery.runtime.context import RecoveryContext, context_for_app
from celery_recovery.signals.guard import handler_failed, never_raises

logger = logging.getLogger("celery_recovery.signals")

#: Longest error text kept on a record.
MAX_ERROR_LENGTH = 4000

_OUTCOMES = {
    celery_states.SUCCESS: (TaskState.SUCCESS, None),
    celery_states.FAILURE: (TaskState.FAILED, None),
    celery_states.RETRY: (TaskState.UP_FOR_RETRY, None),
    celery_states.IGNORED: (TaskState.SUCCESS, "the task raised Ignore"),
    celery_states.REJECTED: (TaskState.FAILED, "the task rejected its message"),
}

#: Celery's built-in tasks (``celery.chord_unlock``, ``celery.map``...): checked for
#: redundant deliveries like the user's, since a redundant copy of one repeats its work
#: (an unlock publishes a chord body).
BUILTIN_TASKS_PREFIX = "celery."
#: celery-recovery's own tasks (the sweeps): claimed, never dropped (they are
#: idempotent, and must run when the store is odd).
OWN_TASKS_PREFIX = "celery_recovery."

#: Set on the class of a task ``recovery_exclude_tasks`` names: nothing of it is recorded.
_EXCLUDED = "_celery_recovery_excluded"


class _Runs(threading.local):
    """What this thread keeps of the deliveries it runs, from their claim to their
    ``task_postrun`` (class-level defaults: see :mod:`celery_recovery.core.thread_marks`)."""

    #: (task id, retries) of the delivery whose ``before_start`` this thread last entered.
    delivery: tuple[str, Any] | None = None
    #: That delivery's request, for its ``task_postrun`` (``task.request`` walks Celery's
    #: request stack: about 1.3 µs, on every task).
    request: Any = None
    #: Id of the delivery this thread runs from a queue ``recovery_exclude_queues`` names.
    excluded: str | None = None

    def __init__(self) -> None:
        #: Task id -> monotonic time its body started, in this thread.
        self.started: dict[str, float] = {}
        #: Task id -> the error or retry reason set aside for its outcome.
        self.errors: dict[str, str | None] = {}
        #: Task id -> why its try failed, when the error alone does not say (a soft limit).
        self.reasons: dict[str, str] = {}


_runs = _Runs()


def _context_of(task: Any, request: Any = None) -> Any:
    """The installation recording ``task``'s runs; ``request`` is ``task.request`` when
    the caller already read it (each read walks Celery's thread-local request stack)."""
    if task is None:
        return None
    context = context_for_app(task.app)
    if context is None:
        return None
    if getattr(task.request if request is None else request, "is_eager", False):
        return None
    return context


def _describe(exc: BaseException | None) -> str | None:
    if exc is None:
        return None
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_LENGTH]


def hook_task_classes(context: RecoveryContext) -> None:
    """Give every task class of the app the ``before_start`` that claims the try (and
    the user's tasks, not Celery's or ours, the resume of a deferred try, see
    :mod:`..deferral`): now if the app is finalized, else when it is, and again as a
    worker starts, for the tasks its modules registered since (before the worker
    builds their tracers, which look the hooks up once)."""
    app = context.app
    if app.finalized:
        _hook_every_task(app)
    else:
        app.on_after_finalize.connect(lambda *_, **__: _hook_every_task(app), weak=False)


@never_raises
def on_worker_init(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None and context_for_app(app) is not None:
        _hook_every_task(app)
        # The worker's main process: what Celery tells there of failed requests.
        install_failure_context()
        install_time_limits()


def _hook_every_task(app: Any) -> None:
    context = context_for_app(app)
    exclusions = context.exclusions if context is not None else None
    for task in list(app.tasks.values()):
        if exclusions and exclusions.tasks.match(task.name):
            # Left alone: no claim before its body, no outcome after (on_postrun looks).
            setattr(type(task), _EXCLUDED, True)
            continue
        own = task.name.startswith(OWN_TASKS_PREFIX)
        _hook(type(task), drops=not own)
        if not own and not task.name.startswith(BUILTIN_TASKS_PREFIX):
            install_resume(type(task))


def _hook(cls: Any, drops: bool) -> None:
    wrap_once(cls, "before_start", lambda original: _claiming(original, drops), per_class=True)


def _claiming(original: Any, drops: bool) -> Any:
    """A task class's ``before_start`` that claims the try first (or drops the delivery)."""
    # Celery's own does nothing (its tracer skips it): not called either.
    own = original if original is not Task.before_start else None

    def before_start(self: Any, task_id: str, args: Any, kwargs: Any) -> Any:
        request = self.request
        delivery = (task_id, request.retries)
        # A hooked subclass's hook, or a before_start calling super(), enters once.
        runs = _runs
        if runs.delivery != delivery:
            note_delivery(self, request)
            try:
                dropped = start_try(self, task_id, request, drops)
            except Exception:
                handler_failed("start_try")
                dropped = False
            if dropped:
                raise Ignore()
            runs.delivery = delivery
            runs.request = request
        if own is not None:
            return own(self, task_id, args, kwargs)
        return None

    return before_start


def start_try(task: Any, task_id: str, request: Any, drops: bool) -> bool:
    """Claim the try a delivery starts; True when the delivery is dropped instead (its
    body is skipped): redundant, or an ``acks_late`` try whose runs are used up.
    Its caller, the hook, catches what it raises.

    Runs before every task body: each lookup here is paid per task (see
    benchmarks/hot_path.py), so the request is read once and passed along.
    """
    context = _context_of(task, request)
    if context is None:
        return False
    exclusions = context.exclusions
    if exclusions.queues and exclusions.request(None, request):
        _runs.excluded = task_id
        return False
    if drops and drop_if_redundant(context, task, task_id, request):
        return True
    runtime = context.runtime
    if task.acks_late:
        # Its message comes back when this process dies: count the deaths (the claim is
        # written now, so it carries its message now when it needs one).
        record = claim_from_request(task, utcnow(), runtime.job_id, request)
        if claim_counting_deaths(context, task, record):
            return True  # failed for good instead
    elif published_alongside(request, time.time()):
        claim_before_body(context, claim_from_request(task, utcnow(), runtime.job_id, request))
    else:
        runtime.record_start(
            claim_from_request(task, utcnow(), runtime.job_id, request, message_when_written=True)
        )
    _runs.started[task_id] = time.monotonic()
    return False


def claim_before_body(context: RecoveryContext, record: dict[str, Any]) -> None:
    """Commit a claim (with its message) now, not within the writer's interval; when the
    store fails, the writer takes it and keeps trying (the body runs either way)."""
    runtime = context.runtime
    try:
        runtime.store.tries.mark_running(record)
    except StoreError as exc:
        runtime.health.record_failure(exc, f"claiming {record['task_id']} before its body")
        runtime.record_start(record)


@never_raises
def on_failure(
    sender: Any = None,
    task_id: str | None = None,
    exception: BaseException | None = None,
    args: Any = None,
    kwargs: Any = None,
    **_: Any,
) -> None:
    context = _context_of(sender)
    if context is None or task_id is None or isinstance(exception, LostWorkerError):
        return  # LostWorkerError: fired by the sweep's callback delivery, already recorded
    if _left_alone(context, sender, task_id):
        return
    if _runs_here(task_id):
        # In the process running the try: task_postrun follows and writes the outcome.
        _set_aside(task_id, _describe(exception))
        reason = soft_limit_reason(exception, sender, sender.request)
        if reason is not None:
            _runs.reasons[task_id] = reason
        return
    # In the worker's main process (which pushes the request context first, so the
    # request does not tell): the pool process died (WorkerLostError) or hit a hard
    # time limit, so no task_postrun will come from it.
    if note_failure_signal(task_id, exception):
        return  # Celery 5.7's report of a hard limit: recorded by time_limits
    if isinstance(exception, WorkerLostError):
        record_lost_process(context, sender, task_id, exception, args, kwargs)
        return
    # Celery 5.7 reports Reject(requeue=False) from here too, racing the pool process's
    # own record of it: both give the same reason.
    reason = (
        _OUTCOMES[celery_states.REJECTED][1]
        if isinstance(exception, Reject)
        else "failed by the worker's main process"
    )
    change = Transition.ending(
        task_id,
        None,
        (TaskState.RUNNING,),
        TaskState.FAILED,
        reason,
        utcnow(),
        error=_describe(exception),
    )
    context.runtime.write(WriteKind.TRANSITION, change)


@never_raises
def on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
    context = _context_of(sender)
    if context is None or request is None or _left_alone(context, sender, request.id, request):
        return
    if not _runs_here(request.id) and is_lost_process_retry(reason):
        # task_retry_on_worker_lost: the main process retried a try whose pool process died.
        record_lost_retry(context, sender, reason)
        return
    _set_aside(request.id, f"retry: {reason}"[:MAX_ERROR_LENGTH])


def on_postrun(
    task_id: str | None = None,
    task: Any = None,
    state: str | None = None,
    retval: Any = None,
    **_: Any,
) -> None:
    try:
        _record_outcome(task_id, task, state, retval)
    except Exception:
        handler_failed("on_postrun")


def _record_outcome(task_id: str | None, task: Any, state: str | None, retval: Any) -> None:
    if task is None or task_id is None or type(task).__dict__.get(_EXCLUDED):
        return
    runs = _runs
    delivery = runs.delivery
    entered = delivery is not None and delivery[0] == task_id
    # The request of the delivery this thread entered is the one Celery still holds.
    request = runs.request if entered else task.request
    runs.delivery = runs.request = None
    if runs.excluded is not None and runs.excluded == task_id:
        runs.excluded = None
        return
    context = _context_of(task, request)
    if context is None:
        return
    ended = delivery_ending.take(task_id)
    if ended is not None:
        _settle(task, ended)
    elif state == celery_states.REJECTED and getattr(retval, "requeue", False):
        _requeued(context, task, task_id, "rejected with requeue=True: back in the queue")
    elif state is None and not entered and wrapped_here(type(task), "before_start"):
        # Celery failed before the body and its before_start (an unreachable result
        # backend refused STARTED) and acknowledges the message: the try is as unstarted
        # as a lost message.  Claimed here (with the message, when its publisher does
        # not record it), it is queued again for the lost-message sweep.
        runtime = context.runtime
        runtime.record_start(claim_from_request(task, utcnow(), runtime.job_id, request))
        _requeued(context, task, task_id, NEVER_RAN_REASON)
    elif state is None and entered:
        # The body was interrupted by a signal that stops this process: a hard time
        # limit or a terminating revoke, which the worker's main process records, or the
        # worker's cold shutdown, after which a sweep recovers the try.
        _runs.started.pop(task_id, None)
        _take_aside(task_id)
    else:
        _record_finished(context, task_id, state, request)


def _settle(task: Any, ended: Ended) -> None:
    """End a delivery that a mechanism ended (see :mod:`..core.thread_marks`)."""
    match ended.how:
        case Ending.DROPPED:
            pass  # the try's record belongs to the delivery that was not dropped
        case Ending.FAILED_INSTEAD:
            store_refused_failure(task, ended)
        case Ending.DEFERRED | Ending.POSTPONED:
            # The try was already moved to deferred, or back to queued.
            _runs.started.pop(ended.task_id, None)


def _record_finished(
    context: RecoveryContext, task_id: str, state: str | None, request: Any
) -> None:
    """The try's outcome, from the state Celery ended its delivery in."""
    outcome = _OUTCOMES.get(state or "")
    if outcome is None:
        outcome = (TaskState.FAILED, f"ended in state {state or 'unknown'}")
    new, reason = outcome
    error = _take_aside(task_id)
    if error is not None and _runs.reasons:
        reason = _runs.reasons.pop(task_id, reason)
    now = utcnow()
    values: dict[str, Any] = {"state": new, "ended_at": now, "updated_at": now}
    if new is TaskState.UP_FOR_RETRY:
        values["state_reason"] = error
    elif error is not None:
        values["error"] = error
    if reason is not None:
        values["state_reason"] = reason
    try_number = try_number_of(request)
    runtime = context.runtime
    runtime.writer.finish(task_id, try_number, values)
    started = _runs.started.pop(task_id, None)
    if started is not None and time.monotonic() - started >= context.settings.zombie_threshold:
        # Long enough to have been declared dead meanwhile (a pause, a partition): if a
        # sweep recovered this try, keep what it finally did beside the recovery.
        runtime.write(WriteKind.LATE, (task_id, try_number, new.value, now))


def _requeued(context: Any, task: Any, task_id: str, reason: str) -> None:
    """The try is ``queued`` again: its message is back in the queue
    (``Reject(requeue=True)``), or gone although the body never ran.

    A redelivery then claims it as usual (recording it finished would make that
    redelivery look redundant and be dropped); a message that is gone is sent again
    by the lost-message sweep after ``recovery_queued_timeout``.
    """
    _runs.started.pop(task_id, None)
    _take_aside(task_id)
    now = utcnow()
    context.runtime.write(
        WriteKind.TRANSITION,
        Transition(
            task_id,
            try_number_of(task.request),
            (TaskState.RUNNING,),
            {
                "state": TaskState.QUEUED,
                "job_id": None,
                "queued_at": now,
                "updated_at": now,
                "state_reason": reason,
            },
        ),
    )


@never_raises
def on_revoked(
    sender: Any = None,
    request: Any = None,
    terminated: bool = False,
    expired: bool = False,
    signum: Any = None,
    **_: Any,
) -> None:
    context = context_for_app(sender.app) if sender is not None else None
    if context is None or request is None or _left_alone(context, sender, request.id, request):
        return
    expected: tuple[TaskState, ...] = (TaskState.QUEUED, TaskState.RUNNING)
    if expired:
        reason = "expired before it ran"
    elif terminated:
        reason = f"revoked and terminated (signal {signum})"
        # The killed pool process may report the kill as a failure first.
        expected += (TaskState.FAILED,)
    else:
        reason = "revoked"
    change = Transition.ending(
        request.id, try_number_of(request), expected, TaskState.REVOKED, reason, utcnow()
    )
    context.runtime.write(WriteKind.TRANSITION, change)


def _left_alone(context: RecoveryContext, task: Any, task_id: str, request: Any = None) -> bool:
    """Whether ``task_id`` is of a task or queue the settings exclude (failure paths only)."""
    if type(task).__dict__.get(_EXCLUDED):
        return True
    exclusions = context.exclusions
    if not exclusions.queues:
        return False
    if _runs.excluded == task_id:
        return True
    request = request if request is not None else failing_request(task, task_id)
    return request is not None and exclusions.request(None, request)


def _runs_here(task_id: str) -> bool:
    """Whether this thread started ``task_id``'s body (else it is the worker's main process)."""
    return task_id in _runs.started


def _set_aside(task_id: str, text: str | None) -> None:
    _runs.errors[task_id] = text


def _take_aside(task_id: str) -> str | None:
    errors = _runs.errors
    return errors.pop(task_id, None) if errors else None


def connect() -> None:
    worker_init.connect(on_worker_init, weak=False, dispatch_uid=__name__ + ".worker_init")
    task_failure.connect(on_failure, weak=False, dispatch_uid=__name__ + ".failure")
    task_retry.connect(on_retry, weak=False, dispatch_uid=__name__ + ".retry")
    task_postrun.connect(on_postrun, weak=False, dispatch_uid=__name__ + ".postrun")
    task_revoked.connect(on_revoked, weak=False, dispatch_uid=__name__ + ".revoked")
