"""What django-celery-beat's rows mean to the HA scheduler, and what the app's entries
become in them.

Pure translations, no query: a ``PeriodicTask``'s bounds
(:class:`~.entries.EntryBounds`, by django-celery-beat's own rules for
``last_run_at``, ``start_time``, ``expires`` and ``one_off``), Django's
datetimes to aware UTC and back, and a ``beat_schedule`` entry as the fields
``ModelEntry.from_entry`` writes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from celery.schedules import crontab
from celery.schedules import schedule as interval_schedule
from django.conf import settings as django_settings
from django.utils import timezone

from celery_recovery.beat.entries import EntryBounds
from celery_recovery.beat.policy import OPTION


def bounds_of(model: Any) -> EntryBounds:
    """The bounds of a ``PeriodicTask``'s runs, as django-celery-beat gives them.

    An entry with no ``last_run_at`` (never run, or disabled since: saving it
    disabled clears it) starts when its row last changed (``date_changed``);
    one with a ``start_time`` runs first at the start (at once, when a fresh
    entry's start is past).  ``expires`` ends it; ``one_off`` ends it after a run.
    """
    fresh = model.last_run_at is None
    changed = utc(model.date_changed) if model.date_changed is not None else None
    anchor = changed if fresh else None
    if model.start_time is not None:
        begin = utc(model.start_time)
        if fresh and changed is not None:
            begin = max(begin, changed)
        anchor = just_before(model.schedule, begin)
    until = utc(model.expires) if model.expires is not None else None
    return EntryBounds(anchor, until, bool(model.one_off))


def just_before(sched: Any, begin: datetime) -> datetime:
    """The anchor whose next scheduled time is the first one at or after ``begin``."""
    if type(sched) is interval_schedule and not sched.relative:
        return begin - sched.run_every
    # Crontab, solar and clocked times fall on whole seconds at the finest.
    return begin - timedelta(seconds=1)


def utc(value: datetime) -> datetime:
    """A datetime read from Django's database, aware in UTC."""
    if timezone.is_naive(value):  # USE_TZ = False: the project's time zone
        value = timezone.make_aware(value)
    return value.astimezone(UTC)


def for_django(value: datetime) -> datetime:
    """An aware datetime as Django's database takes it (naive without USE_TZ)."""
    return value if django_settings.USE_TZ else timezone.make_naive(value)


def conf_entries(app: Any) -> dict[str, dict[str, Any]]:
    """The app's ``beat_schedule``, after the default entry DatabaseScheduler adds."""
    defaults: dict[str, dict[str, Any]] = {}
    if app.conf.result_expires:
        defaults["celery.backend_cleanup"] = {
            "task": "celery.backend_cleanup",
            "schedule": crontab("0", "4", "*"),
            "options": {"expire_seconds": 12 * 3600},
        }
    return {**defaults, **dict(app.conf.beat_schedule or {})}


def model_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A ``beat_schedule`` entry as ``ModelEntry.from_entry`` takes it, keeping what the
    model has a place for: the policy goes into the headers (where an admin edits it),
    and a number of seconds in ``expires`` into ``expire_seconds``."""
    options = dict(fields.get("options") or {})
    headers = dict(options.get("headers") or {})
    if OPTION in options:
        headers[OPTION] = options.pop(OPTION)
    options["headers"] = headers
    expires = options.get("expires")
    if options.get("expire_seconds") is None and isinstance(expires, int | float):
        options["expire_seconds"] = max(1, math.ceil(expires))
    return {**fields, "options": options}
