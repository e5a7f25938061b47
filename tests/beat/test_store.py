"""The beat store: runs claimed once, by a leader whose lease and token still hold.

On SQLite and PostgreSQL; time is passed in, never slept.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.exc import DBAPIError

from celery_recovery.beat.leadership import LEASE
from celery_recovery.core.audit import AuditAction, AuditReason, beat_decision
from celery_recovery.core.records import MissedRuns
from celery_recovery.store import Fence, Store
from celery_recovery.store.engine import create_store_engine
from celery_recovery.store.schema import beat_entries

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
TTL = 5.0


def lead(store, holder: str, now: datetime) -> Fence:
    token = store.leases.acquire_lease(LEASE, holder, now, TTL)
    assert token is not None, f"{holder} could not take the lease"
    return Fence(LEASE, holder, token)


def registered(store, name: str = "e", anchor: datetime = T0) -> None:
    store.beat.register_entries([{"name": name, "task": "t", "schedule": "<1s>"}], anchor)


def test_entries_are_registered_once_and_keep_their_runs(store):
    registered(store)
    fence = lead(store, "a", T0)
    assert store.beat.claim_run("e", T0, T0 + timedelta(seconds=1), "id1", fence, T0)
    # A beat starting later registers the same entry: its anchor does not reset the runs.
    store.beat.register_entries(
        [{"name": "e", "task": "t2", "schedule": "<2s>"}], T0 + timedelta(1)
    )
    row = store.beat.entry("e")
    assert row["last_run_at"] == T0 + timedelta(seconds=1)
    assert (row["task"], row["schedule"], row["pending_task_id"]) == ("t2", "<2s>", "id1")


def test_a_scheduled_time_is_claimed_once(store):
    registered(store)
    fence = lead(store, "a", T0)
    run = T0 + timedelta(seconds=1)
    assert store.beat.claim_run("e", T0, run, "id1", fence, T0)
    # The same time again (a retry, a second beat reading the old row) loses.
    assert not store.beat.claim_run("e", T0, run, "id1", fence, T0)
    assert store.beat.mark_sent("e", "id1", fence.token, T0)
    assert not store.beat.claim_run("e", T0, run, "id1", fence, T0)
    row = store.beat.entry("e")
    assert (row["last_task_id"], row["last_sent_run_at"], row["pending_task_id"]) == (
        "id1",
        run,
        None,
    )
    assert row["total_run_count"] == 1


def test_an_unsent_run_blocks_the_next_claim_until_it_is_sent(store):
    registered(store)
    fence = lead(store, "a", T0)
    assert store.beat.claim_run("e", T0, T0 + timedelta(seconds=1), "id1", fence, T0)
    later = T0 + timedelta(seconds=2)
    assert not store.beat.claim_run("e", T0 + timedelta(seconds=1), later, "id2", fence, T0)


def test_a_leader_whose_lease_expired_claims_nothing(store):
    registered(store)
    fence = lead(store, "a", T0)
    woke = T0 + timedelta(seconds=TTL + 1)  # paused past its lease; nobody took it yet
    assert not store.beat.claim_run("e", T0, T0 + timedelta(seconds=1), "id1", fence, woke)


def test_a_stale_token_claims_nothing_after_a_takeover(store):
    registered(store)
    old = lead(store, "a", T0)
    later = T0 + timedelta(seconds=TTL + 1)
    new = lead(store, "b", later)
    assert new.token == old.token + 1
    run = T0 + timedelta(seconds=1)
    # The old leader wakes with its clock right, its lease row now someone else's.
    assert not store.beat.claim_run("e", T0, run, "id1", old, T0 + timedelta(seconds=1))
    assert store.beat.claim_run("e", T0, run, "id1", new, later)


def test_a_leader_paused_inside_its_claim_neither_blocks_its_successor_nor_commits(pg_url):
    store = Store(pg_url)
    store.ensure_ready()
    registered(store)
    old = lead(store, "a", T0)
    # The leader is stopped between the statements of a claim: its session sits in
    # an open transaction with the entry's row locked.
    leader_engine = create_store_engine(pg_url)
    paused = leader_engine.connect()
    try:
        paused.begin()
        paused.execute(
            update(beat_entries)
            .where(beat_entries.c.name == "e")
            .values(pending_task_id="id1", pending_token=old.token)
        )
        later = T0 + timedelta(seconds=TTL + 1)
        new = lead(store, "b", later)
        # The standby's claim gets the row once the server ends the idle session,
        # instead of failing at the statement timeout (and again at every tick).
        assert store.beat.claim_run("e", T0, T0 + timedelta(seconds=1), "id2", new, later)
        # When the old leader wakes, its half-made claim cannot commit.
        with pytest.raises(DBAPIError):
            paused.commit()
        row = store.beat.entry("e")
        assert (row["pending_task_id"], row["pending_token"]) == ("id2", new.token)
    finally:
        paused.invalidate()
        paused.close()
        leader_engine.dispose()
        store.dispose()


def test_the_next_leader_adopts_an_unsent_run_and_the_old_one_cannot_confirm_it(store):
    registered(store)
    old = lead(store, "a", T0)
    assert store.beat.claim_run("e", T0, T0 + timedelta(seconds=1), "id1", old, T0)
    later = T0 + timedelta(seconds=TTL + 1)
    new = lead(store, "b", later)
    decision = beat_decision(
        AuditAction.BEAT_RESENT, AuditReason.BEAT_UNSENT_CLAIM, "e", "t", "id1", "adopted"
    )
    assert store.beat.adopt_pending("e", "id1", old.token, new, later, decision)
    assert not store.beat.mark_sent("e", "id1", old.token, later)
    assert store.beat.mark_sent("e", "id1", new.token, later)
    with store.transaction() as conn:
        actions = [r[0] for r in conn.exec_driver_sql("SELECT action FROM audit_log")]
    assert actions == ["beat_resent"]


def test_missed_runs_are_recorded_without_a_claim(store):
    registered(store)
    fence = lead(store, "a", T0)
    missed_at = T0 + timedelta(minutes=5)
    assert store.beat.record_missed("e", T0, fence, T0, MissedRuns(300, missed_at, "down"))
    row = store.beat.entry("e")
    assert row["last_run_at"] == missed_at and row["pending_task_id"] is None
    assert (row["missed_count"], row["last_missed_reason"]) == (300, "down")


def test_a_released_lease_goes_to_the_next_beat_at_once_with_a_new_token(store):
    first = lead(store, "a", T0)
    assert store.leases.acquire_lease(LEASE, "b", T0, TTL) is None
    assert store.leases.release_lease(LEASE, "a")
    assert store.leases.acquire_lease(LEASE, "b", T0, TTL) == first.token + 1
    assert store.leases.lease(LEASE)["holder"] == "b"


def test_the_beat_migration_goes_down_and_up_again(store_url):
    from alembic import command
    from sqlalchemy import inspect

    from celery_recovery.store.engine import create_store_engine
    from celery_recovery.store.migrate import HEAD_REVISION, alembic_config, current_revision

    ready = Store(store_url)
    ready.ensure_ready()
    ready.dispose()
    engine = create_store_engine(store_url, for_migrations=True)
    try:
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0012")
        assert not inspect(engine).has_table("beat_entries")
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
        assert inspect(engine).has_table("beat_entries")
        assert current_revision(engine) == HEAD_REVISION
    finally:
        engine.dispose()
