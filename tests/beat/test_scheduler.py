"""The scheduler in this process, against a real store and Redis broker, with its clock moved.

A leader that dies between claiming a run and recording it sent is played by
the store calls it would have made; the scheduler under test is the next leader.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from prometheus_client import REGISTRY

from celery_recovery.beat import Scheduler, run_task_id
from celery_recovery.beat.leadership import LEASE, SAFETY, Leadership
from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.core.timeutils import utcnow
from celery_recovery.recovery import recovery_for_app
from celery_recovery.store import Fence
from celery_recovery.store.schema import beat_entries
from tests.beat.conftest import queued_runs

ENTRY = {"e": {"task": "lifecycle.noop", "schedule": 3600.0}}


@pytest.fixture
def app(client_app):
    client_app.conf.beat_schedule = ENTRY
    return client_app


def dead_leaders_claim(store, now):
    """A leader (token 1) registered the entry an hour ago, claimed its run, and died."""
    anchor = now - timedelta(hours=1, seconds=5)
    store.beat.register_entries([{"name": "e", "task": "lifecycle.noop"}], anchor)
    taken = now - timedelta(seconds=30)
    token = store.leases.acquire_lease(LEASE, "dead", taken, 1.0)
    run_at = anchor + timedelta(hours=1)
    task_id = run_task_id("e", run_at)
    assert store.beat.claim_run("e", anchor, run_at, task_id, Fence(LEASE, "dead", token), taken)
    return run_at, task_id


def audit_actions(store):
    with store.transaction() as conn:
        return [r[0] for r in conn.exec_driver_sql("SELECT action FROM audit_log ORDER BY id")]


def beat_runs(outcome):
    return REGISTRY.get_sample_value("celery_recovery_beat_runs_total", {"outcome": outcome})


def test_the_next_leader_sends_a_claimed_unsent_run_again_marked_as_a_possible_copy(
    app, store, broker_urls, queue
):
    run_at, task_id = dead_leaders_claim(store, utcnow())
    resent, taken = (
        beat_runs("resent"),
        REGISTRY.get_sample_value("celery_recovery_beat_lead_changes_total", {"change": "taken"}),
    )
    scheduler = Scheduler(app=app)
    try:
        scheduler.tick()
    finally:
        scheduler.close()
    copies = queued_runs(broker_urls[0], queue, copies=True)
    assert copies == [("lifecycle.noop", task_id, run_at)]
    assert queued_runs(broker_urls[0], queue) == []  # it carries the resent mark
    row = store.beat.entry("e")
    assert (row["pending_task_id"], row["last_task_id"]) == (None, task_id)
    assert audit_actions(store) == ["beat_lead_taken", "beat_resent"]
    assert beat_runs("resent") == resent + 1
    assert (
        REGISTRY.get_sample_value("celery_recovery_beat_lead_changes_total", {"change": "taken"})
        == taken + 1
    )


def test_a_claimed_run_whose_publish_is_recorded_is_confirmed_not_sent_again(
    app, store, broker_urls, queue
):
    run_at, task_id = dead_leaders_claim(store, utcnow())
    confirmed = beat_runs("confirmed")
    # The dead leader had published it: its publish record reached the store.
    app.send_task("lifecycle.noop", task_id=task_id)
    assert recovery_for_app(app).flush(timeout=10)
    scheduler = Scheduler(app=app)
    try:
        scheduler.tick()
    finally:
        scheduler.close()
    assert len(queued_runs(broker_urls[0], queue, copies=True)) == 0  # only the plain publish
    row = store.beat.entry("e")
    assert (row["pending_task_id"], row["last_task_id"], row["last_sent_run_at"]) == (
        None,
        task_id,
        run_at,
    )
    assert beat_runs("confirmed") == confirmed + 1


def test_a_clean_stop_gives_the_lead_up(app, store):
    scheduler = Scheduler(app=app)
    scheduler.tick()
    assert store.leases.lease(LEASE)["holder"] == scheduler.leadership.holder
    scheduler.close()
    assert store.leases.lease(LEASE)["holder"] is None


def test_a_standby_sends_nothing(app, store, broker_urls, queue):
    store.leases.acquire_lease(LEASE, "other", utcnow(), 60.0)
    store.beat.register_entries([{"name": "e", "task": "t"}], utcnow() - timedelta(hours=2))
    scheduler = Scheduler(app=app)
    try:
        wait = scheduler.tick()
    finally:
        scheduler.close()
    assert not scheduler.leadership.leading
    assert 0 < wait <= scheduler.leadership.renew_every
    assert queued_runs(broker_urls[0], queue, copies=True) == []


def test_the_scheduler_needs_recovery_installed(make_client_app):
    plain = make_client_app(None)
    with pytest.raises(ConfigurationError, match=r"Recovery\(app\)"):
        Scheduler(app=plain)


def test_a_bad_entry_policy_stops_beat_at_start(make_client_app, store_url):
    app = make_client_app(store_url)
    app.conf.beat_schedule = {
        "e": {"task": "t", "schedule": 1.0, "options": {"recovery": {"catch_up": "twice"}}}
    }
    with pytest.raises(ConfigurationError, match=r"beat_schedule\['e'\].*'twice'"):
        Scheduler(app=app)


# -- the lease, with a moved monotonic clock --------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_leader_stops_publishing_before_its_lease_can_lapse(store):
    settings = RecoverySettings(heartbeat_interval=0.5, sweep_interval=1.0)
    mono = Clock()
    leadership = Leadership(store, settings, utcnow, "me", monotonic=mono)
    assert leadership.refresh() == (True, None)
    assert leadership.may_publish()
    # Paused (SIGSTOP) past the safe part of its lease: no publish, whatever the store says.
    mono.now += settings.sweep_interval * (1 - SAFETY) + 0.01
    assert not leadership.may_publish()
    # Its next renewal, once due, confirms the lead again (nobody took it).
    assert leadership.refresh() == (False, None)
    assert leadership.may_publish()


def test_renewals_and_attempts_are_paced(store):
    settings = RecoverySettings(heartbeat_interval=0.5, sweep_interval=1.0)
    mono = Clock()
    leadership = Leadership(store, settings, utcnow, "me", monotonic=mono)
    leadership.refresh()
    assert leadership.renew_every == 0.25
    assert leadership.wait() == pytest.approx(0.25)
    store.leases.release_lease(LEASE, "me")
    store.leases.acquire_lease(LEASE, "other", utcnow(), 60.0)
    assert leadership.refresh() == (False, None)  # not due yet: still believes it leads
    mono.now += 0.25
    assert leadership.refresh() == (False, 1)  # due: finds the lead lost
    assert not leadership.leading and not leadership.may_publish()


def test_a_leader_whose_lease_was_taken_behind_its_back_sends_nothing_and_does_not_spin(
    app, store, broker_urls, queue
):
    scheduler = Scheduler(app=app)
    mono = Clock()
    scheduler.leadership._monotonic = mono  # no renewal falls due during the test
    try:
        scheduler.tick()
        assert scheduler.leadership.leading
        # Its lease goes to another beat (its own clock still says it may publish) ...
        store.leases.release_lease(LEASE, scheduler.leadership.holder)
        store.leases.acquire_lease(LEASE, "other", utcnow(), 60.0)
        # ... while its entry falls due
        with store.transaction() as conn:
            conn.execute(beat_entries.update().values(last_run_at=utcnow() - timedelta(hours=2)))
        scheduler.ledger.rows.clear()  # read the rows again
        wait = scheduler.tick()
    finally:
        scheduler.close()
    # Then its claim fails in the store: nothing is sent, and it waits before trying again
    assert queued_runs(broker_urls[0], queue, copies=True) == []
    assert wait >= scheduler.leadership.renew_every / 2
    assert store.beat.entry("e")["total_run_count"] == 0
