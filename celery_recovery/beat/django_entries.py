"""django-celery-beat's schedules under the HA scheduler (``recovery_beat_entries = "django"``).

Imported only when that setting asks for it, once Celery's Django fixup has
called ``django.setup()`` (``celery beat`` imports the app's modules before it
builds its scheduler), so a project without Django never imports Django.

- **Read**: every enabled ``PeriodicTask``, converted by django-celery-beat's
  own ``ModelEntry`` (schedule, arguments, queue, exchange, routing key,
  priority, headers, ``expires``/``expire_seconds``).  Before the first read,
  the app's ``beat_schedule`` (and Celery's ``celery.backend_cleanup``) is
  written into the models, as ``DatabaseScheduler`` does.
- **Bounds**: ``start_time``, ``expires`` and ``one_off`` become
  :class:`~.entries.EntryBounds`; an entry that was never run, or was enabled
  again, starts when its row last changed, as with ``DatabaseScheduler``.
- **Policies**: the ``recovery`` key of the task's headers JSON (an admin
  field), removed before the run is published.
- **Changes**: the leader reads ``PeriodicTasks.last_update`` at most every
  :data:`POLL_EVERY` seconds and reads every entry again when it moved (and
  every :data:`FULL_READ_EVERY` seconds, for changes made without it).
- **Written back**, by the leader once a run is recorded sent: the row's
  ``last_run_at`` (the run's scheduled time) and ``total_run_count``; an ended
  entry (one-off run, expired) is disabled.  With ``QuerySet.update()``, which
  moves no change marker, so no beat reads the schedule again for it.

Django's database is used between store calls, never inside a store
transaction.  When it fails, the failure is logged once, the schedule read last
is kept, and writes are tried again: beat runs on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from celery.beat import ScheduleEntry
from django.db import Error as DjangoDatabaseError
from django.db import close_old_connections
from django.db.models import F, Q

from celery_recovery.beat.django_rows import bounds_of, conf_entries, for_django, model_fields
from celery_recovery.beat.entries import Entries, EntryBounds
from celery_recovery.beat.policy import OPTION, CatchUp, EntryPolicy
from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.records import BeatEntryRow

logger = logging.getLogger("celery_recovery.beat")

#: Seconds between two reads of django-celery-beat's change marker by the leader.
POLL_EVERY = 1.0
#: Seconds after which the leader reads every entry again though the marker did not
#: move: a change made with ``QuerySet.update()`` does not move it (as DatabaseScheduler).
FULL_READ_EVERY = 300.0
#: Seconds without touching Django's database after it failed.
RETRY_AFTER = 1.0
#: Runs recorded sent whose write-back waits for Django's database, at most.
MAX_UNWRITTEN = 10_000
#: The setting that selects this source, for messages.
SETTING = "recovery_beat_entries"

T = TypeVar("T")


class DjangoEntries:
    """The entries of django-celery-beat's models (:class:`~.entries.EntrySource`)."""

    def __init__(self, app: Any, window: float) -> None:
        self.app = app
        self.window = window
        self._models, self._entry_class = _django_celery_beat()
        #: The app's entries to write into the models; their policies are code, checked now.
        self._conf = conf_entries(app)
        self._conf_policies = {
            name: EntryPolicy.of(name, fields.get("options"), window)
            for name, fields in self._conf.items()
        }
        self._installed = False
        self._marker: Any = None
        self._next_poll = 0.0
        self._next_full_read = 0.0
        self._retry_at = 0.0
        self._failing = False
        #: Of the entries read last: each row's ``date_changed`` and bounds.
        self._versions: dict[str, datetime] = {}
        self._bounds: dict[str, EntryBounds] = {}
        #: Entries disabled since they were read (or found changed meanwhile).
        self._ended: set[str] = set()
        #: (entry, scheduled time) of runs recorded sent and not yet written back.
        self._unwritten: list[tuple[str, datetime]] = []

    # -- EntrySource ---------------------------------------------------------------

    def load(self) -> Entries:
        read = self._use_database("reading django-celery-beat's entries", self._read_all)
        if read is not None:
            return read
        # The recovery sweep and the app's own entries must not wait for Django's database.
        logger.warning(
            "celery-recovery beat: running the app's beat_schedule until django-celery-beat's "
            "models can be read"
        )
        entries = {
            name: ScheduleEntry(**dict(fields, name=name, app=self.app))
            for name, fields in self._conf.items()
        }
        return Entries(entries, dict(self._conf_policies))

    def poll(self) -> Entries | None:
        now = time.monotonic()
        if now < self._next_poll:
            return None
        self._next_poll = now + POLL_EVERY
        self._write_back()
        return self._use_database("reading django-celery-beat's change marker", self._changed)

    def record_sent(self, rows: Sequence[BeatEntryRow]) -> None:
        for row in rows:
            run_at = row.get("last_sent_run_at")
            if run_at is not None:
                self._unwritten.append((row["name"], run_at))
        self._write_back()

    def finish(self, name: str, why: str) -> None:
        if name in self._ended or name not in self._versions:
            return
        once = self._bounds[name].once
        # As django-celery-beat ends an entry: disabled, and its last_run_at cleared (a
        # one-off's count too), so that enabling it again starts it afresh.
        values: dict[str, Any] = {"enabled": False, "last_run_at": None}
        if once:
            values["total_run_count"] = 0
        changed = self._use_database(
            f"disabling {name}",
            # Only the row as it was read: one edited (enabled again) since is left alone.
            lambda: self._models.PeriodicTask.objects.filter(
                name=name, enabled=True, date_changed=self._versions[name]
            ).update(**values),
        )
        if changed is None:
            return  # tried again on a later tick
        self._ended.add(name)
        if changed:
            logger.info("celery-recovery beat: %s disabled: %s", name, why)

    # -- reading -------------------------------------------------------------------

    def _changed(self) -> Entries | None:
        due = time.monotonic() >= self._next_full_read or not self._installed
        if not due and self._models.PeriodicTasks.last_change() == self._marker:
            return None
        return self._read_all()

    def _read_all(self) -> Entries:
        if not self._installed:
            self._install()
        # The marker first: a change made during the read moves it again, and is read next.
        marker = self._models.PeriodicTasks.last_change()
        entries: dict[str, Any] = {}
        policies: dict[str, EntryPolicy] = {}
        bounds: dict[str, EntryBounds] = {}
        versions: dict[str, datetime] = {}
        for model in self._models.PeriodicTask.objects.enabled():
            try:
                entry, policy, bound = self._entry_of(model)
            except DjangoDatabaseError:
                raise
            except Exception as exc:
                # One bad row must not stop the others; it is read again once changed.
                logger.error("celery-recovery beat: PeriodicTask %r left out: %s", model.name, exc)
                continue
            entries[model.name], policies[model.name], bounds[model.name] = entry, policy, bound
            versions[model.name] = model.date_changed
        self._marker, self._next_full_read = marker, time.monotonic() + FULL_READ_EVERY
        self._versions, self._bounds = versions, bounds
        self._ended.clear()
        logger.info(
            "celery-recovery beat: %d entries read from django-celery-beat's models", len(entries)
        )
        return Entries(entries, policies, bounds)

    def _entry_of(self, model: Any) -> tuple[Any, EntryPolicy, EntryBounds]:
        bounds = bounds_of(model)  # first: ModelEntry fills in a missing last_run_at
        entry = self._entry_class(model, app=self.app)
        if not model.enabled or not hasattr(entry, "schedule"):
            # ModelEntry disables a row it cannot read (no schedule, arguments not JSON).
            raise ValueError("its schedule or arguments cannot be read; disabled")
        headers = entry.options.get("headers") or {}
        if OPTION in headers:
            entry.options[OPTION] = headers.pop(OPTION)
        where = f"PeriodicTask {model.name!r} headers[{OPTION!r}]"
        policy = EntryPolicy.of(model.name, entry.options, self.window, where)
        if bounds.once and policy.catch_up is CatchUp.LATEST:
            # A one-off's run is its first scheduled time (a clocked time): read late, it
            # is still that one that is sent, not a later time of the schedule.
            policy = replace(policy, catch_up=CatchUp.ALL)
        return entry, policy, bounds

    def _install(self) -> None:
        """Write the app's entries into the models, as DatabaseScheduler does at start:
        an admin edit of one of them lasts until a beat starts again."""
        tasks = self._models.PeriodicTask.objects
        saved = dict(tasks.filter(name__in=list(self._conf)).values_list("name", "date_changed"))
        for name, fields in self._conf.items():
            try:
                self._entry_class.from_entry(name, app=self.app, **model_fields(fields))
            except DjangoDatabaseError:
                raise
            except Exception:
                logger.exception(
                    "celery-recovery beat: could not write beat_schedule entry %r into "
                    "django-celery-beat's models",
                    name,
                )
                continue
            if name in saved:
                # A beat's start is no edit: an entry that never ran starts from its own
                # date_changed, which every beat restarting would otherwise push back.
                tasks.filter(name=name).update(date_changed=saved[name])
        self._installed = True

    # -- writing back --------------------------------------------------------------

    def _write_back(self) -> None:
        if not self._unwritten:
            return
        runs, self._unwritten = self._unwritten, []
        if self._use_database("writing last_run_at back", lambda: self._write(runs)) is None:
            self._unwritten = (runs + self._unwritten)[-MAX_UNWRITTEN:]

    def _write(self, runs: Sequence[tuple[str, datetime]]) -> bool:
        tasks = self._models.PeriodicTask.objects
        for name, run_at in runs:
            at = for_django(run_at)
            # Only a row that shows an older run: a write tried again counts its run once,
            # and a row disabled meanwhile keeps the cleared last_run_at django-celery-beat
            # gives it.
            tasks.filter(
                Q(last_run_at__isnull=True) | Q(last_run_at__lt=at), name=name, enabled=True
            ).update(last_run_at=at, total_run_count=F("total_run_count") + 1)
        return True

    # -- Django's database ---------------------------------------------------------

    def _use_database(self, doing: str, work: Callable[[], T]) -> T | None:
        """``work()``, or None when Django's database failed (logged once per outage)."""
        if time.monotonic() < self._retry_at:
            return None
        try:
            # Beat lives long: drop connections past CONN_MAX_AGE or broken, as
            # django-celery-beat does before each use.
            close_old_connections()
            result = work()
        except Exception as exc:
            self._retry_at = time.monotonic() + RETRY_AFTER
            if not self._failing:
                self._failing = True
                log = logger.warning if isinstance(exc, DjangoDatabaseError) else logger.exception
                log(
                    "celery-recovery beat: Django's database failed while %s: %s; beat runs "
                    "on with the entries read last and tries again (further failures are "
                    "not logged)",
                    doing,
                    exc,
                )
            return None
        if self._failing:
            self._failing = False
            logger.warning("celery-recovery beat: Django's database answers again")
        return result


def _django_celery_beat() -> tuple[Any, Any]:
    """django-celery-beat's models module and ``ModelEntry``, or a clear error."""
    from django.apps import apps

    if not apps.ready:
        raise ConfigurationError(
            f"{SETTING}='django' needs Django set up before beat builds its scheduler: run "
            "`celery -A proj beat` with DJANGO_SETTINGS_MODULE set and the app configured "
            "from Django's settings, as in Celery's Django guide (its fixup calls "
            "django.setup())"
        )
    if not apps.is_installed("django_celery_beat"):
        raise ConfigurationError(
            f"{SETTING}='django' needs django-celery-beat: `pip install django-celery-beat` "
            "and add 'django_celery_beat' to INSTALLED_APPS"
        )
    from django_celery_beat import models
    from django_celery_beat.schedulers import ModelEntry

    return models, ModelEntry
