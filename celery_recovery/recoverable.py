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
from typing import Any, TypeVar, overload

from celery import current_task
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads
from redis.exceptions import RedisError

from celery_recovery import metrics
from celery_recovery.core.durations import positive_seconds
from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.log_once import LogOnce
from celery_recovery.core.records import Transition, WriteKind
from celery_recovery.core.states import TaskState
from celery_recovery.locks import DONE, HELD
from celery_recovery.locks.keys import KeySpec, build_key, check_template
from celery_recovery.messages import MAX_RECORDED_PAYLOAD
from celery_recovery.postpone import postpone

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
) -> F | Callable[[F], F]:
    """Guard a task body with an idempotency lock; see the module documentation.

    ``idempotency_key``: a format string over the task's arguments (by name),
    a callable taking the same arguments, or None for the task name plus a
    stable hash of the arguments.  ``lock_ttl``, ``result_ttl`` and
    ``retry_countdown`` are seconds.
    """
    for name, value in (
        ("lock_ttl", lock_ttl),
        ("result_ttl", result_ttl),
        ("retry_countdown", retry_countdown),
    ):
        positive_seconds(name, value)
    if on_duplicate not in ("retry", "skip"):
        raise ConfigurationError(f"on_duplicate={on_duplicate!r}; allowed: 'retry', 'skip'")
    if on_lock_error not in ("retry", "run"):
        raise ConfigurationError(f"on_lock_error={on_lock_error!r}; allowed: 'retry', 'run'")

    def decorate(function: F) -> F:
        check_template(function, idempotency_key)

        @functools.wraps(function)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            task = current_task._get_current_object() if current_task else None
            from celery_recovery.context import context_for_app

            context = context_for_app(task.app) if task is not None else None
            if context is None or task.request.called_directly:
                return function(*args, **kwargs)
            key = build_key(function, idempotency_key, task.name, args, kwargs, task)
            return _run_guarded(context, task, key, function, args, kwargs)

        def _run_guarded(context, task, key, function, args, kwargs):  # type: ignore[no-untyped-def]
            request = task.request
            holder = f"{request.id}:{request.retries + 1}"
            try:
                locks, leases = context.runtime.locks()
                got = locks.acquire(key, holder, lock_ttl)
            except (RedisError, OSError) as exc:
                metrics.lock_acquisition("error")
                if on_lock_error == "run":
                    logger.warning(
                        "celery-recovery: Redis unavailable (%s); running %s[%s] WITHOUT its "
                        "idempotency lock %r (on_lock_error='run')",
                        exc,
                        task.name,
                        request.id,
                        key,
                    )
                    return function(*args, **kwargs)
                logger.warning(
                    "celery-recovery: Redis unavailable (%s); %s[%s] not run, retried in %ss "
                    "(idempotency key %r)",
                    exc,
                    task.name,
                    request.id,
                    retry_countdown,
                    key,
                )
                postpone(context, task, retry_countdown, f"idempotency lock {key!r} unavailable")
            metrics.lock_acquisition(got.outcome)
            if got.outcome == DONE:
                logger.info(
                    "celery-recovery: %s[%s] key %r already done; returning its result",
                    task.name,
                    request.id,
                    key,
                )
                return kombu_loads(got.result)
            if got.outcome == HELD:
                if on_duplicate == "skip":
                    logger.info(
                        "celery-recovery: %s[%s] skipped: key %r is held by %s",
                        task.name,
                        request.id,
                        key,
                        got.holder,
                    )
                    return None
                postpone(context, task, retry_countdown, f"key {key!r} is held by {got.holder}")
            request.idempotency_key, request.fencing_token = key, got.token
            context.runtime.write(
                WriteKind.TRANSITION,
                Transition(
                    request.id,
                    request.retries + 1,
                    (TaskState.RUNNING,),
                    {"idempotency_key": key, "fencing_token": got.token},
                ),
            )
            reset = _token.set(got.token)
            leases.hold(key, got.value, lock_ttl)
            try:
                result = function(*args, **kwargs)
            except BaseException:
                leases.drop(key)
                _release(locks, key, got.value, None)
                raise
            finally:
                _token.reset(reset)
            leases.drop(key)
            _release(locks, key, got.value, _encode_result(task.name, result))
            return result

        def _release(locks, key, value, result_json):  # type: ignore[no-untyped-def]
            try:
                if not locks.release(key, value, result_json, result_ttl):
                    metrics.lease_lost()
                    logger.warning(
                        "celery-recovery: idempotency lock %r was no longer ours at release "
                        "(lease expired; a newer attempt holds it)",
                        key,
                    )
            except (RedisError, OSError) as exc:
                logger.warning("celery-recovery: could not release %r: %s", key, exc)

        return guarded  # type: ignore[return-value]

    if func is not None:
        return decorate(func)
    return decorate


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
