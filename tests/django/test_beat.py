"""django-celery-beat's schedules under the HA scheduler (``recovery_beat_entries = "django"``).

Real ``celery -A djproj beat -S celery_recovery.beat:Scheduler`` processes read
the project's ``PeriodicTask`` rows, which the test edits through the ORM as the
admin would.  The tests' fast settings give a lease of 1 s renewed every 0.25 s;
the leader reads django-celery-beat's change marker every second, so an edit is
in effect within :data:`EDIT_EFFECT`.  Runs are counted in the broker's
queues (no worker takes them), as in tests/beat: a scheduled time published
twice would be seen there, where a worker would drop the copy.
"""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab

from celery_recovery.beat.entries import EntryBounds
from celery_recovery.beat.policy import OPTION, CatchUp
from celery_recovery.beat.publish import run_task_id
from celery_recovery.beat.times import next_after
from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.settings import RecoverySettings
from tests.beat.conftest import leader_pid, queued_runs, wait_for_leader
from tests.services import PG_ADMIN_URL
from tests.workers import SessionProcess, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

#: Seconds within which a change made in the database is in effect on the leader: its
#: poll (1 s), a tick (0.25 s) and a margin for the 2-core machine.
EDIT_EFFECT = timedelta(seconds=3)
SECOND = timedelta(seconds=1)
KOLKATA = ZoneInfo("Asia/Kolkata")  # UTC+05:30: its whole hours fall on UTC's half hours


@pytest.fixture
def start_django_beat(
    start_django_process: Callable[..., SessionProcess],
) -> Callable[[str], SessionProcess]:
    """Start `celery -A djproj beat -S celery_recovery.beat:Scheduler` on the models."""

    def start(name: str) -> SessionProcess:
        return start_django_process(
            "beat",
            "-S",
            "celery_recovery.beat:Scheduler",
            "-l",
            "INFO",
            name=name,
            CELERY_RECOVERY_BEAT_ENTRIES="django",
        )

    return start


def create(models: Any, name: str, every: float | None = None, **fields: Any) -> Any:
    """A PeriodicTask of ``shop.tasks.work(name)``, every ``every`` seconds unless another
    schedule is given."""
    if every is not None:
        fields["interval"] = models.IntervalSchedule.objects.get_or_create(
            every=every, period="seconds"
        )[0]
    fields.setdefault("args", json.dumps([name]))
    return models.PeriodicTask.objects.create(name=name, task="shop.tasks.work", **fields)


def edit(models: Any, name: str, **fields: Any) -> datetime:
    """Change a PeriodicTask as the admin does (a fresh read, then ``save()``); returns
    when (its ``date_changed``)."""
    task = models.PeriodicTask.objects.get(name=name)
    for key, value in fields.items():
        setattr(task, key, value)
    task.save()
    return task.date_changed


def times_of(runs: list[tuple[str, str, datetime]], name: str, once: bool = True) -> list[datetime]:
    """The scheduled times of entry ``name`` among ``runs`` (each published once, unless
    ``once`` is false: copies sent again after a kill are among them)."""
    times = sorted(at for _, task_id, at in runs if task_id == run_task_id(name, at))
    if once:
        assert len(times) == len(set(times)), f"{name}: a time published twice: {times}"
    return times


def raw_messages(broker_url: str, queue: str) -> list[dict[str, Any]]:
    """Every message waiting in ``queue``, at any priority (Redis keeps one list for each)."""
    import redis

    client = redis.Redis.from_url(broker_url)
    keys = [queue.encode(), *client.keys(queue.encode() + b"\x06\x16*")]
    return [json.loads(raw) for key in keys for raw in client.lrange(key, 0, -1)]


# -- conversion, in this process ------------------------------------------------------


