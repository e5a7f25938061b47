"""Per-entry policies: what to do with runs no beat sent in time.

Declared in the entry's ``options`` under the ``recovery`` key, which the
scheduler removes before it publishes (Celery's ``ScheduleEntry`` takes no
other keys; its ``options`` are free-form)::

    app.conf.beat_schedule = {
        "report": {
            "task": "shop.report",
            "schedule": crontab(minute=0),
            "options": {"recovery": {"catch_up": "all", "catch_up_window": 6 * 3600}},
        },
    }

``catch_up`` (runs due while no beat led, or all beats were down):

- ``latest`` (default): the newest missed run once, if it is no older than
  the window; the older ones are recorded as missed.
- ``all``: every missed run no older than the window, oldest first.
- ``skip``: none; only a run found due within :data:`ON_TIME` seconds is sent.

``catch_up_window`` defaults to ``recovery_beat_catch_up_window``.

``overlap`` (a run falls due while the entry's previous run is still queued or
running, as the store knows from the workers' records):

- ``allow`` (default): send it, as Celery does.
- ``skip``: record it as missed.
- ``buffer_one``: hold it until the previous run ends, then send it (the
  catch-up policy then decides among the runs held meanwhile).

Under ``skip`` and ``buffer_one`` one run is sent at a time (``catch_up="all"``
sends its late runs one after another, each once the previous has ended).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from celery_recovery.core.durations import positive_seconds
from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.records import MissedRuns

#: The key of an entry's ``options`` that holds its celery-recovery policy.
OPTION = "recovery"
#: Seconds a run may be found late and still count as on time (a slow tick or store
#: round trip), not as missed, under every policy.
ON_TIME = 2.0


class Overlap(StrEnum):
    """What a leader does with a due run while the entry's previous run is not done."""

    ALLOW = "allow"
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"


class CatchUp(StrEnum):
    """What a leader does with an entry's runs that are already late."""

    LATEST = "latest"
    ALL = "all"
    SKIP = "skip"


@dataclass(frozen=True)
class EntryPolicy:
    """One entry's policy; ``window`` in seconds."""

    catch_up: CatchUp
    window: float
    overlap: Overlap = Overlap.ALLOW

    @classmethod
    def of(
        cls,
        name: str,
        options: Mapping[str, Any] | None,
        window: float,
        where: str | None = None,
    ) -> EntryPolicy:
        """The policy of entry ``name`` from its ``options``; ``window`` is the default
        catch-up window.  Bad values raise :class:`ConfigurationError` naming them, and
        ``where`` the policy was written (the entry's ``options`` in ``beat_schedule``
        unless given)."""
        where = where or f"beat_schedule[{name!r}]['options'][{OPTION!r}]"
        given = (options or {}).get(OPTION)
        if given is None:
            return cls(CatchUp.LATEST, window)
        keys = ", ".join(repr(k) for k in KEYS)
        if not isinstance(given, Mapping):
            raise ConfigurationError(f"{where}={given!r} must be a dict with any of {keys}")
        unknown = set(given) - set(KEYS)
        if unknown:
            raise ConfigurationError(
                f"{where} has unknown keys {sorted(unknown)!r}; allowed: {keys}"
            )
        catch_up = _choice(where, "catch_up", given, CatchUp, "a catch-up policy")
        overlap = _choice(where, "overlap", given, Overlap, "an overlap policy")
        if "catch_up_window" in given:
            window = positive_seconds(
                f"{where}['catch_up_window']", given["catch_up_window"], timedelta_ok=True
            )
        return cls(CatchUp(catch_up), window, Overlap(overlap))

    @property
    def one_at_a_time(self) -> bool:
        """Whether runs wait for the previous one (overlap ``skip`` or ``buffer_one``)."""
        return self.overlap is not Overlap.ALLOW


#: The keys of an entry's ``options["recovery"]``.
KEYS = ("catch_up", "catch_up_window", "overlap")


def _choice(where: str, key: str, given: Mapping[str, Any], kind: type[StrEnum], what: str) -> str:
    value = given.get(key, next(iter(kind)).value)
    if value not in {c.value for c in kind}:
        allowed = ", ".join(repr(c.value) for c in kind)
        raise ConfigurationError(f"{where}[{key!r}]={value!r} is not {what}; allowed: {allowed}")
    return str(value)


@dataclass(frozen=True)
class RunPlan:
    """What to do with an entry's due runs: send ``send`` (oldest first), and record
    ``missed`` runs not sent, the newest of them at ``missed_at``."""

    send: tuple[datetime, ...]
    missed: int
    missed_at: datetime | None

    def missed_runs(self, why: str) -> MissedRuns | None:
        """The runs this plan does not send, as the store records them (None: none)."""
        if not self.missed or self.missed_at is None:
            return None
        return MissedRuns(self.missed, self.missed_at, why)


def window_start(policy: EntryPolicy, now: datetime) -> datetime:
    """Due times at or before this are out of the catch-up window: never sent."""
    return now - timedelta(seconds=max(policy.window, ON_TIME))


def plan_runs(
    policy: EntryPolicy,
    due: Sequence[datetime],
    now: datetime,
    passed: int = 0,
    passed_last: datetime | None = None,
    limit: int | None = None,
) -> RunPlan:
    """Apply ``policy`` to the due times ``due`` (oldest first, none after ``now``);
    ``passed`` older ones, the newest at ``passed_last``, were passed over already.

    With ``limit``, at most that many runs are sent (the oldest; the rest stay due).
    """
    start = window_start(policy, now)
    if policy.catch_up is CatchUp.ALL:
        send = [t for t in due if t > start]
    elif policy.catch_up is CatchUp.LATEST:
        send = [due[-1]] if due and due[-1] > start else []
    else:
        on_time = now - timedelta(seconds=ON_TIME)
        send = [due[-1]] if due and due[-1] >= on_time else []
    if limit is not None and len(send) > limit:
        send = send[:limit]
    first = send[0] if send else None
    # Only runs before the first sent one are missed; later ones stay due (a limit).
    missed = [t for t in due if (first is None or t < first) and t not in send]
    missed_at = missed[-1] if missed else passed_last
    return RunPlan(tuple(send), passed + len(missed), missed_at if passed or missed else None)
