"""A second opinion before a live-looking worker's tries run again: ask it over the broker.

A worker whose store heartbeats stopped, while nothing says it died (its liveness
marker is present, or cannot be checked from here), may only be cut off from the
store: a network partition, a pooler restart, ``max_connections`` exhausted.  Its
broker, result backend and running tasks may be fine.  Running its tries again
then runs them twice.  So, before the zombie, reserved and dead-job steps act on
such a worker, the sweep asks it with Celery's remote control (``query_task`` to
its node, a short timeout): a worker that answers and holds the try is
*partitioned from the store*, not dead; its try is left alone (an audit row, a
metric, the sweep's report say so) and it is asked again at the next sweep, until
its heartbeats come back (its buffered records then catch up) or it stops
answering.  A worker that does not answer (dead, SIGSTOPped, cut off from the
broker too) is judged as before.

Nothing is asked while heartbeats arrive, nor for a process whose marker is gone
(the liveness step has ended its job: it is dead).  One question per sweep covers
every suspect node; its answers serve every step of that sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from celery_recovery.core.audit import AuditAction, AuditReason
from celery_recovery.core.records import SweepOutcome, WriteKind
from celery_recovery.core.states import JobState
from celery_recovery.sweeps.context import SweepContext
from celery_recovery.telemetry import metrics

Row = TypeVar("Row", bound=Any)

logger = logging.getLogger("celery_recovery.sweep")

#: Longest wait for the answers, in seconds (a live worker's main process answers
#: within milliseconds on a local broker; a dead one never does).
MAX_WAIT = 1.0
#: Shortest wait, however short the heartbeat interval.
MIN_WAIT = 0.25


@dataclass
class Answers:
    """What the asked nodes said: by node, the tries they hold (task id -> the pid of
    the pool process running it, or None when it waits in the worker)."""

    asked: set[str] = field(default_factory=set)
    held: dict[str, dict[str, int | None]] = field(default_factory=dict)

    def answered(self, node: str | None) -> bool:
        return node is not None and node in self.held

    def holds(self, node: str | None, task_id: str) -> bool:
        return node is not None and task_id in self.held.get(node, {})

    def runs_in(self, node: str | None, pid: int | None) -> bool:
        """The node answered and a pool process ``pid`` runs one of its tries."""
        return pid is not None and pid in self.held.get(node or "", {}).values()


def ask(ctx: SweepContext, nodes: Iterable[str | None], task_ids: Iterable[str]) -> Answers:
    """Ask ``nodes`` (worker node names) which of ``task_ids`` they hold; the answers of
    nodes this sweep already asked are reused."""
    answers: Answers = ctx.extras.setdefault("second_opinion", Answers())
    new = sorted({n for n in nodes if n} - answers.asked)
    if not new:
        return answers
    answers.asked.update(new)
    if not ctx.app.conf.worker_enable_remote_control:
        return answers  # nobody answers: every suspect is judged as before (see the doctor)
    wait = min(MAX_WAIT, max(MIN_WAIT, ctx.settings.heartbeat_interval))
    ids = sorted(set(task_ids))
    try:
        replies = ctx.app.control.inspect(destination=new, timeout=wait).query_task(*ids) or {}
    except Exception as exc:  # the broker is down: nothing can be asked, judge as before
        logger.info("celery-recovery: could not ask workers %s over the broker: %s", new, exc)
        return answers
    for node, tasks in replies.items():
        answers.held[node] = {task_id: _pid(info) for task_id, info in (tasks or {}).items()}
    return answers


def _pid(info: Any) -> int | None:
    """The pool process of an active try, from ``query_task``'s ``[state, request]``."""
    if isinstance(info, list | tuple) and len(info) == 2 and isinstance(info[1], dict):
        pid = info[1].get("worker_pid")
        return int(pid) if isinstance(pid, int) else None
    return None


#: (task id, try, job id) already reported partitioned by this process: one audit row
#: per episode, not one per sweep.
_reported: set[tuple[str, int, str]] = set()


def leave_partitioned(
    ctx: SweepContext, rows: list[Row], cause: str, job_key: str = "job_id"
) -> list[Row]:
    """``rows`` (tries of workers silent in the store) less those whose worker answers
    over the broker and holds them; those are counted, logged and audited as
    partitioned.  Rows whose job is not running (its marker showed it dead) are kept
    without asking."""
    suspects = [r for r in rows if r.get("job_state") == JobState.RUNNING]
    if not suspects:
        return rows
    answers = ask(ctx, (r.get("job_node_name") for r in suspects), (r["task_id"] for r in suspects))
    kept: list[Row] = []
    for row in rows:
        node = row.get("job_node_name")
        if row.get("job_state") == JobState.RUNNING and answers.holds(node, row["task_id"]):
            _partitioned(ctx, row, cause, str(row.get(job_key)), node)
        else:
            kept.append(row)
    return kept


def _partitioned(ctx: SweepContext, row: Any, cause: str, job_id: str, node: str | None) -> None:
    ctx.report.partitioned += 1
    metrics.sweep_action(cause, SweepOutcome.PARTITIONED)
    key = (row["task_id"], int(row["try_number"]), job_id)
    if key in _reported:
        return
    _reported.add(key)
    detail = (
        f"partitioned: job {job_id} ({node}) stopped heartbeating in the store, but its "
        "worker answered over the broker and holds the try; left alone, asked again each sweep"
    )
    logger.warning(
        "celery-recovery: %s[%s] try %s %s",
        row.get("task_name"),
        row["task_id"],
        row["try_number"],
        detail,
    )
    decision = ctx.decision(AuditAction.PARTITIONED, AuditReason.WORKER_LOST, row, detail)
    with ctx.isolated(f"auditing partitioned {row['task_id']}"):
        ctx.store.tries.apply_writes([(WriteKind.AUDIT, decision)])
