"""Report a trigger that blocks the triggerer's event loop.

One blocking trigger delays every other trigger in the process, so the
loop stamps a tick every :data:`TICK` seconds and a thread watches the
stamp.  When it is late by more than the threshold, the watchdog names the
asyncio task running at that moment (each trigger runs in a task named
after it) and logs it, then logs the total once the loop is free again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("celery_recovery.triggerer")

#: Seconds between two ticks of a healthy loop.
TICK = 0.05


class LoopWatchdog(threading.Thread):
    """Watches one event loop from a daemon thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        threshold: float,
        on_blocked: Callable[[str, float], None] | None = None,
    ) -> None:
        super().__init__(name="celery-recovery-loop-watchdog", daemon=True)
        self.loop = loop
        self.threshold = threshold
        self.on_blocked = on_blocked
        self.last_tick = time.monotonic()
        self.blocked: list[tuple[str, float]] = []
        self._stop_event = threading.Event()

    async def ticker(self) -> None:
        """Run on the watched loop."""
        while True:
            self.last_tick = time.monotonic()
            await asyncio.sleep(TICK)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        culprit: str | None = None
        blocked_for = 0.0
        while not self._stop_event.wait(TICK):
            late = time.monotonic() - self.last_tick
            if late > self.threshold:
                if culprit is None:
                    task = asyncio.current_task(self.loop)
                    culprit = task.get_name() if task is not None else "the triggerer itself"
                    logger.warning(
                        "celery-recovery: %s has blocked the triggerer's event loop for %.2fs; "
                        "every other trigger waits (use await and asyncio.to_thread for "
                        "blocking work)",
                        culprit,
                        late,
                    )
                blocked_for = late
                continue
            if culprit is not None:
                logger.warning(
                    "celery-recovery: %s blocked the event loop for %.2fs in all",
                    culprit,
                    blocked_for,
                )
                self.blocked.append((culprit, blocked_for))
                if self.on_blocked is not None:
                    self.on_blocked(culprit, blocked_for)
                culprit = None
