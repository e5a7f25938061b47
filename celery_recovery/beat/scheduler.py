"""The HA beat scheduler: any number of beats, one leader, every scheduled run sent once.

``celery -A proj beat -S celery_recovery.beat:Scheduler`` (or
``beat_scheduler = "celery_recovery.beat:Scheduler"``) runs the app's
``beat_schedule`` unchanged, or django-celery-beat's models
(``recovery_beat_entries = "django"``, :mod:`.django_entries`).  Each entry's
state is a row in the store, not a local ``celerybeat-schedule`` file.  Only
the beat holding the lease (:mod:`.leadership`) sends; when an entry is due,
its policies (:mod:`.policy`) decide which runs to send and which are missed,
and the ledger (:mod:`.ledger`) claims and sends them.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

from celery import beat as celery_beat

from celery_recovery.beat.entries import Entries, EntryBounds, EntrySource
from celery_recovery.beat.leadership import LEASE, Leadership
from celery_recovery.beat.ledger import RunLedger, iso
from celery_recovery.beat.overlap import previous_run_going
from celery_recovery.beat.policy import EntryPolicy, Overlap, RunPlan, plan_runs, window_start
from celery_recovery.beat.times import due_times, next_after
from celery_recovery.core.audit import AuditReason
from celery_recovery.core.errors import ConfigurationError, StoreError
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.runtime.context import RecoveryContext, context_for_app
from celery_recovery.telemetry import metrics

logger = logging.getLogger("celery_recovery.beat")

#: Runs of one entry sent in one tick at most (``catch_up="all"`` after a long
#: outage); the rest are sent on the next ticks, so the lease is renewed between.
SENDS_PER_TICK = 100


class Scheduler(celery_beat.Scheduler):
    """A ``celery beat`` scheduler whose state is in the celery-recovery store.

    Needs :class:`~celery_recovery.Recovery` installed on the app (in the module
    ``-A`` names).  ``-s``/``beat_schedule_filename`` is ignored: nothing is
    kept on local disk.
    """

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        context = context_for_app(app)
        if context is None:
            raise ConfigurationError(
                "celery_recovery.beat:Scheduler needs celery-recovery installed on the app: "
                "call Recovery(app) in the module that creates it (the one `-A` names)"
            )
        self.context: RecoveryContext = context
        self.leadership = Leadership(
            context.store, context.settings, context.clock, health=context.runtime.health
        )
        self.policies: dict[str, EntryPolicy] = {}
        #: Where the entries come from when not the app's beat_schedule, and their bounds.
        self.source: EntrySource | None = None
        self.bounds: dict[str, EntryBounds] = {}
        self.ledger = RunLedger(context, self.leadership, app, lambda: self.producer)
        self._next: dict[str, tuple[datetime, datetime]] = {}
        #: Entries whose schedule raised, and when to try them again (monotonic).
        self._failing: dict[str, float] = {}
        self._serving = False
        super().__init__(app, *args, **kwargs)

    # -- Celery's hooks ----------------------------------------------------------

    def setup_schedule(self) -> None:
        self.source = entry_source(self.app, self.context.settings)
        if self.source is not None:
            self._use(self.source.load())
            return
        super().setup_schedule()
        window = self.context.settings.beat_catch_up_window
        self.policies = {
            name: EntryPolicy.of(name, entry.options, window)
            for name, entry in self.schedule.items()
        }

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Renew or seek the lead; as leader, send what is due.  Returns seconds to sleep."""
        try:
            return self._tick()
        except StoreError as exc:
            self.context.runtime.health.record_failure(exc, "running the beat schedule")
            self.ledger.rows.clear()
            return self.leadership.renew_every

    def sync(self) -> None:
        """Nothing to write: every decision is in the store when it is taken."""

    def close(self) -> None:
        self.leadership.release()
        super().close()

    @property
    def info(self) -> str:
        return (
            f"    . store -> {self.context.settings.masked_database_url}\n"
            f"    . entries -> {self.context.settings.beat_entries}\n"
            f"    . lead -> lease {LEASE!r}, {self.leadership.ttl:g}s, "
            f"holder {self.leadership.holder}"
        )

    # -- one tick ----------------------------------------------------------------

    def _tick(self) -> float:
        if not self._serving:
            self._serving = True
            _serve_metrics(self.context.settings.metrics_port)
        gained, lost = self.leadership.refresh()
        if lost is not None:
            self.ledger.rows.clear()
            metrics.beat_lead(taken=False)
        if gained:
            metrics.beat_lead(taken=True)
        if not self.leadership.leading:
            return self.leadership.wait() or self.leadership.renew_every
        # Only the leader asks: a standby sends nothing, and reads the changes when it leads.
        if self.source is not None and (changed := self.source.poll()) is not None:
            self._use(changed)
        if gained or set(self.ledger.rows) != set(self.schedule):
            self.ledger.load(self.schedule, gained)
        self.ledger.start_tick()
        soonest = float(self.max_interval)
        for name, entry in list(self.schedule.items()):
            if not self.leadership.may_publish():
                break
            soonest = min(soonest, self._entry_tick(name, entry))
        for name in self.ledger.confirm():
            self._mirror(name)
        recorded = self.ledger.take_recorded()
        if self.source is not None and recorded:
            self.source.record_sent(recorded)
        return max(0.0, min(soonest, self.leadership.wait()))

    def _use(self, entries: Entries) -> None:
        """Run ``entries`` from now on (a source's read); their next times are computed anew."""
        self.schedule = entries.entries
        self.policies, self.bounds = entries.policies, entries.bounds
        self._next.clear()
        self._failing.clear()

    def _entry_tick(self, name: str, entry: Any) -> float:
        """Send what entry ``name`` has due; returns seconds until it is due again."""
        if self._failing.get(name, 0.0) > time.monotonic():
            return float(self.max_interval)
        try:
            return self._entry_due(name, entry)
        except StoreError:
            raise
        except Exception:
            # One entry whose schedule or arguments fail must not stop the others.
            logger.exception(
                "celery-recovery beat: entry %r failed; trying it again in %ss",
                name,
                self.max_interval,
            )
            self._failing[name] = time.monotonic() + self.max_interval
            return float(self.max_interval)

    def _entry_due(self, name: str, entry: Any) -> float:
        row = self.ledger.rows.get(name)
        if row is None:
            return self.leadership.renew_every
        if row.get("pending_task_id"):
            # Sent (or confirmed) now, recorded at the tick's end: decided on the next.
            return 0.0 if self.ledger.send_pending(name, entry) else self.leadership.renew_every
        now = self.context.clock()
        last, bounds = row["last_run_at"], self.bounds.get(name)
        if bounds is not None:
            ended = bounds.ended(row, now)
            if ended is not None:
                if self.source is not None:
                    self.source.finish(name, ended)
                return float(self.max_interval)
            last = bounds.last(last)
        upcoming = self._upcoming(name, entry, last, now)
        if upcoming > now:
            return (upcoming - now).total_seconds()
        return self._decide(name, entry, last, now)

    def _upcoming(self, name: str, entry: Any, last: datetime, now: datetime) -> datetime:
        cached = self._next.get(name)
        if cached is None or cached[0] != last:
            cached = (last, next_after(entry.schedule, last, now))
            self._next[name] = cached
        return cached[1]

    def _decide(self, name: str, entry: Any, last: datetime, now: datetime) -> float:
        """Apply the entry's policies to its due runs after ``last``, claim and send them;
        returns the seconds until the entry should be looked at again."""
        row = self.ledger.rows[name]
        policy = self.policies.get(name) or EntryPolicy.of(
            name, entry.options, self.context.settings.beat_catch_up_window
        )
        due = due_times(entry.schedule, last, now, window_start(policy, now))
        once = name in self.bounds and self.bounds[name].once
        limit = 1 if policy.one_at_a_time or once else SENDS_PER_TICK
        plan = plan_runs(policy, due.listed, now, due.passed, due.passed_last, limit)
        cause = (
            "held behind the previous run (overlap=buffer_one)"
            if policy.overlap is Overlap.BUFFER_ONE
            else "due while no beat sent them"
        )
        why = (
            f"{plan.missed} run(s) up to {iso(plan.missed_at)} not sent: {cause} "
            f"(catch_up={policy.catch_up.value}, window {policy.window:g}s)"
        )
        reason = AuditReason.BEAT_MISSED_RUNS
        if plan.send and policy.one_at_a_time:
            going = previous_run_going(self.context.store, row)
            if going is not None:
                if policy.overlap is Overlap.BUFFER_ONE:
                    return self.leadership.renew_every  # held until the previous run ends
                plan = RunPlan((), plan.missed + 1, plan.send[0])
                reason = AuditReason.BEAT_OVERLAP
                why = (
                    f"the run of {iso(plan.missed_at)} skipped: the previous run "
                    f"{row.get('last_task_id')} is still {going} (overlap=skip)"
                )
        if plan.send:
            done = self.ledger.claim_and_send(name, entry, plan, why, now)
        else:
            done = self.ledger.record_missed(name, entry.task, plan, why, reason, now)
        # Straight on after progress; after a lost claim or a failed send, not before
        # the next renewal (a busy loop would only hammer the store or the broker).
        return 0.0 if done else self.leadership.renew_every

    def _mirror(self, name: str) -> None:
        """Keep on Celery's entry what its own scheduler keeps, for whoever reads it."""
        row, scheduled = self.ledger.rows.get(name), self.schedule.get(name)
        if row is not None and scheduled is not None and row.get("last_sent_run_at"):
            scheduled.last_run_at = row["last_sent_run_at"]
            scheduled.total_run_count = row.get("total_run_count", 0)


def entry_source(app: Any, settings: RecoverySettings) -> EntrySource | None:
    """The source ``recovery_beat_entries`` names; None for the app's ``beat_schedule``."""
    if settings.beat_entries != "django":
        return None
    try:
        # Imported here only: a project without Django never imports it.
        from celery_recovery.beat.django_entries import DjangoEntries
    except ImportError as exc:
        raise ConfigurationError(
            "recovery_beat_entries='django' needs Django and django-celery-beat: "
            f"`pip install django-celery-beat` ({exc})"
        ) from exc
    return DjangoEntries(app, settings.beat_catch_up_window)


def _serve_metrics(port: int | None) -> None:
    if port is None:
        return
    try:
        metrics.serve(port)
    except metrics.MetricsServerError as exc:
        logger.warning("celery-recovery beat: %s; beat runs on without serving metrics", exc)
