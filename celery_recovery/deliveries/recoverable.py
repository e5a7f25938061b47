"""``@recoverable``: a re-delivered task never repeats its side effects.

Use it under ``@app.task``::

    @app.task(bind=True, max_retries=3)
    @recoverable(idempotency_key="charge:{order_id}", lock_ttl=60, result_ttl=86400)
    def charge(self, order_id): ...

Before the body runs, the task's idempotency key is locked in Redis with a
fencing token (one round trip).  The lease is renewed while the body runs
and released at its end, storing the result (JSON) for ``result_ttl``
seconds.  A delivery whose key has completed returns that result without
running; one whose key is held by another live attempt does not run the
body (retried later by default, or dropped with ``on_duplicate="skip"``).
A failed attempt releases the key so a retry can run.  If Redis cannot be
reached the body does not run and the task is retried
(``on_lock_error="run"`` runs it unguarded instead).
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar, overload

from celery import current_task
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads
from redis.exceptions import RedisError

from celery_recovery.core.durations import positive_seconds
from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.log_once import LogOnce
from celery_recovery.core.records import Transition, WriteKind
from celery_recovery.core.states import TaskState
from celery_recovery.deliveries.postpone import postpone
from celery_recovery.locks import DONE, HELD, Acquisition, IdempotencyLocks, LeaseRenewer
from celery_recovery.locks.keys import KeySpec, build_key, check_template
from celery_recovery.messages.records import MAX_RECORDED_PAYLOAD
from celery_recovery.runtime.context import RecoveryContext, context_for_app
from celery_recovery.telemetry import metrics

logger = logging.getLogger("celery_recovery.recoverable")

F = TypeVar("F", bound=Callable[..., Any])

_token: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "celery_recovery_fencing_token", default=None
)
#: Tasks whose result could not be remembered, already warned about.
_unstorable = LogOnce()


def current_fencing_token() -> int | None:
    """The fencing token of the idempotency lock the running task body holds, if any.

    Tokens grow with every acquisition: guard your own writes with them
    (e.g. ``UPDATE ... WHERE last_token < :token``) so that an attempt that
    lost its lease while paused cannot overwrite a newer attempt's work.
    """
    return _token.get()


@overload
def recoverable(func: F) -> F: ...


@overload
def recoverable(
    func: None = None,
    *,
    idempotency_key: KeySpec = None,
    lock_ttl: float = 60.0,
    result_ttl: float = 86400.0,
    on_duplicate: str = "retry",
    on_lock_error: str = "retry",
    retry_countdown: float = 5.0,
    recovery_heartbeat_timeout: float | None = None,
) -> Callable[[F], F]: ...


def recoverable(
    func: F | None = None,
    *,
    idempotency_key: KeySpec = None,
    lock_ttl: float = 60.0,
    result_ttl: float = 86400.0,
    on_duplicate: str = "retry",
    on_lock_error: str = "retry",
    retry_countdown: float = 5.0,
    recovery_heartbeat_timeout: float | None = None,
) -> F | Callable[[F], F]:
    """Guard a task body with an idempotency lock; see the module documentation.

    ``idempotency_key``: a format string over the task's arguments (by name),
    a callable taking the same arguments, or None for the task name plus a
    stable hash of the arguments.  ``lock_ttl``, ``result_ttl`` and
    ``retry_countdown`` are seconds.  ``recovery_heartbeat_timeout`` (seconds) is
    the same as the task attribute: a try that does not call ``heartbeat()`` that
    often is stopped and run again (docs/stuck.md).
    """
    if recovery_heartbeat_timeout is not None:
        recovery_heartbeat_timeout = positive_seconds(
            "recovery_heartbeat_timeout", recovery_heartbeat_timeout, timedelta_ok=True
        )
    options = _Options(
        idempotency_key, lock_ttl, result_ttl, on_duplicate, on_lock_error, retry_countdown
    )

    def decorate(function: F) -> F:
        # A key template naming no parameter fails when the task is defined, not
        # on its first delivery.
        check_template(function, idempotency_key)

        @functools.wraps(function)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            call = _GuardedCall.of_running_task(function, options, args, kwargs)
            if call is None:
                return function(*args, **kwargs)
            return call.run()

        if recovery_heartbeat_timeout is not None:
            # Read through the task's ``run`` by the worker's main process.
            guarded.recovery_heartbeat_timeout = recovery_heartbeat_timeout  # type: ignore[attr-defined]
        # How `celery-recovery doctor` knows the app takes idempotency locks (and so
        # which Redis must keep them).
        guarded.__recoverable__ = options  # type: ignore[attr-defined]
        return guarded  # type: ignore[return-value]

    if func is not None:
        return decorate(func)
    return decorate


@dataclass(frozen=True)
class _Options:
    """``@recoverable``'s options, checked when the decorator is applied."""

    idempotency_key: KeySpec
    lock_ttl: float
    result_ttl: float
    on_duplicate: str
    on_lock_error: str
    retry_countdown: float

    def __post_init__(self) -> None:
        for name in ("lock_ttl", "result_ttl", "retry_countdown"):
            positive_seconds(name, getattr(self, name))
        if self.on_duplicate not in ("retry", "skip"):
            raise ConfigurationError(
                f"on_duplicate={self.on_duplicate!r}; allowed: 'retry', 'skip'"
            )
        if self.on_lock_error not in ("retry", "run"):
            raise ConfigurationError(
                f"on_lock_error={self.on_lock_error!r}; allowed: 'retry', 'run'"
            )