def test_the_apps_beat_schedule_is_written_into_the_models_with_its_policy(beat_models, caplog):
    from celery_recovery.beat.django_entries import DjangoEntries

    app = Celery("conversion", set_as_current=False)
    app.conf.beat_schedule = {
        "report": {
            "task": "shop.report",
            "schedule": crontab(minute="0"),
            "args": [1],
            "options": {"queue": "reports", "expires": 25, OPTION: {"catch_up": "all"}},
        }
    }
    # Given an entry an admin wrote with a policy that is not one
    create(beat_models, "bad", every=1, headers=json.dumps({OPTION: {"catch_up": "twice"}}))

    # When the source reads the models
    with caplog.at_level(logging.ERROR, "celery_recovery.beat"):
        read = DjangoEntries(app, window=3600.0).load()

    # Then the app's entry is a row, as DatabaseScheduler writes it, with its policy
    # in the headers an admin edits and its expiry in seconds
    row = beat_models.PeriodicTask.objects.get(name="report")
    assert (row.crontab.minute, row.queue, row.expire_seconds) == ("0", "reports", 25)
    assert json.loads(row.headers) == {OPTION: {"catch_up": "all"}}
    # and it is read back as django-celery-beat's ModelEntry, the policy out of its headers
    entry = read.entries["report"]
    assert (entry.args, entry.options["queue"], entry.options["expires"]) == ([1], "reports", 25)
    assert entry.options["headers"] == {"periodic_task_name": "report"}
    assert read.policies["report"].catch_up is CatchUp.ALL
    # Celery's result cleanup is there too, as DatabaseScheduler adds it
    assert "celery.backend_cleanup" in read.entries
    # The bad entry is left out with its reason, and beat goes on
    assert "bad" not in read.entries
    assert "PeriodicTask 'bad' headers['recovery']['catch_up']='twice'" in caplog.text
    # Another beat's start writes the entry again, and is no edit of it: an entry that
    # never ran starts from its date_changed, which restarts must not push back
    DjangoEntries(app, window=3600.0).load()
    assert beat_models.PeriodicTask.objects.get(name="report").date_changed == row.date_changed
    app.close()


def test_a_crontab_runs_in_its_own_time_zone_and_a_solar_event_where_it_is(beat_models):
    from celery_recovery.beat.django_entries import DjangoEntries

    app = Celery("conversion", set_as_current=False)
    app.conf.result_expires = None
    cron = beat_models.CrontabSchedule.objects.create(minute="0", hour="9", timezone=KOLKATA)
    create(beat_models, "nine-in-kolkata", crontab=cron, headers='{"x": 1}')
    sunrise = beat_models.SolarSchedule.objects.create(
        event="sunrise", latitude="48.85", longitude="2.35"
    )
    create(beat_models, "paris-sunrise", solar=sunrise)

    entries = DjangoEntries(app, window=3600.0).load().entries

    t0 = datetime(2026, 1, 5, 1, 0, tzinfo=UTC)
    nine = entries["nine-in-kolkata"]
    assert next_after(nine.schedule, t0, t0) == datetime(2026, 1, 5, 3, 30, tzinfo=UTC)
    assert nine.options["headers"] == {"x": 1, "periodic_task_name": "nine-in-kolkata"}
    rises = next_after(entries["paris-sunrise"].schedule, t0, t0)
    assert (rises.date(), rises.hour) == (t0.date(), 7)  # 08:4x in Paris in January


def test_a_beat_started_while_djangos_database_refuses_runs_the_apps_entries_till_it_answers(
    beat_models, django_database
):
    from celery_recovery.beat.django_entries import DjangoEntries

    app = Celery("outage", set_as_current=False)
    app.conf.result_expires = None
    app.conf.beat_schedule = {"sweep": {"task": "celery_recovery.sweep", "schedule": 5.0}}
    create(beat_models, "admin-made", every=10)
    with refused_connections(django_database):
        source = DjangoEntries(app, window=3600.0)
        read = source.load()
        assert list(read.entries) == ["sweep"] and source.poll() is None
    read = wait_for(source.poll, 5, what="the models to be read")
    assert set(read.entries) == {"sweep", "admin-made"}


