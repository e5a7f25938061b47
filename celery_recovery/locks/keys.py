"""Idempotency keys: from a format string over the task's arguments, a callable, or a hash."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from typing import Any

from kombu.utils.json import dumps as kombu_dumps

from celery_recovery.core.errors import ConfigurationError

KeySpec = str | Callable[..., Any] | None


def build_key(
    func: Callable[..., Any],
    spec: KeySpec,
    task_name: str,
    args: tuple,
    kwargs: dict,
    task: Any = None,
) -> str:
    """The idempotency key of one call of ``func`` (the task body) with these arguments.

    ``task`` is the task instance, left out of the hash when the body is bound.
    """
    if spec is None:
        if args and task is not None and args[0] is task:
            args = args[1:]
        payload = kombu_dumps([list(args), kwargs], sort_keys=True)
        return f"{task_name}:{hashlib.sha256(payload.encode()).hexdigest()[:32]}"
    if callable(spec):
        return str(spec(*args, **kwargs))
    bound = inspect.signature(func).bind_partial(*args, **kwargs)
    bound.apply_defaults()
    try:
        return spec.format(**bound.arguments)
    except (KeyError, IndexError) as exc:
        names = ", ".join(n for n in bound.arguments if n != "self")
        raise ConfigurationError(
            f"idempotency_key={spec!r} of task {task_name!r} names {exc} which is not an "
            f"argument of the task; arguments: {names}"
        ) from None
    except (AttributeError, TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"idempotency_key={spec!r} of task {task_name!r} cannot be formatted with this "
            f"call's arguments: {type(exc).__name__}: {exc}"
        ) from None


def check_template(func: Callable[..., Any], spec: KeySpec) -> None:
    """Refuse, at decoration time, a template naming a parameter the function lacks."""
    if not isinstance(spec, str):
        if spec is not None and not callable(spec):
            raise ConfigurationError(
                f"idempotency_key={spec!r} must be a format string, a callable or None"
            )
        return
    import string

    params = inspect.signature(func).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    try:
        parsed = list(string.Formatter().parse(spec))
    except ValueError as exc:
        raise ConfigurationError(
            f"idempotency_key={spec!r} is not a valid format string: {exc}"
        ) from None
    for _, field, _, _ in parsed:
        if field is None:
            continue
        name = field.split(".")[0].split("[")[0]
        if name and name not in params and not accepts_any:
            raise ConfigurationError(
                f"idempotency_key={spec!r} names {name!r}, which is not a parameter of "
                f"{func.__qualname__}; parameters: {', '.join(params)}"
            )
