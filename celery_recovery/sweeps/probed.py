"""The shape of the steps that judge tries against the result backend: probe all, decide each.

Zombies, reserved messages of dead workers and lost messages are each found
by one store query; the result backend is then asked about all of them in
one round (a backend that did not answer leaves every try undecided, counted
as an error, never published blind; a kind of backend that cannot answer for
another process, none or ``rpc://``, is not asked, and each step decides from
the store alone: :mod:`celery_recovery.sweeps.untold`), and each try is decided in isolation,
so one bad row never stops the others.  What a decision changed is counted
after its commit, by the sweep that won it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from celery_recovery.core.records import JobRow, SweepOutcome, TryRow
from celery_recovery.messages.backend_probe import UNKNOWN, Probe, probe_many
from celery_recovery.sweeps.context import SweepContext
from celery_recovery.telemetry import metrics

Row = TypeVar("Row", bound=TryRow)
LiveWorkers = dict[tuple[Any, Any], JobRow]


def decide_each(
    ctx: SweepContext,
    rows: Sequence[Row],
    what: str,
    decide: Callable[[Row, Probe, LiveWorkers], str | None],
    on_action: Callable[[Row, str], None],
) -> None:
    """Probe ``rows`` at once, then ``decide`` each the backend answered for; ``on_action``
    runs for each change made."""
    live = ctx.live_workers()
    seen: dict[str, Probe] = {}
    with ctx.isolated("probing the result backend"):
        seen = probe_many(ctx.app, [row["task_id"] for row in rows])
    for row in rows:
        probe = seen.get(row["task_id"], Probe(UNKNOWN))
        if probe.state == UNKNOWN:
            # Deciding blind could run a finished task again; try on the next pass.
            ctx.failed(f"the result backend did not answer ({probe.result})")
            continue
        with ctx.isolated(f"{what} {row['task_id']}/{row['try_number']}"):
            action = decide(row, probe, live)
            if action in metrics.definitions.ACTIONS:
                on_action(row, action)


def count_reset(ctx: SweepContext, result: str, republished: str) -> str:
    """Count a reset's ``result`` in the report: published again (in the ``republished``
    field the step keeps), or failed for good."""
    if result == SweepOutcome.REPUBLISHED:
        setattr(ctx.report, republished, getattr(ctx.report, republished) + 1)
    elif result == SweepOutcome.FAILED:
        ctx.report.failed += 1
    return result
