"""The HA beat scheduler: any number of beats, one leader, every scheduled run sent once.

``celery -A proj beat -S celery_recovery.beat:Scheduler`` (or
``beat_scheduler = "celery_recovery.beat:Scheduler"``) runs the app's
``beat_schedule`` unchanged.  Each entry's state is a row in the store, not a
local ``celerybeat-schedule`` file.  Only the beat holding the lease
(:mod:`.leadership`) sends; for every run it:

1. claims (entry, scheduled time) in the store, in one compare-and-set that also
   checks its lease and token;
2. publishes, outside any transaction, with the task id derived from the pair;
3. records the run sent.

A run claimed and never confirmed sent (a failed publish, a leader killed or
paused between 1 and 3) is sent with the same task id by the next leader, or by
this one on its next tick.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any

from celery import beat as celery_beat

from celery_recovery import metrics
from celery_recovery.beat.leadership import LEASE, Leadership
from celery_recovery.beat.policy import ON_TIME, EntryPolicy, RunPlan, plan_runs, window_start
from celery_recovery.beat.publish import run_task_id, send_run
from celery_recovery.beat.times import due_times, next_after
from celery_recovery.context import RecoveryContext, context_for_app
from celery_recovery.core.audit import AuditAction, AuditReason, Decision, beat_decision
from celery_recovery.core.errors import ConfigurationError, StoreError
from celery_recovery.core.records import BeatEntryRow
from celery_recovery.resends import sending_again

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
        self.leadership = Leadership(context.store, context.settings, context.clock)
        self.policies: dict[str, EntryPolicy] = {}
        self._rows: dict[str, BeatEntryRow] = {}
        self._next: dict[str, tuple[datetime, datetime]] = {}
        self._unconfirmed: dict[str, str] = {}
        self._serving = False
        super().__init__(app, *args, **kwargs)

    # -- Celery's hooks ----------------------------------------------------------

    def setup_schedule(self) -> None:
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
            logger.warning("celery-recovery beat: store error, trying again: %s", exc)
            self._rows.clear()
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
            self._rows.clear()
            metrics.beat_lead(taken=False)
        if gained:
            metrics.beat_lead(taken=True)
        if not self.leadership.leading:
            return self.leadership.wait() or self.leadership.renew_every
        if gained or set(self._rows) != set(self.schedule):
            self._load(gained)
        soonest = float(self.max_interval)
        for name, entry in list(self.schedule.items()):
            if not self.leadership.may_publish():
                break
            soonest = min(soonest, self._entry_tick(name, entry))
        return max(0.0, min(soonest, self.leadership.wait()))

    def _load(self, gained: bool) -> None:
        """Register this beat's entries and read their rows (on taking the lead)."""
        store = self.context.store
        now = self.context.clock()
        store.beat.register_entries(
            [
                {"name": name, "task": entry.task, "schedule": str(entry.schedule)}
                for name, entry in self.schedule.items()
            ],
            anchor=now,
        )
        self._rows = {row["name"]: row for row in store.beat.entries(list(self.schedule))}
        if gained:
            store.beat.record(
                beat_decision(
                    AuditAction.BEAT_LEAD_TAKEN,
                    AuditReason.BEAT_LEADER_GONE,
                    LEASE,
                    None,
                    None,
                    f"{self.leadership.holder} leads with fencing token {self.leadership.token}",
                    now,
                )
            )

    def _entry_tick(self, name: str, entry: Any) -> float:
        """Send what entry ``name`` has due; returns seconds until it is due again."""
        row = self._rows.get(name)
        if row is None:
            return self.leadership.renew_every
        if row.get("pending_task_id"):
            if not self._send_pending(name, entry, row):
                return self.leadership.renew_every
            row = self._rows[name]
        now = self.context.clock()
        upcoming = self._upcoming(name, entry, row["last_run_at"], now)
        if upcoming > now:
            return (upcoming - now).total_seconds()
        self._decide(name, entry, row, now)
        return 0.0

    def _upcoming(self, name: str, entry: Any, last: datetime, now: datetime) -> datetime:
        cached = self._next.get(name)
        if cached is None or cached[0] != last:
            try:
                cached = (last, next_after(entry.schedule, last, now))
            except Exception:
                logger.exception(
                    "celery-recovery beat: cannot compute the next run of %r; trying again in %ss",
                    name,
                    self.max_interval,
                )
                return now + timedelta(seconds=self.max_interval)
            self._next[name] = cached
        return cached[1]

    def _decide(self, name: str, entry: Any, row: BeatEntryRow, now: datetime) -> None:
        """Apply the entry's catch-up policy to its due runs, claim and send them."""
        policy = self.policies.get(name) or EntryPolicy.of(
            name, entry.options, self.context.settings.beat_catch_up_window
        )
        due = due_times(entry.schedule, row["last_run_at"], now, window_start(policy, now))
        plan = plan_runs(policy, due.listed, now, due.passed, due.passed_last, SENDS_PER_TICK)
        why = (
            f"{plan.missed} run(s) up to {plan.missed_at.isoformat() if plan.missed_at else '-'}"
            f" fell due while no beat sent them (catch_up={policy.catch_up.value}, "
            f"window {policy.window:g}s)"
        )
        store = self.context.store
        if not plan.send:
            if not plan.missed:
                return
            won = store.beat.claim_run(
                name, row["last_run_at"], None, None, self.leadership.fence, now,
                plan.missed, plan.missed_at, why,
                self._catch_up_decisions(name, entry.task, plan, why, now),
            )  # fmt: skip
            self._after_claim(name, won)
            if won:
                metrics.beat_runs("missed", plan.missed)
                logger.warning("celery-recovery beat: %s: %s", name, why)
            return
        for index, run_at in enumerate(plan.send):
            if not self.leadership.may_publish():
                return
            task_id = run_task_id(name, run_at)
            first = index == 0
            decisions = self._catch_up_decisions(name, entry.task, plan, why, now) if first else []
            won = store.beat.claim_run(
                name, self._rows[name]["last_run_at"], run_at, task_id, self.leadership.fence,
                self.context.clock(), plan.missed if first else 0,
                plan.missed_at if first else None, why if first and plan.missed else None,
                decisions,
            )  # fmt: skip
            self._after_claim(name, won)
            if won and first and plan.missed:
                metrics.beat_runs("missed", plan.missed)
                logger.warning("celery-recovery beat: %s: %s", name, why)
            late = (now - run_at).total_seconds() > ON_TIME
            if not won or not self._send(name, entry, self._rows[name], "late" if late else "sent"):
                return

    @staticmethod
    def _catch_up_decisions(
        name: str, task: str, plan: RunPlan, why: str, now: datetime
    ) -> list[Decision]:
        """Audit rows for one pass over an entry: late runs sent, and runs missed."""
        decisions = []
        late = [t for t in plan.send if (now - t).total_seconds() > ON_TIME]
        if late:
            decisions.append(
                beat_decision(
                    AuditAction.BEAT_CAUGHT_UP,
                    AuditReason.BEAT_MISSED_RUNS,
                    name,
                    task,
                    None,
                    f"sending {len(late)} late run(s) scheduled from {late[0].isoformat()} "
                    f"to {late[-1].isoformat()}",
                    now,
                )
            )
        if plan.missed:
            decisions.append(
                beat_decision(
                    AuditAction.BEAT_SKIPPED,
                    AuditReason.BEAT_MISSED_RUNS,
                    name,
                    task,
                    None,
                    why,
                    now,
                )
            )
        return decisions

    def _after_claim(self, name: str, won: bool) -> None:
        """Read the entry's row again: what was just claimed, or what another beat did."""
        row = self.context.store.beat.entry(name)
        if row is None:
            self._rows.pop(name, None)
        else:
            self._rows[name] = row
        if not won:
            logger.debug("celery-recovery beat: %s: claim lost (moved on, or lead lost)", name)

    def _send_pending(self, name: str, entry: Any, row: BeatEntryRow) -> bool:
        """Send (or confirm) the entry's claimed, unsent run; True once it is confirmed.

        A run another leader claimed may have been sent just before that leader died:
        when the store holds the publish record of its task id, it was, and is only
        confirmed; otherwise it is sent again marked as a possible copy
        (:func:`~celery_recovery.resends.sending_again`), which a worker drops if
        the first copy already ran or runs.
        """
        task_id = str(row["pending_task_id"])
        fence = self.leadership.fence
        if row.get("pending_token") == fence.token:
            return self._send(name, entry, row)
        store = self.context.store
        sent_before = bool(store.tries.history(task_id))
        decision = beat_decision(
            AuditAction.BEAT_RESENT,
            AuditReason.BEAT_UNSENT_CLAIM,
            name,
            entry.task,
            task_id,
            f"the run of {_iso(row.get('pending_run_at'))} was claimed with token "
            f"{row.get('pending_token')} and never confirmed sent; "
            + ("its publish is recorded: confirmed" if sent_before else "sending it again"),
        )
        won = store.beat.adopt_pending(
            name, task_id, row.get("pending_token"), fence, self.context.clock(), decision
        )
        self._after_claim(name, won)
        if not won:
            return False
        if sent_before:
            self._unconfirmed[name] = task_id
        outcome = "confirmed" if sent_before else "resent"
        return self._send(name, entry, self._rows[name], outcome, again=True)

    def _send(
        self, name: str, entry: Any, row: BeatEntryRow, outcome: str = "sent", again: bool = False
    ) -> bool:
        """Publish the claimed run ``row`` holds and record it sent; True once recorded."""
        task_id, run_at = str(row["pending_task_id"]), row.get("pending_run_at")
        if run_at is None:
            return False
        if self._unconfirmed.get(name) != task_id:
            if not self.leadership.may_publish():
                return False
            logger.info(
                "celery-recovery beat: sending %s (%s) scheduled at %s as %s%s",
                name,
                entry.task,
                _iso(run_at),
                task_id,
                " (again)" if again else "",
            )
            try:
                with sending_again() if again else nullcontext():
                    send_run(self.app, entry, task_id, run_at, self.producer)
            except Exception:
                logger.exception(
                    "celery-recovery beat: could not send %s as %s; trying again", name, task_id
                )
                return False
            self._unconfirmed[name] = task_id
            # The publish record is what tells the next leader this run was sent.
            self.context.runtime.writer.flush(timeout=2.0)
        token = self.leadership.token
        if token is None:
            return False
        if not self.context.store.beat.mark_sent(name, task_id, token, self.context.clock()):
            self._unconfirmed.pop(name, None)
            self._after_claim(name, False)
            return False
        self._unconfirmed.pop(name, None)
        self._after_claim(name, True)
        metrics.beat_runs(outcome)
        scheduled = self.schedule.get(name)
        if scheduled is not None:
            # What Celery's own scheduler keeps on its entries, for whoever reads them.
            scheduled.last_run_at = run_at
            scheduled.total_run_count = self._rows[name].get("total_run_count", 0)
        return True


def _serve_metrics(port: int | None) -> None:
    if port is None:
        return
    try:
        metrics.serve(port)
    except metrics.MetricsServerError as exc:
        logger.warning("celery-recovery beat: %s; beat runs on without serving metrics", exc)


def _iso(value: datetime | None) -> str:
    return value.isoformat() if value is not None else "-"
