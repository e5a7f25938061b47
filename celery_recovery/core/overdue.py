"""Overdue tries: how long is too long for a running try, judged from its task's history.

A try of a task with no ``recovery_heartbeat_timeout`` can hang unseen: its
worker heartbeats, so it is no zombie.  It is *overdue* once it has run longer
than its task usually takes: ``factor`` times the 95th percentile of the task's
last :data:`SAMPLE_RUNS` successful runs, and never less than ``min_seconds``.
A task with fewer than ``min_runs`` successful runs on record has no usual
duration, and none of its tries is overdue.  Overdue is only reported (inspect,
the console, a gauge); nothing is done to the try.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Successful runs of a task read to learn its usual duration (its newest ones).
SAMPLE_RUNS = 200
#: The percentile of those runs' durations that ``factor`` multiplies: a high one,
#: so that a task whose runs vary is not flagged for its ordinary slow runs, yet not
#: the maximum, which one past hang that ended in success would inflate for good.
PERCENTILE = 95


def percentile(values: Sequence[float], pct: float = PERCENTILE) -> float:
    """The nearest-rank ``pct`` percentile of ``values`` (not empty)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class OverduePolicy:
    """When a running try counts as overdue (``recovery_overdue_*`` settings)."""

    factor: float
    min_runs: int
    min_seconds: float

    @classmethod
    def of(cls, settings: Any) -> OverduePolicy:
        """The policy of a :class:`~celery_recovery.core.settings.RecoverySettings`."""
        return cls(settings.overdue_factor, settings.overdue_min_runs, settings.overdue_min_seconds)

    def bound(self, durations: Sequence[float]) -> tuple[float, float] | None:
        """(seconds after which a try is overdue, the usual duration it was derived
        from) for a task whose recent successful runs took ``durations`` seconds;
        None when there are too few of them to tell."""
        if len(durations) < max(1, self.min_runs):
            return None
        usual = percentile(durations)
        return max(self.min_seconds, self.factor * usual), usual
