"""Scheduled times and catch-up plans: pure functions of the last decided time and ``now``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery
from celery.schedules import crontab, schedule, solar

from celery_recovery.beat.policy import (
    ON_TIME,
    CatchUp,
    EntryPolicy,
    Overlap,
    plan_runs,
    window_start,
)
from celery_recovery.beat.times import MAX_ENUMERATED, due_times, next_after
from celery_recovery.core.errors import ConfigurationError

T0 = datetime(2026, 12, 4, 12, 0, 0, 250_000, tzinfo=UTC)


@pytest.fixture
def app():
    app = Celery("times", set_as_current=False)
    app.conf.timezone = "Europe/Paris"
    yield app
    app.close()


def test_an_interval_adds_its_period_to_the_last_scheduled_time_whenever_asked(app):
    every = schedule(timedelta(seconds=10), app=app)
    # Asked late, or twice, the answer is the same: it does not drift with "now".
    assert next_after(every, T0, T0) == T0 + timedelta(seconds=10)
    assert next_after(every, T0, T0 + timedelta(minutes=5)) == T0 + timedelta(seconds=10)


def test_a_crontab_runs_in_the_apps_time_zone(app):
    # 07:00 in Paris is 06:00 UTC in December.
    daily = crontab(hour=7, minute=0, app=app)
    found = next_after(daily, T0, T0)
    assert found == datetime(2026, 12, 5, 6, 0, tzinfo=UTC)
    assert next_after(daily, found, T0) == found + timedelta(days=1)


def test_a_crontab_time_does_not_depend_on_when_it_is_asked(app):
    minutely = crontab(app=app)
    answers = {next_after(minutely, T0, T0 + timedelta(seconds=s)) for s in (0, 1, 29, 59)}
    assert answers == {datetime(2026, 12, 4, 12, 1, tzinfo=UTC)}


def test_a_solar_event_follows_the_last_one(app):
    sunrise = solar("sunrise", 48.85, 2.35, app=app)
    first = next_after(sunrise, T0, T0)
    second = next_after(sunrise, first, first)
    assert T0 < first < second
    assert timedelta(hours=23) < second - first < timedelta(hours=25)


def test_due_times_lists_the_window_and_counts_the_rest(app):
    every = schedule(timedelta(seconds=1), app=app)
    now = T0 + timedelta(seconds=100, milliseconds=500)
    due = due_times(every, T0, now, since=now - timedelta(seconds=10))
    assert due.listed == tuple(T0 + timedelta(seconds=s) for s in range(91, 101))
    assert due.passed == 90
    assert due.passed_last == T0 + timedelta(seconds=90)
    assert due.next == T0 + timedelta(seconds=101)


def test_a_huge_gap_is_crossed_in_one_jump(app):
    every = schedule(timedelta(seconds=1), app=app)
    now = T0 + timedelta(days=365)
    due = due_times(every, T0, now, since=now - timedelta(seconds=3))
    assert len(due.listed) == 3
    assert due.passed == 365 * 86400 - 3


def test_at_most_the_newest_runs_are_listed(app):
    every = schedule(timedelta(seconds=1), app=app)
    now = T0 + timedelta(seconds=MAX_ENUMERATED + 50)
    due = due_times(every, T0, now, since=T0)
    assert len(due.listed) == MAX_ENUMERATED
    assert due.listed[-1] == now
    assert due.passed == 50


def test_nothing_is_due_before_the_next_time(app):
    every = schedule(timedelta(seconds=10), app=app)
    due = due_times(every, T0, T0 + timedelta(seconds=9), since=T0 - timedelta(hours=1))
    assert due.listed == () and due.passed == 0 and due.next == T0 + timedelta(seconds=10)


# -- catch-up policies, with a moved clock -----------------------------------------------


def minutes(*values: int) -> list[datetime]:
    return [T0 + timedelta(minutes=m) for m in values]


def plan(catch_up: str, due: list[datetime], now: datetime, window: float = 3600, **kw):
    return plan_runs(EntryPolicy(CatchUp(catch_up), window), due, now, **kw)


def test_on_time_runs_are_sent_under_every_policy():
    now = T0 + timedelta(seconds=ON_TIME / 2)
    for policy in CatchUp:
        result = plan(policy, [T0], now)
        assert result.send == (T0,) and result.missed == 0 and result.missed_at is None


def test_latest_sends_the_newest_missed_run_once():
    now = T0 + timedelta(minutes=3, seconds=5)
    result = plan("latest", minutes(1, 2, 3), now)
    assert result.send == tuple(minutes(3))
    assert result.missed == 2 and result.missed_at == minutes(2)[0]


def test_latest_sends_nothing_older_than_the_window():
    now = T0 + timedelta(hours=3)
    result = plan("latest", minutes(60, 120), now, window=1800)
    assert result.send == () and result.missed == 2 and result.missed_at == minutes(120)[0]


def test_all_sends_every_missed_run_in_the_window_oldest_first():
    now = T0 + timedelta(minutes=30)
    result = plan("all", minutes(5, 10, 20, 25), now, window=1200)
    assert result.send == tuple(minutes(20, 25))
    assert result.missed == 2 and result.missed_at == minutes(10)[0]


def test_all_sends_at_most_the_limit_and_leaves_the_rest_due():
    now = T0 + timedelta(minutes=10)
    result = plan("all", minutes(1, 2, 3, 4), now, limit=2)
    assert result.send == tuple(minutes(1, 2)) and result.missed == 0


def test_skip_sends_only_a_run_on_time():
    late = plan("skip", minutes(1, 2), T0 + timedelta(minutes=2, seconds=ON_TIME + 1))
    assert late.send == () and late.missed == 2
    prompt = plan("skip", minutes(1, 2), T0 + timedelta(minutes=2, seconds=ON_TIME / 2))
    assert prompt.send == tuple(minutes(2)) and prompt.missed == 1


def test_runs_passed_over_before_the_window_are_counted_as_missed():
    now = T0 + timedelta(hours=5)
    result = plan("latest", [], now, passed=40, passed_last=minutes(100)[0])
    assert result.send == () and result.missed == 40 and result.missed_at == minutes(100)[0]


def test_the_window_is_never_shorter_than_on_time():
    policy = EntryPolicy(CatchUp.LATEST, 0.001)
    assert window_start(policy, T0) == T0 - timedelta(seconds=ON_TIME)


# -- declaring a policy ----------------------------------------------------------------


def test_an_entry_without_a_policy_gets_the_default():
    assert EntryPolicy.of("e", {"expires": 5}, 600.0) == EntryPolicy(CatchUp.LATEST, 600.0)


def test_a_policy_is_read_from_the_recovery_option():
    options = {"recovery": {"catch_up": "all", "catch_up_window": timedelta(minutes=5)}}
    assert EntryPolicy.of("e", options, 600.0) == EntryPolicy(CatchUp.ALL, 300.0)
    options = {"recovery": {"overlap": "buffer_one"}}
    policy = EntryPolicy.of("e", options, 600.0)
    assert policy == EntryPolicy(CatchUp.LATEST, 600.0, Overlap.BUFFER_ONE)
    assert policy.one_at_a_time and not EntryPolicy.of("e", {}, 1.0).one_at_a_time


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"catch_up": "sometimes"}, r"\['catch_up'\]='sometimes' is not a catch-up policy"),
        ({"catch_up_window": -1}, r"\['catch_up_window'\]=-1 must be a positive"),
        ({"catchup": "all"}, r"unknown keys \['catchup'\]"),
        ({"overlap": "queue"}, r"\['overlap'\]='queue' is not an overlap policy"),
        ("all", r"must be a dict"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_entry_and_key(given, message):
    with pytest.raises(ConfigurationError, match=r"beat_schedule\['report'\].*" + message):
        EntryPolicy.of("report", {"recovery": given}, 600.0)


def test_a_crontab_keeps_its_local_hour_when_the_app_does_not_use_utc(app):
    app.conf.enable_utc = False
    daily = crontab(hour=7, minute=30, app=app)
    found = next_after(daily, T0, T0)
    assert found == datetime(2026, 12, 5, 6, 30, tzinfo=UTC)  # 07:30 in Paris