class _GuardedCall:
    """One delivery of a ``@recoverable`` task body, step by step: take the key's
    lock, answer a duplicate without running, or run holding the lock and release
    it remembering the result."""

    #: This process's locks and lease renewer, set when the lock is taken.
    locks: IdempotencyLocks
    leases: LeaseRenewer

    def __init__(
        self,
        context: RecoveryContext,
        task: Any,
        key: str,
        function: Callable[..., Any],
        options: _Options,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.context = context
        self.task = task
        self.request = task.request
        self.key = key
        self.function = function
        self.options = options
        self.args = args
        self.kwargs = kwargs
        # One holder per try: a retry (a new try) is a new holder of the same key.
        self.holder = f"{self.request.id}:{self.request.retries + 1}"

    @classmethod
    def of_running_task(
        cls,
        function: Callable[..., Any],
        options: _Options,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> _GuardedCall | None:
        """Resolve the running task and its key; None when there is nothing to guard:
        the body was called directly, or by an app without ``Recovery``."""
        task = current_task._get_current_object() if current_task else None
        if task is None:
            return None
        context = context_for_app(task.app)
        if context is None or task.request.called_directly:
            return None
        key = build_key(function, options.idempotency_key, task.name, args, kwargs, task)
        return cls(context, task, key, function, options, args, kwargs)

    def run(self) -> Any:
        got = self._acquire()
        if got is None:
            return self._call()
        if got.outcome == DONE:
            return self._remembered_result(got)
        if got.outcome == HELD:
            return self._held_elsewhere(got)
        return self._run_holding(got)

    def _call(self) -> Any:
        return self.function(*self.args, **self.kwargs)

    def _acquire(self) -> Acquisition | None:
        """Take the key's lock (one round trip).  None: Redis is down and
        ``on_lock_error="run"`` runs the body unguarded; otherwise a Redis outage
        postpones the task (raises) rather than risk running it twice."""
        try:
            self.locks, self.leases = self.context.runtime.locks()
            got = self.locks.acquire(self.key, self.holder, self.options.lock_ttl)
        except (RedisError, OSError) as exc:
            metrics.lock_acquisition("error")
            if self.options.on_lock_error == "run":
                logger.warning(
                    "celery-recovery: Redis unavailable (%s); running %s[%s] WITHOUT its "
                    "idempotency lock %r (on_lock_error='run')",
                    exc,
                    self.task.name,
                    self.request.id,
                    self.key,
                )
                return None
            logger.warning(
                "celery-recovery: Redis unavailable (%s); %s[%s] not run, retried in %ss "
                "(idempotency key %r)",
                exc,
                self.task.name,
                self.request.id,
                self.options.retry_countdown,
                self.key,
            )
            self._postpone(f"idempotency lock {self.key!r} unavailable")
        metrics.lock_acquisition(got.outcome)
        return got

    def _remembered_result(self, got: Acquisition) -> Any:
        """The key completed in an earlier delivery: its result, without running again."""
        logger.info(
            "celery-recovery: %s[%s] key %r already done; returning its result",
            self.task.name,
            self.request.id,
            self.key,
        )
        return kombu_loads(got.result)

    def _held_elsewhere(self, got: Acquisition) -> Any:
        """Another live attempt holds the key: never run the body beside it."""
        if self.options.on_duplicate == "skip":
            logger.info(
                "celery-recovery: %s[%s] skipped: key %r is held by %s",
                self.task.name,
                self.request.id,
                self.key,
                got.holder,
            )
            return None
        # Retried later: by then the holder has finished (its result is remembered)
        # or died (its lease expired).
        self._postpone(f"key {self.key!r} is held by {got.holder}")

    def _run_holding(self, got: Acquisition) -> Any:
        """Run the body holding the lock, renewed while it runs; release it at the end,
        remembering the result only when the body succeeded."""
        self._record_holder(got)
        reset = _token.set(got.token)
        self.leases.hold(self.key, got.value, self.options.lock_ttl)
        try:
            result = self._call()
        except BaseException:
            # A failed attempt remembers nothing, so a retry of the task can run.
            self._release(got, None)
            raise
        finally:
            _token.reset(reset)
        self._release(got, _encode_result(self.task.name, result))
        return result

    def _record_holder(self, got: Acquisition) -> None:
        """Tell the body (``self.request``) and the try's record which key and token it holds."""
        self.request.idempotency_key, self.request.fencing_token = self.key, got.token
        self.context.runtime.write(
            WriteKind.TRANSITION,
            Transition(
                self.request.id,
                self.request.retries + 1,
                (TaskState.RUNNING,),
                {"idempotency_key": self.key, "fencing_token": got.token},
            ),
        )

    def _release(self, got: Acquisition, result_json: str | None) -> None:
        # Stop renewing first: the lease must not outlive the release.
        self.leases.drop(self.key)
        try:
            if not self.locks.release(self.key, got.value, result_json, self.options.result_ttl):
                metrics.lease_lost()
                logger.warning(
                    "celery-recovery: idempotency lock %r was no longer ours at release "
                    "(lease expired; a newer attempt holds it)",
                    self.key,
                )
        except (RedisError, OSError) as exc:
            logger.warning("celery-recovery: could not release %r: %s", self.key, exc)

    def _postpone(self, why: str) -> NoReturn:
        postpone(self.context, self.task, self.options.retry_countdown, why)


def _encode_result(task_name: str, result: Any) -> str | None:
    try:
        text = kombu_dumps(result)
        json.loads(text)
    except (TypeError, ValueError):
        text = None
    if text is None or len(text) > MAX_RECORDED_PAYLOAD:
        if _unstorable.first(task_name):
            logger.warning(
                "celery-recovery: %s returned a result that is not JSON (or over %d bytes); "
                "its completion is remembered without the result",
                task_name,
                MAX_RECORDED_PAYLOAD,
            )
        return kombu_dumps(None)
    return text