def test_the_bounds_of_a_periodic_task(beat_models):
    from celery_recovery.beat.django_rows import bounds_of

    now = datetime.now(UTC)
    soon = now + timedelta(minutes=5)
    # A new entry starts when it was created; one with a start time, a period before it
    fresh = create(beat_models, "fresh", every=10)
    assert bounds_of(fresh) == EntryBounds(anchor=fresh.date_changed)
    starts = create(beat_models, "starts", every=10, start_time=soon, expires=soon)
    assert bounds_of(starts) == EntryBounds(soon - timedelta(seconds=10), until=soon)
    # A start already past: at once (when it was created)
    past = create(beat_models, "past", every=10, start_time=now - timedelta(days=1))
    assert bounds_of(past).anchor == past.date_changed - timedelta(seconds=10)
    # An entry that ran goes on from the store's last time
    ran = create(beat_models, "ran", every=10, last_run_at=now, one_off=True)
    assert bounds_of(ran) == EntryBounds(once=True)


def test_an_entrys_bounds_end_it_after_one_run_or_at_its_expiry():
    now = datetime(2026, 1, 5, 12, tzinfo=UTC)
    anchor = now - timedelta(minutes=1)
    once = EntryBounds(anchor=anchor, once=True)
    assert once.last(anchor - timedelta(hours=1)) == anchor
    assert once.last(now) == now
    assert once.ended({"last_sent_run_at": None}, now) is None
    # A run before the anchor is from before the entry was enabled again
    assert once.ended({"last_sent_run_at": anchor - timedelta(seconds=1)}, now) is None
    assert "one run was sent" in once.ended({"last_sent_run_at": now}, now)
    expiring = EntryBounds(until=now)
    assert expiring.ended({}, now - timedelta(seconds=1)) is None
    assert "expired" in expiring.ended({}, now)


def test_the_setting_names_its_allowed_values():
    assert RecoverySettings.from_sources({"recovery_beat_entries": "Django"}).beat_entries == (
        "django"
    )
    with pytest.raises(ConfigurationError, match=r"recovery_beat_entries='db'.*'beat_schedule'"):
        RecoverySettings.from_sources({"recovery_beat_entries": "db"})


# -- real beats -----------------------------------------------------------------------

#: What a beat logs each time it reads every entry from the models.
READ = "entries read from django-celery-beat's models"


