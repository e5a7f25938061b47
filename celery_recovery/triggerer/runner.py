"""The triggerer process: one asyncio loop running many deferred tasks' triggers.

It is a ``triggerer`` job with a heartbeat.  Every poll it claims triggers of
its queues that no live triggerer holds (unassigned ones, and those of
triggerers silent for ``recovery_health_check_threshold``) up to its
capacity, runs each as an asyncio task, and hands the events to
:class:`~celery_recovery.triggerer.outcomes.OutcomeApplier`, a batch at a
time, in a thread.  It also notices triggers that another triggerer took
from it (after a pause longer than the threshold) and stops running them.
On SIGTERM or SIGINT it stops claiming, cancels its triggers, records the
events already produced, gives its remaining triggers back for any other
triggerer to claim at once, and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from celery_recovery.core.errors import StoreError
from celery_recovery.core.records import TriggerRow
from celery_recovery.core.states import JobState, JobType
from celery_recovery.core.timeutils import utcnow
from celery_recovery.telemetry import metrics, sentry
from celery_recovery.triggerer.outcomes import (
    Outcome,
    OutcomeApplier,
    crashed,
    failure,
    from_event,
    stored,
    timed_out,
)
from celery_recovery.triggerer.watchdog import LoopWatchdog
from celery_recovery.triggers.base import DEFAULT_TRIGGER_QUEUE
from celery_recovery.triggers.loading import TriggerLoadError, allowed_prefixes, load_trigger

if TYPE_CHECKING:
    from celery_recovery.runtime.context import RecoveryContext

logger = logging.getLogger("celery_recovery.triggerer")

#: Seconds between two claims.
POLL_INTERVAL = 1.0
#: Most triggers taken in one claim (one short transaction).
CLAIM_BATCH = 5000
#: Most events recorded in one batch.
EVENT_BATCH = 1000
#: Seconds a shutdown waits for the events already produced to be recorded.
SHUTDOWN_GRACE = 5.0
#: Event-loop delay, in seconds, that is reported as a blocking trigger.
BLOCK_THRESHOLD = 0.2


class Triggerer:
    """Runs triggers for one installed app until :meth:`stop`."""

    def __init__(
        self,
        context: RecoveryContext,
        queues: Sequence[str] = (DEFAULT_TRIGGER_QUEUE,),
        capacity: int | None = None,
        poll_interval: float = POLL_INTERVAL,
        metrics_port: int | None = None,
    ) -> None:
        self.context = context
        self.app = context.app
        self.queues = tuple(queues)
        self.capacity = capacity or context.settings.triggerer_capacity
        self.poll_interval = poll_interval
        self.metrics_port = metrics_port
        self.applier = OutcomeApplier(context)
        self.prefixes = allowed_prefixes(self.app, context.settings.trigger_allowed_modules)
        self.running: dict[int, asyncio.Task[None]] = {}
        self._events: asyncio.Queue[Outcome] = asyncio.Queue()
        self._unrecorded: list[Outcome] = []
        self._stopping: asyncio.Event | None = None
        #: Set to claim at once: a stop, or a dead triggerer's triggers to take.
        self._woken: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.watchdog: LoopWatchdog | None = None

    # -- lifecycle -------------------------------------------------------------

    def run(self) -> None:
        """Run until SIGTERM/SIGINT (or :meth:`stop`); blocks."""
        asyncio.run(self.main())

    def stop(self) -> None:
        """Ask the triggerer to shut down (thread-safe)."""
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stop_now)

    def wake(self) -> None:
        """Claim now rather than at the next poll (thread-safe): another triggerer was just
        found dead, and its triggers are free."""
        if self._loop is not None and self._woken is not None:
            self._loop.call_soon_threadsafe(self._woken.set)

    def _stop_now(self) -> None:
        assert self._stopping is not None and self._woken is not None
        self._stopping.set()
        self._woken.set()

    async def main(self) -> None:
        self._loop = asyncio.get_running_loop()
        current = asyncio.current_task()
        if current is not None:
            # The watchdog names the running task: "Task-1" would tell an operator nothing.
            current.set_name("the triggerer's claim loop")
        self._stopping = asyncio.Event()
        self._woken = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                self._loop.add_signal_handler(signum, self._stop_now)
        runtime = self.context.runtime
        runtime.start_job(JobType.TRIGGERER, queues=",".join(self.queues))
        logger.info(
            "celery-recovery: triggerer job %s serving queues %s, capacity %d",
            runtime.job_id,
            ",".join(self.queues),
            self.capacity,
        )
        settings = self.context.settings
        port = self.metrics_port or settings.metrics_port
        if port:
            metrics.serve(port)
        self.watchdog = LoopWatchdog(
            self._loop, BLOCK_THRESHOLD, on_blocked=lambda *_: metrics.blocked_loop()
        )
        self.watchdog.start()
        ticker = asyncio.create_task(self.watchdog.ticker(), name="triggerer watchdog tick")
        recorder = asyncio.create_task(self._record_events(), name="triggerer event recorder")
        try:
            while not self._stopping.is_set():
                full = await self._claim_round()
                self._report()
                if full:
                    continue  # more may be waiting: claim again at once
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._woken.wait(), self.poll_interval)
                self._woken.clear()
        finally:
            await self._shut_down(recorder)
            ticker.cancel()
            self.watchdog.stop()

    async def _shut_down(self, recorder: asyncio.Task[None]) -> None:
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Record the events already produced, then stop the recorder.
        deadline = time.monotonic() + SHUTDOWN_GRACE
        while (not self._events.empty() or self._unrecorded) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        recorder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await recorder
        owner = self.context.runtime.job_id
        if owner is not None:
            try:
                released = await asyncio.to_thread(
                    self.context.store.triggers.release_triggers, owner
                )
                logger.info("celery-recovery: triggerer released %d triggers", released)
            except StoreError as exc:
                logger.warning(
                    "celery-recovery: could not release triggers (%s); they move to another "
                    "triggerer after recovery_health_check_threshold",
                    exc,
                )
        if owner is not None:
            metrics.triggerer_stopped(owner)
        await asyncio.to_thread(self.context.runtime.stop_job, JobState.SUCCESS)

    def _report(self) -> None:
        owner = self.context.runtime.job_id
        if owner is not None:
            metrics.triggers_running(owner, len(self.running))
        sentry.triggerer_checkin(self.context.settings)

    # -- claiming --------------------------------------------------------------

    async def _claim_round(self) -> bool:
        """Drop triggers taken by others, claim new ones; True when a claim came back full."""
        runtime = self.context.runtime
        heartbeat = runtime.heartbeat
        owner = runtime.job_id
        if heartbeat is None or not heartbeat.registered or owner is None:
            return False  # not a known job yet: others could not tell we are alive
        store = self.context.store
        try:
            held = await asyncio.to_thread(store.triggers.held_trigger_ids, owner)
            self._drop_lost(held)
            free = min(self.capacity - len(self.running), CLAIM_BATCH)
            if free <= 0 or self._stopping is None or self._stopping.is_set():
                return False
            rows = await asyncio.to_thread(
                store.triggers.claim_triggers,
                owner,
                self.queues,
                free,
                utcnow(),
                self.context.settings.health_check_threshold,
            )
        except StoreError as exc:
            runtime.health.record_failure(exc, "claiming triggers")
            return False
        for row in rows:
            self._start(row)
        return len(rows) == free and free == CLAIM_BATCH

    def _drop_lost(self, held: set[int]) -> None:
        for trigger_id, task in list(self.running.items()):
            if trigger_id not in held and not task.done():
                logger.warning(
                    "celery-recovery: trigger %s was taken over by another triggerer "
                    "(this one was silent past the threshold); stopping it here",
                    trigger_id,
                )
                task.cancel()
                self.running.pop(trigger_id, None)

    def _start(self, row: TriggerRow) -> None:
        trigger_id = int(row["id"])
        if trigger_id in self.running:
            return
        if row.get("fired_at") is not None:
            # Fired by a triggerer that died before finishing it: finish it from the
            # stored event, without running the trigger again.
            self.running[trigger_id] = asyncio.create_task(self._emit(stored(row)))
            return
        name = f"trigger {trigger_id} ({row['classpath']}) of task {row['task_id']}"
        self.running[trigger_id] = asyncio.create_task(self._run_trigger(row), name=name)

    async def _emit(self, outcome: Outcome) -> None:
        self._events.put_nowait(outcome)

    # -- running one trigger ---------------------------------------------------------

    async def _run_trigger(self, row: TriggerRow) -> None:
        try:
            trigger = load_trigger(row["classpath"], row["kwargs"], self.prefixes)
        except TriggerLoadError as exc:
            logger.warning("celery-recovery: trigger %s fails its task: %s", row["id"], exc)
            self._events.put_nowait(failure(row, str(exc)))
            return
        trigger.app = self.app
        outcome = await self._first_event(row, trigger)
        with contextlib.suppress(Exception):
            await trigger.cleanup()
        self._events.put_nowait(outcome)

    async def _first_event(self, row: TriggerRow, trigger: Any) -> Outcome:
        deadline = None
        timeout_at = row.get("timeout_at")
        if timeout_at is not None:
            left = (timeout_at - utcnow()).total_seconds()
            deadline = asyncio.get_running_loop().time() + left
        events = None
        try:
            async with asyncio.timeout_at(deadline) as scope:
                events = trigger.run()
                try:
                    event = await events.__anext__()
                except StopAsyncIteration:
                    return failure(row, "the trigger's run() ended without yielding an event")
            return from_event(row, event)
        except TimeoutError:
            return timed_out(row) if scope.expired() else crashed(row)
        except Exception:
            return crashed(row)
        finally:
            if events is not None and hasattr(events, "aclose"):
                with contextlib.suppress(Exception):
                    await events.aclose()

    # -- recording events -------------------------------------------------------------

    async def _record_events(self) -> None:
        while True:
            if self._unrecorded:
                batch, self._unrecorded = self._unrecorded, []
            else:
                batch = [await self._events.get()]
            while len(batch) < EVENT_BATCH and not self._events.empty():
                batch.append(self._events.get_nowait())
            owner = self.context.runtime.job_id
            try:
                await asyncio.to_thread(self.applier.apply, owner or "", batch)
            except StoreError as exc:
                self.context.runtime.health.record_failure(exc, "recording trigger events")
                # Kept in memory and recorded again later; a fired row keeps its first event.
                self._unrecorded = batch
                await asyncio.sleep(self.poll_interval)
                continue
            except Exception:
                logger.exception("celery-recovery: recording %d trigger events failed", len(batch))
                self._unrecorded = batch
                await asyncio.sleep(self.poll_interval)
                continue
            # Finished, moved to another triggerer, or given back to be finished later.
            for outcome in batch:
                self.running.pop(outcome.trigger_id, None)
            if owner is not None:
                metrics.triggers_running(owner, len(self.running))
