"""Report a trigger that blocks the triggerer's event loop.

One blocking trigger delays every other trigger in the process, so the
loop stamps a tick every :data:`TICK` seconds and a thread watches the
stamp.  When it is late by more than the threshold, the watchdog names the
asyncio task running at that moment (each trigger runs in a task named
after it) and logs it, then logs the total once the loop is free again.
A stall may pass from one task to the next without the loop ticking in
between (the claim loop starts a trigger that blocks at once): each task
seen running is named for its own share, so the blocking trigger is not
hidden behind the task that happened to be first.

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
        #: The task blamed for the stall being watched (None when the loop is free),
        #: whether it was reported, and when in the stall it was first seen running
        #: (seconds after the stall's last tick).
        self._culprit: str | None = None
        self._reported = False
        self._culprit_from = 0.0
        #: The tick the watched stall began after.
        self._stall_tick: float | None = None
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
        stalled = late > self.threshold
        running = self._running_task() if stalled else None
        if self._culprit is not None:
            if not stalled or self.last_tick != self._stall_tick:
                # The loop ticked since: the stall is over, and the loop measured it.
                with self._gap_lock:
                    gap = self._longest_gap
                self._close(max(self._seen_late, gap) - self._culprit_from)
            elif running != self._culprit:
                # The culprit let go and another task holds the loop, with no tick between.
                self._close(self._seen_late - self._culprit_from)
                self._culprit_from = self._seen_late
        if not stalled:
            return
        if self._culprit is None:
            if self.last_tick != self._stall_tick:
                self._stall_tick = self.last_tick
                self._culprit_from = 0.0
                with self._gap_lock:
                    self._longest_gap = 0.0  # stalls before this one were reported or small
            self._culprit = running
        self._seen_late = late
        share = late - self._culprit_from
        if not self._reported and share > self.threshold:
            self._reported = True
            logger.warning(
                "celery-recovery: %s has blocked the triggerer's event loop for %.2fs; "
                "every other trigger waits (use await and asyncio.to_thread for "
                "blocking work)",
                self._culprit,
                share,
            )

    def _running_task(self) -> str:
        """The name of the asyncio task the loop is running now."""
        task = asyncio.current_task(self.loop)
        return task.get_name() if task is not None else "the triggerer itself"

    def _close(self, blocked_for: float) -> None:
        """The culprit let go of the loop after ``blocked_for`` seconds of its own."""
        culprit, reported = self._culprit, self._reported
        self._culprit, self._reported = None, False
        if not reported or culprit is None:
            return  # its own share stayed under the threshold
        logger.warning(
            "celery-recovery: %s blocked the event loop for %.2fs in all", culprit, blocked_for
        )
        self.blocked.append((culprit, blocked_for))
        if self.on_blocked is not None:
            self.on_blocked(culprit, blocked_for)
