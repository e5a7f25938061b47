"""The leader's book of runs: each entry's row, and every claim, send and confirmation.

For every run the leader

1. claims (entry, scheduled time) in the store, in one compare-and-set that also
   checks its lease and token;
2. publishes, outside any transaction, with the task id derived from the pair;
3. once every run of the tick is published, flushes their publish records to the
   store, then records them sent, in one transaction.

A run claimed and never confirmed sent (a failed publish, a leader killed or
paused between 1 and 3) is taken over by the next leader: confirmed when the
store holds its publish record (the publish happened), else sent again under
the same task id marked as a possible copy
(:func:`~celery_recovery.messages.resends.sending_again`), which a worker drops if the
first copy already ran or runs.  The same leader retries its own on its next
tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from celery_recovery.beat.leadership import LEASE, Leadership
from celery_recovery.beat.policy import ON_TIME, RunPlan
from celery_recovery.beat.publish import run_task_id, send_run
from celery_recovery.core.audit import AuditAction, AuditReason, Decision, beat_decision
from celery_recovery.core.records import BeatEntryRow
from celery_recovery.messages.resends import sending_again
from celery_recovery.runtime.context import RecoveryContext
from celery_recovery.telemetry import metrics

logger = logging.getLogger("celery_recovery.beat")


class RunLedger:
    """This beat's copy of the entries' rows, changed only through the store."""

    def __init__(
        self,
        context: RecoveryContext,
        leadership: Leadership,
        app: Any,
        producer: Callable[[], Any],
    ) -> None:
        self.context = context
        self.leadership = leadership
        self.app = app
        self.producer = producer
        self.rows: dict[str, BeatEntryRow] = {}
        #: Runs this process published and has not yet recorded sent (the record
        #: failed): recorded on the next tick, never published again.
        self._unconfirmed: dict[str, str] = {}
        #: Runs published in this tick, to record sent at its end: (name, task id, outcome).
        self._sent: list[tuple[str, str, str]] = []
        #: Rows of the runs recorded sent since :meth:`take_recorded` was last called.
        self._recorded: list[BeatEntryRow] = []

    def load(self, entries: Mapping[str, Any], gained: bool) -> None:
        """Register ``entries`` (new ones start now) and read every row."""
        store = self.context.store
        now = self.context.clock()
        store.beat.register_entries(
            [
                {"name": name, "task": entry.task, "schedule": str(entry.schedule)}
                for name, entry in entries.items()
            ],
            anchor=now,
        )
        # All rows, filtered here: a list of names as large as the schedule would
        # exceed SQLite's bound parameters.
        self.rows = {r["name"]: r for r in store.beat.entries() if r["name"] in entries}
        if gained:
            holder, token = self.leadership.holder, self.leadership.token
            store.beat.record(
                beat_decision(
                    AuditAction.BEAT_LEAD_TAKEN,
                    AuditReason.BEAT_LEADER_GONE,
                    LEASE,
                    None,
                    None,
                    f"{holder} leads with fencing token {token}",
                    now,
                )
            )

    def record_missed(
        self,
        name: str,
        task: str,
        plan: RunPlan,
        why: str,
        reason: AuditReason,
        now: datetime,
    ) -> bool:
        """Record the plan's missed runs, sending none; False when nothing was recorded."""
        missed = plan.missed_runs(why)
        if missed is None:
            return False
        row = self.rows[name]
        won = self.context.store.beat.record_missed(
            name,
            row["last_run_at"],
            self.leadership.fence,
            now,
            missed,
            _decisions(name, task, plan, why, now, reason),
        )
        self._reread(name, won)
        if won:
            metrics.beat_runs("missed", plan.missed)
            logger.warning("celery-recovery beat: %s: %s", name, why)
        return won

    def claim_and_send(self, name: str, entry: Any, plan: RunPlan, why: str, now: datetime) -> bool:
        """Claim and send the plan's runs in order; the first claim records its missed ones.

        False when a claim or a send did not go through (lost lead, broker down).
        """
        store = self.context.store
        for index, run_at in enumerate(plan.send):
            first = index == 0
            if not first and name not in self.confirm():
                return False  # the entry's next claim waits for its previous run's record
            if not self.leadership.may_publish():
                return False
            decisions = _decisions(name, entry.task, plan, why, now) if first else []
            missed = plan.missed_runs(why) if first else None
            task_id, token = run_task_id(name, run_at), self.leadership.fence.token
            won = store.beat.claim_run(
                name,
                self.rows[name]["last_run_at"],
                run_at,
                task_id,
                self.leadership.fence,
                self.context.clock(),
                missed=missed,
                decisions=decisions,
            )
            if not won:
                self._reread(name, won)
                return False
            # What the claim wrote, without reading it back.
            row = self.rows[name]
            row.update(
                {
                    "last_run_at": run_at,
                    "pending_run_at": run_at,
                    "pending_task_id": task_id,
                    "pending_token": token,
                    "total_run_count": row.get("total_run_count", 0) + 1,
                    "missed_count": row.get("missed_count", 0) + (missed.count if missed else 0),
                }
            )
            if missed is not None:
                row.update({"last_missed_at": missed.up_to, "last_missed_reason": missed.reason})
            if first and plan.missed:
                metrics.beat_runs("missed", plan.missed)
                logger.warning("celery-recovery beat: %s: %s", name, why)
            late = (now - run_at).total_seconds() > ON_TIME
            if not self._send(name, entry, "late" if late else "sent"):
                return False
        return True

    def send_pending(self, name: str, entry: Any) -> bool:
        """Send (or confirm) the entry's claimed, unsent run; True once it is published
        (recorded sent by :meth:`confirm`)."""
        row = self.rows[name]
        task_id = str(row["pending_task_id"])
        fence = self.leadership.fence
        if row.get("pending_token") == fence.token:
            return self._send(name, entry)
        store = self.context.store
        sent_before = bool(store.tries.history(task_id))
        decision = beat_decision(
            AuditAction.BEAT_RESENT,
            AuditReason.BEAT_UNSENT_CLAIM,
            name,
            entry.task,
            task_id,
            f"the run of {iso(row.get('pending_run_at'))} was claimed with token "
            f"{row.get('pending_token')} and never confirmed sent; "
            + ("its publish is recorded: confirmed" if sent_before else "sending it again"),
        )
        won = store.beat.adopt_pending(
            name, task_id, row.get("pending_token"), fence, self.context.clock(), decision
        )
        self._reread(name, won)
        if not won:
            return False
        if sent_before:
            self._unconfirmed[name] = task_id
        return self._send(name, entry, "confirmed" if sent_before else "resent", again=True)

    def _send(self, name: str, entry: Any, outcome: str = "sent", again: bool = False) -> bool:
        """Publish the claimed run the entry's row holds (once); :meth:`confirm` records it."""
        row = self.rows[name]
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
                iso(run_at),
                task_id,
                " (again)" if again else "",
            )
            try:
                with sending_again() if again else nullcontext():
                    send_run(self.app, entry, task_id, run_at, self.producer())
            except Exception:
                logger.exception(
                    "celery-recovery beat: could not send %s as %s; trying again", name, task_id
                )
                return False
            self._unconfirmed[name] = task_id
        self._sent.append((name, task_id, outcome))
        return True

    def start_tick(self) -> None:
        """Forget what the last tick left to confirm (its rows tell again what is pending)."""
        self._sent.clear()

    def confirm(self) -> set[str]:
        """Record the runs published since the last call sent; returns their entries.

        Their publish records are flushed to the store first: they are what tells
        the next leader that a run it finds claimed and unconfirmed was sent.
        """
        if not self._sent:
            return set()
        sent, self._sent = self._sent, []
        token = self.leadership.token
        if token is None:
            return set()  # lost the lead: the next leader confirms them from the records
        self.context.runtime.writer.flush(timeout=2.0)
        sent_at = self.context.clock()
        done = self.context.store.beat.mark_sent_many(
            [(name, task_id) for name, task_id, _ in sent], token, sent_at
        )
        for name, task_id, outcome in sent:
            self._unconfirmed.pop(name, None)
            if name not in done:
                self._reread(name, False)
                continue
            row = self.rows[name]
            # What mark_sent_many wrote, without reading it back.
            row.update(
                {
                    "last_sent_run_at": row.get("pending_run_at"),
                    "last_task_id": task_id,
                    "last_sent_at": sent_at,
                    "pending_run_at": None,
                    "pending_task_id": None,
                    "pending_token": None,
                }
            )
            metrics.beat_runs(outcome)
            self._recorded.append(row.copy())
        return done

    def take_recorded(self) -> list[BeatEntryRow]:
        """The rows of the runs recorded sent since the last call, as each record left them."""
        recorded, self._recorded = self._recorded, []
        return recorded

    def _reread(self, name: str, won: bool) -> None:
        """Read the entry's row again: what was just changed, or what another beat did."""
        row = self.context.store.beat.entry(name)
        if row is None:
            self.rows.pop(name, None)
        else:
            self.rows[name] = row
        if not won:
            logger.debug("celery-recovery beat: %s: claim lost (moved on, or lead lost)", name)


def _decisions(
    name: str,
    task: str,
    plan: RunPlan,
    why: str,
    now: datetime,
    reason: AuditReason = AuditReason.BEAT_MISSED_RUNS,
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
                f"sending {len(late)} late run(s) scheduled from {iso(late[0])} to {iso(late[-1])}",
                now,
            )
        )
    if plan.missed:
        decisions.append(
            beat_decision(AuditAction.BEAT_SKIPPED, reason, name, task, None, why, now)
        )
    return decisions


def iso(value: datetime | None) -> str:
    return value.isoformat() if value is not None else "-"
