"""Triggers the triggerer tests defer to (importable by the triggerer under ``tests``)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from celery_recovery import BaseTrigger, TaskSuccessEvent, TriggerEvent
from celery_recovery.core.timeutils import as_utc, utcnow


class Sleep(BaseTrigger):
    """Fires at ``until`` with the triggerer's pid; optionally blocks the loop first."""

    def __init__(
        self,
        until: str,
        queue: str = "default",
        end: bool = False,
        block: float = 0.0,
        ledger: str | None = None,
    ) -> None:
        self.until = until
        self.queue = queue  # type: ignore[misc]
        self.end = end
        self.block = block
        self.ledger = ledger

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return "tests.apps.triggers.Sleep", {
            "until": self.until,
            "queue": self.queue,
            "end": self.end,
            "block": self.block,
            "ledger": self.ledger,
        }

    async def run(self):  # type: ignore[no-untyped-def]
        left = (as_utc(self.until) - utcnow()).total_seconds()
        await asyncio.sleep(max(left, 0))
        if self.block:
            time.sleep(self.block)  # a badly written trigger, on purpose
        payload = {"pid": os.getpid(), "queue": self.queue}
        if self.ledger:
            with open(self.ledger, "a") as handle:
                handle.write(f"fired pid={os.getpid()}\n")
        yield TaskSuccessEvent(payload) if self.end else TriggerEvent(payload)


class Explodes(BaseTrigger):
    def serialize(self) -> tuple[str, dict[str, Any]]:
        return "tests.apps.triggers.Explodes", {}

    async def run(self):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        raise RuntimeError("the trigger exploded")
        yield  # pragma: no cover


class Never(BaseTrigger):
    def serialize(self) -> tuple[str, dict[str, Any]]:
        return "tests.apps.triggers.Never", {}

    async def run(self):  # type: ignore[no-untyped-def]
        await asyncio.Event().wait()
        yield  # pragma: no cover


class Missing(BaseTrigger):
    """Serializes to a class path that cannot be imported."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return "tests.apps.no_such_module.Gone", {}


class NotJson(BaseTrigger):
    def serialize(self) -> tuple[str, dict[str, Any]]:
        return "tests.apps.triggers.NotJson", {"when": object()}


def due_in(seconds: float) -> str:
    from datetime import timedelta

    return (utcnow() + timedelta(seconds=seconds)).isoformat()
