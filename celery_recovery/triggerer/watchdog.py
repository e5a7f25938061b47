"""Report a trigger that blocks the triggerer's event loop.

One blocking trigger delays every other trigger in the process, so the
loop stamps a tick every :data:`TICK` seconds and a thread watches the
stamp.  When it is late by more than the threshold, the watchdog names the
asyncio task running at that moment (each trigger runs in a task named
after it) and logs it, then logs the total once the loop is free again.

The total is measured by the loop itself (the gap between two ticks), not
by the watching thread: on a busy machine that thread may not be scheduled
again until well after the loop is free, and its last look would
understate the block.
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
        self._culprit: str | None = None
        self._seen_late = 0.0
        self._longest_gap = 0.0
        self._gap_lock = threading.Lock()

    async def ticker(self) -> None:
        """Run on the watched loop."""
        while True:
            self.tick(time.monotonic())
            await asyncio.sleep(TICK)

    def tick(self, now: float) -> None:
        """Stamp the loop as alive at ``now``, keeping the longest stall seen."""
        stalled = now - self.last_tick - TICK
        with self._gap_lock:
            if stalled > self._longest_gap:
                self._longest_gap = stalled
        self.last_tick = now

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(TICK):
            self.look(time.monotonic())

    def look(self, now: float) -> None:
        """One look at the loop from the watching thread."""
        late = now - self.last_tick
        if late > self.threshold:
            if self._culprit is None:
                task = asyncio.current_task(self.loop)
                self._culprit = task.get_name() if task is not None else "the triggerer itself"
                with self._gap_lock:
                    self._longest_gap = 0.0  # stalls before this one were reported or small
                logger.warning(
                    "celery-recovery: %s has blocked the triggerer's event loop for %.2fs; "
                    "every other trigger waits (use await and asyncio.to_thread for "
                    "blocking work)",
                    self._culprit,
                    late,
                )
            self._seen_late = late
            return
        if self._culprit is None:
            return
        with self._gap_lock:
            blocked_for = max(self._seen_late, self._longest_gap)
        culprit, self._culprit = self._culprit, None
        logger.warning(
            "celery-recovery: %s blocked the event loop for %.2fs in all", culprit, blocked_for
        )
        self.blocked.append((culprit, blocked_for))
        if self.on_blocked is not None:
            self.on_blocked(culprit, blocked_for)