def test_two_beats_send_each_run_of_the_models_once_through_edits_a_kill_and_an_outage(
    beat_models, store, start_django_beat, broker_urls, queue, django_database
):
    broker = broker_urls[0]
    tasks = beat_models.PeriodicTask.objects

    def sent(name: str) -> list[datetime]:
        return times_of(queued_runs(broker, queue), name)

    # Given entries every second, some catching up every missed run (their headers'
    # policy), so that their times show each edit exactly
    catch_up_all = json.dumps({OPTION: {"catch_up": "all"}})
    for name in ("every", "to-change", "to-disable"):
        create(beat_models, name, every=1, headers=catch_up_all)
    create(beat_models, "to-delete", every=1)
    create(beat_models, "switched-on", every=1, enabled=False)
    # and two beats
    beats = [start_django_beat("beat1"), start_django_beat("beat2")]
    leader = wait_for_leader(store, beats)
    standby = next(b for b in beats if b is not leader)
    wait_for(lambda: len(sent("every")) >= 3, 30, what="runs")
    # A standby read the entries once, at start: only the leader polls the database
    if "leading as" not in standby.log:  # (a lease lapsed under load would make it lead)
        assert standby.log.count(READ) == 1, standby.log

    # When the admin edits entries, and the leader is SIGKILLed right after
    every_two = beat_models.IntervalSchedule.objects.create(every=2, period="seconds")
    changed = edit(beat_models, "to-change", interval=every_two)
    disabled = edit(beat_models, "to-disable", enabled=False)
    deleted = datetime.now(UTC)
    tasks.get(name="to-delete").delete()
    added = create(beat_models, "added", every=1).date_changed
    leader.signal(signal.SIGKILL)
    beats.append(start_django_beat("beat3"))

    # Then the standby takes the lead and reads the edits at once
    wait_for(lambda: leader_pid(store) == standby.pid, 10, what="the standby to lead")
    wait_for(lambda: len(sent("added")) >= 2, 10, what="the new entry to run")
    assert standby.log.count(READ) >= 2

    # When an entry is enabled again, and another for the first time
    enabled = edit(beat_models, "to-disable", enabled=True)
    edit(beat_models, "switched-on", enabled=True)
    wait_for(
        lambda: any(t > enabled for t in sent("to-disable")) and sent("switched-on"),
        10,
        what="the entries enabled to run",
    )

    # When Django's database refuses connections for a while
    leading = next(b for b in beats if b.pid == leader_pid(store))
    with refused_connections(django_database):
        wait_for(lambda: "Django's database failed" in leading.log, 10, what="the failure")
        during = len(sent("every"))
        # Then the leader runs on with the entries it read
        wait_for(lambda: len(sent("every")) >= during + 2, 10, what="runs meanwhile")
    wait_for(lambda: "Django's database answers again" in leading.log, 10, what="the recovery")
    # and writes back what it sent meanwhile
    newest = sent("every")[-1]
    row = wait_for(
        lambda: (r := tasks.get(name="every")).last_run_at >= newest and r,
        10,
        what="last_run_at written back",
    )
    wait_for(
        lambda: len([t for t in sent("to-change") if t > changed + EDIT_EFFECT]) >= 3,
        10,
        what="three runs at the new interval",
    )

    runs = queued_runs(broker, queue)
    # Each scheduled time of each entry was published once (times_of checks), and
    # "every" (catch_up=all) covered every second across the kill, a copy sent again
    # by the new leader included
    every = times_of(runs, "every")
    covered = sorted(set(times_of(queued_runs(broker, queue, copies=True), "every", once=False)))
    assert all(b - a == SECOND for a, b in pairwise(covered)), covered
    # The interval changed from 1 s to 2 s
    change = times_of(runs, "to-change")
    assert all(b - a == SECOND for a, b in pairwise(t for t in change if t <= changed))
    after = [t for t in change if t > changed + EDIT_EFFECT]
    assert all(b - a == 2 * SECOND for a, b in pairwise(after)), change
    # Nothing ran while disabled, nor was caught up: it started afresh when enabled
    toggled = times_of(runs, "to-disable")
    assert not [t for t in toggled if disabled + EDIT_EFFECT < t <= enabled]
    assert min(t for t in toggled if t > enabled) == enabled + SECOND
    # The deleted entry stopped, the new ones started one period after they were saved
    assert not [t for t in times_of(runs, "to-delete") if t > deleted + EDIT_EFFECT]
    assert min(times_of(runs, "added")) >= added + SECOND
    # The admin shows the last run and the count (a run recorded by the killed leader
    # and not yet written back is not counted)
    upto = [t for t in every if t <= row.last_run_at]
    assert row.last_run_at in every
    assert len(upto) - 1 <= row.total_run_count <= len(upto), (row.total_run_count, len(upto))


class refused_connections:
    """Django's database refuses new connections (beat opens one for each poll) while open."""

    def __init__(self, database: str) -> None:
        from sqlalchemy import create_engine

        self.database = database
        self.admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")

    def _allow(self, allowed: bool) -> None:
        from sqlalchemy import text

        with self.admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{self.database}" ALLOW_CONNECTIONS {allowed}'))

    def __enter__(self) -> None:
        self._allow(False)

    def __exit__(self, *exc: object) -> None:
        self._allow(True)
        self.admin.dispose()


