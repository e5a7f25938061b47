"""Tasks and queues celery-recovery leaves alone (``recovery_exclude_tasks`` and
``recovery_exclude_queues``): they record nothing and are never recovered.

Looked up on the hot path (every publish, delivery and outcome), so each name
is matched once and the answer kept: a task name or routing key costs a dict
look-up after its first message.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from typing import Any

#: More distinct names than this (routing keys made per tenant, say) are matched again
#: rather than kept.
_CACHE_LIMIT = 10_000


class _Patterns:
    def __init__(self, patterns: Iterable[str]) -> None:
        patterns = tuple(patterns)
        self._regex = (
            re.compile("|".join(fnmatch.translate(p) for p in patterns)) if patterns else None
        )
        self._seen: dict[str, bool] = {}

    def __bool__(self) -> bool:
        return self._regex is not None

    def match(self, name: str | None) -> bool:
        if self._regex is None or not name:
            return False
        found = self._seen.get(name)
        if found is None:
            found = self._regex.match(name) is not None
            if len(self._seen) < _CACHE_LIMIT:
                self._seen[name] = found
        return found


class Exclusions:
    """The excluded task names and queues of one installation."""

    def __init__(self, tasks: Iterable[str] = (), queues: Iterable[str] = ()) -> None:
        self.tasks = _Patterns(tasks)
        self.queues = _Patterns(queues)

    def __bool__(self) -> bool:
        """Whether anything is excluded at all (checked first, so that nothing else is)."""
        return bool(self.tasks) or bool(self.queues)

    def message(self, task_name: str | None, queues: Iterable[str | None] = ()) -> bool:
        """Whether a message of ``task_name`` routed to any of ``queues`` is left alone."""
        if self.tasks.match(task_name):
            return True
        return bool(self.queues) and any(self.queues.match(q) for q in queues)

    def request(self, task_name: str | None, request: Any) -> bool:
        """Whether a delivery (a Celery request or task request context) is left alone."""
        info = getattr(request, "delivery_info", None) or {}
        return self.message(task_name, (info.get("routing_key"),))
