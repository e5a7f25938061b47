"""Keep a bug in a handler from ever reaching Celery or flooding its log."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from celery_recovery.core.log_once import LogOnce

logger = logging.getLogger("celery_recovery.signals")

F = TypeVar("F", bound=Callable[..., Any])

_failures = LogOnce()


def never_raises(handler: F) -> F:
    """Log the first unexpected error of ``handler`` with its traceback, later ones at debug."""
    name = handler.__qualname__

    @functools.wraps(handler)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return handler(*args, **kwargs)
        except Exception:
            handler_failed(name)
            return None

    return wrapper  # type: ignore[return-value]


def handler_failed(name: str) -> None:
    """Log the exception being handled, raised by handler ``name``: the first time with
    its traceback, later ones at debug.

    The handlers every task runs call it from their own ``except`` instead of being
    wrapped by :func:`never_raises`: Celery calls a receiver with keyword arguments,
    and a wrapper taking ``**kwargs`` and passing them on packs and unpacks them once
    more, a sixth of what a signal's dispatch costs (docs/performance.md).
    """
    if _failures.first(name):
        logger.exception(
            "celery-recovery: handler %s failed; the task is not affected "
            "(further failures of this handler are logged at debug level)",
            name,
        )
    else:
        logger.debug("celery-recovery: %s failed again", name, exc_info=True)