def test_each_kind_of_entry_runs_within_its_bounds_and_options(
    beat_models, store, start_django_beat, start_django_worker, broker_urls, queue
):
    from shop.models import BodyRun

    broker, elsewhere = broker_urls[0], f"{queue}-elsewhere"  # no worker takes that queue
    tasks = beat_models.PeriodicTask.objects
    now = datetime.now(UTC)
    # Given an hourly crontab in Kolkata whose last run was two hours ago (under any
    # scheduler) and no beat since: its runs are late, the newest is sent
    cron = beat_models.CrontabSchedule.objects.create(minute="0", hour="*", timezone=KOLKATA)
    create(beat_models, "kolkata-hourly", crontab=cron, queue=elsewhere)
    tasks.filter(name="kolkata-hourly").update(
        last_run_at=now - timedelta(hours=2), total_run_count=5
    )
    store.beat.register_entries(
        [{"name": "kolkata-hourly", "task": "shop.tasks.work"}], now - timedelta(hours=2)
    )
    # an entry with routing options
    create(
        beat_models,
        "routed",
        every=1,
        queue=elsewhere,
        priority=3,
        headers=json.dumps({"x-shop": "routed"}),
        expire_seconds=60,
    )
    # and a run longer than its interval, which the entry's policy keeps from overlapping
    create(
        beat_models,
        "overlapping",
        every=1,
        args=json.dumps(["overlapping", 2.0]),
        headers=json.dumps({OPTION: {"overlap": "skip"}}),
    )
    beat = start_django_beat("beat")
    start_django_worker()
    wait_for_leader(store, [beat])
    # When entries with a start, an end, one run, and a clock time are saved
    start = datetime.now(UTC) + timedelta(seconds=4)
    catch_up_all = json.dumps({OPTION: {"catch_up": "all"}})  # the first run, however late
    create(beat_models, "later", every=1, start_time=start, queue=elsewhere, headers=catch_up_all)
    expires = datetime.now(UTC) + timedelta(seconds=4)
    create(beat_models, "expiring", every=1, expires=expires, queue=elsewhere)
    create(beat_models, "one-off", every=1, one_off=True, queue=elsewhere)
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=4)
    clock = beat_models.ClockedSchedule.objects.create(clocked_time=at)
    create(beat_models, "clocked", clocked=clock, one_off=True, queue=elsewhere)

    def runs(name: str) -> list[datetime]:
        return times_of(queued_runs(broker, elsewhere), name)

    def disabled(name: str) -> bool:
        return not tasks.get(name=name).enabled

    # Then the one-off runs once and is disabled, as django-celery-beat does
    wait_for(lambda: disabled("one-off"), 10, what="the one-off to be disabled")
    # and, enabled again, runs once more
    edit(beat_models, "one-off", enabled=True)
    wait_for(lambda: len(runs("one-off")) == 2 and disabled("one-off"), 10, what="its second run")
    one_off = tasks.get(name="one-off")
    assert (one_off.last_run_at, one_off.total_run_count) == (None, 0)
    # The clocked entry ran once, at its time; the expiring one stopped at its end
    wait_for(lambda: disabled("clocked") and disabled("expiring"), 10, what="both to end")
    assert runs("clocked") == [at]
    assert runs("expiring") and max(runs("expiring")) < expires
    # The one with a start ran first then
    wait_for(lambda: len(runs("later")) >= 2, 10, what="the later entry to run")
    assert runs("later")[0] == start
    # The crontab sent its newest run, at a whole hour in Kolkata (half past in UTC), and
    # its count went on from the row's
    hourly = runs("kolkata-hourly")
    assert all((t.minute, t.second) == (30, 0) for t in hourly), hourly
    assert now - hourly[0] < timedelta(hours=1)
    row = tasks.get(name="kolkata-hourly")
    assert (row.last_run_at, row.total_run_count) == (hourly[-1], 5 + len(hourly))
    # The routing options reached the messages (the queue: every run above was there)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for message in raw_messages(broker, elsewhere):
        by_name.setdefault(message["headers"]["periodic_task_name"], []).append(message)
    assert {m["properties"]["priority"] for m in by_name["routed"]} == {3}
    assert {m["headers"]["x-shop"] for m in by_name["routed"]} == {"routed"}
    assert all(m["headers"]["expires"] for m in by_name["routed"] + by_name["expiring"])
    # The long runs, on a worker with two processes, never overlapped
    wait_for(lambda: BodyRun.objects.filter(label="overlapping").count() >= 3, 20, what="3 runs")
    starts = sorted(
        BodyRun.objects.filter(label="overlapping").values_list("started_at", flat=True)
    )
    assert all(b - a >= timedelta(seconds=2) for a, b in pairwise(starts)), starts
    assert store.beat.entry("overlapping")["missed_count"] >= 1
    # and no other entry's run reached the worker's queue
    assert not BodyRun.objects.filter(label__in=list(by_name)).exists()
