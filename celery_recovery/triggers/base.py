"""The trigger interface and the events a trigger yields.

A trigger is a small object that can be rebuilt from JSON (``serialize()``
returns its class path and keyword arguments) and whose ``run()`` is an async
generator: the first event it yields decides what happens to the deferred task.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar

#: Queue of a trigger that does not choose one.
DEFAULT_TRIGGER_QUEUE = "default"


@dataclass(frozen=True)
class TriggerEvent:
    """Resume the task on a worker, in its ``method_name(event)``, with ``payload``."""

    payload: Any = None


@dataclass(frozen=True)
class TaskSuccessEvent:
    """Complete the task with ``value`` as its result, with no worker involved."""

    value: Any = None


@dataclass(frozen=True)
class TaskFailedEvent:
    """Fail the task with ``error`` (its failure callbacks run)."""

    error: str = "the trigger reported a failure"


Event = TriggerEvent | TaskSuccessEvent | TaskFailedEvent


class BaseTrigger:
    """Base class of triggers.

    Subclasses implement :meth:`serialize` (import path of the class and the JSON
    keyword arguments that rebuild it) and :meth:`run`, an ``async`` generator
    that awaits the condition and yields one event.  ``run`` must never block
    the event loop: use ``await asyncio.sleep()`` and ``asyncio.to_thread()``
    for blocking calls.  Set ``queue`` (class or instance attribute) to keep a
    trigger on the triggerers started with ``--queues`` naming it.
    """

    queue: ClassVar[str] = DEFAULT_TRIGGER_QUEUE
    #: The Celery app of the triggerer running this trigger (set before ``run``).
    app: Any = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__} must implement serialize()")

    def run(self) -> AsyncIterator[Event]:
        raise NotImplementedError(f"{type(self).__name__} must implement run()")

    async def cleanup(self) -> None:
        """Called when the trigger stops, fired or not (cancelled, moved, shut down)."""

    def __repr__(self) -> str:
        try:
            path, kwargs = self.serialize()
        except Exception:  # a repr must never raise
            return f"<{type(self).__name__}>"
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        return f"<{path}({args})>"


def classpath_of(cls: type) -> str:
    """The import path the triggerer uses to rebuild an instance of ``cls``."""
    return f"{cls.__module__}.{cls.__qualname__}"
