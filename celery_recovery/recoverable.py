"""``@recoverable``: marks a task whose side effects must not repeat on re-delivery.

This release records the idempotency key template and passes the function
through unchanged; the Redis lock with fencing tokens arrives with the
idempotency-locks work (see the project's issue tracker).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])


@overload
def recoverable(func: F) -> F: ...


@overload
def recoverable(
    func: None = None,
    *,
    idempotency_key: str | Callable[..., str] | None = None,
    lock_ttl: float = 60.0,
    result_ttl: float = 86400.0,
) -> Callable[[F], F]: ...


def recoverable(
    func: F | None = None,
    *,
    idempotency_key: str | Callable[..., str] | None = None,
    lock_ttl: float = 60.0,
    result_ttl: float = 86400.0,
) -> F | Callable[[F], F]:
    """Mark a task function as recoverable; use it under ``@app.task``.

    ``idempotency_key`` is a format string over the task's arguments or a
    callable; ``lock_ttl`` and ``result_ttl`` are seconds.  For now the
    function is returned as it is, with these options attached as
    ``__recoverable__``.
    """

    def mark(function: F) -> F:
        function.__recoverable__ = {  # type: ignore[attr-defined]
            "idempotency_key": idempotency_key,
            "lock_ttl": lock_ttl,
            "result_ttl": result_ttl,
        }
        return function

    if func is not None:
        return mark(func)
    return mark
