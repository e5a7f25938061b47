"""``db clean``: finished history older than the cutoff goes, in batches; nothing active does."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from celery import Celery
from sqlalchemy import create_engine, func, select, text

from celery_recovery import Recovery
from celery_recovery.core.audit import AuditAction, AuditReason, Decision
from celery_recovery.core.timeutils import utcnow
from celery_recovery.store.schema import (
    audit_log,
    callbacks,
    jobs,
    reservations,
    task_records,
    triggers,
)
from celery_recovery.sweeps.retention import CLEAN_TASK
from tests.builders import add_job, add_trigger, add_try
from tests.cli.helpers import run

DAY = 86400.0


def add_callback(store, created_age: float, claimed_for: float | None = None) -> int:
    now = utcnow()
    with store.transaction() as conn:
        return int(
            conn.execute(
                callbacks.insert()
                .values(
                    task_id="t",
                    try_number=1,
                    kind="failure",
                    payload={"x": 1},
                    created_at=now - timedelta(seconds=created_age),
                    claimed_by="sweep-1" if claimed_for else None,
                    claimed_until=now + timedelta(seconds=claimed_for) if claimed_for else None,
                )
                .returning(callbacks.c.id)
            ).scalar_one()
        )


def add_decision(store, age: float) -> int:
    at = utcnow() - timedelta(seconds=age)
    decision = Decision(at, AuditAction.REPUBLISHED, AuditReason.WORKER_LOST, "t", 1)
    with store.transaction() as conn:
        return int(
            conn.execute(
                audit_log.insert().values(**decision.row()).returning(audit_log.c.id)
            ).scalar_one()
        )


def ids(store, table, key) -> set:
    with store.transaction() as conn:
        return set(conn.execute(select(key)).scalars())


@pytest.fixture
def history(store):
    """Given old and recent, finished and active rows in every table."""
    old, recent = 40 * DAY, 1 * DAY
    keep, gone = set(), set()
    # Jobs: only finished ones that ended before the cutoff and no running try still names.
    keep.add(add_job(store, "worker", heartbeat_age=old))  # running, however stale
    keep.add(add_job(store, "worker", state="success", ended_age=recent))
    gone.add(add_job(store, "worker", state="failed", ended_age=old))
    gone.add(add_job(store, "beat", state="success", ended_age=old))
    needed = add_job(store, "worker", state="failed", ended_age=old)
    keep.add(needed)
    # Tries: finished states ended before the cutoff; never queued/running/deferred.
    for state in ("success", "failed", "up_for_retry", "revoked"):
        gone.add(add_try(store, state, ended_age=old))
        keep.add(add_try(store, state, ended_age=recent))
    for state in ("queued", "running", "deferred"):
        keep.add(add_try(store, state, ended_age=old))  # an old ended_at must not matter
    running_on_dead_job = add_try(store, "running", needed)
    keep.add(running_on_dead_job)
    # Triggers: old ones whose try is finished (or gone); never a deferred try's.
    deferred = add_try(store, "deferred")
    keep.add(deferred)
    finished = add_try(store, "success", ended_age=recent)
    keep.add(finished)
    triggers_keep = {
        add_trigger(store, deferred, None, created_age=old),
        add_trigger(store, finished, None, created_age=recent),
    }
    triggers_gone = {
        add_trigger(store, finished, None, created_age=old, try_number=1),
        add_trigger(store, "no-such-task", None, created_age=old),
    }
    # Reservations: old ones whose try is no longer queued; never a queued try's.
    queued = add_try(store, "queued")
    keep.add(queued)
    at = utcnow()
    store.tries.apply_writes(
        [
            ("reserved", (queued, 1, "some-job", at - timedelta(seconds=old))),
            ("reserved", (finished, 1, "some-job", at - timedelta(seconds=old))),
            ("reserved", (deferred, 1, "some-job", at - timedelta(seconds=recent))),
        ]
    )
    callbacks_keep = {add_callback(store, recent), add_callback(store, old, claimed_for=60)}
    # Revocations: only overdue queued tries consult them, long decided after 30 days.
    long_ago, lately = utcnow() - timedelta(seconds=old), utcnow() - timedelta(seconds=recent)
    store.revocations.record_revocations(
        [
            {"kind": "task", "task_id": "revoked-long-ago", "created_at": long_ago},
            {"kind": "purge", "queue": "q", "created_at": long_ago},
            {"kind": "task", "task_id": "revoked-lately", "created_at": lately},
        ]
    )
    callbacks_gone = {add_callback(store, old), add_callback(store, old, claimed_for=-60)}
    audit_keep = {add_decision(store, recent)}
    audit_gone = {add_decision(store, old), add_decision(store, old + DAY)}
    return {
        "keep": keep,
        "gone": gone,
        "audit_keep": audit_keep,
        "audit_gone": audit_gone,
        "triggers_keep": triggers_keep,
        "triggers_gone": triggers_gone,
        "callbacks_keep": callbacks_keep,
        "callbacks_gone": callbacks_gone,
        "reservations_keep": {queued, deferred},
    }


def test_clean_deletes_old_finished_rows_and_keeps_every_active_one(store, history):
    result = run(store.url, "db", "clean", "--before", "30d", "--yes", "--batch-size", "2")
    assert result.exit_code == 0, result.output
    counts = (
        "callbacks 2, triggers 2, reservations 1, task_records 4, jobs 2, revocations 2, "
        "claims 0, audit_log 2"
    )
    assert f"deleted: {counts}" in result.output
    assert ids(store, audit_log, audit_log.c.id) == history["audit_keep"]
    remaining = ids(store, task_records, task_records.c.task_id) | ids(store, jobs, jobs.c.id)
    assert history["keep"] <= remaining
    assert not history["gone"] & remaining
    assert ids(store, triggers, triggers.c.id) == history["triggers_keep"]
    assert ids(store, callbacks, callbacks.c.id) == history["callbacks_keep"]
    assert ids(store, reservations, reservations.c.task_id) == history["reservations_keep"]


def test_dry_run_only_counts(store, history):
    result = run(store.url, "db", "clean", "--before", "30d", "--dry-run")
    assert result.exit_code == 0
    counts = (
        "callbacks 2, triggers 2, reservations 1, task_records 4, jobs 2, revocations 2, "
        "claims 0, audit_log 2"
    )
    assert counts in result.output
    assert "dry run: nothing deleted" in result.output
    assert history["gone"] <= ids(store, task_records, task_records.c.task_id) | ids(
        store, jobs, jobs.c.id
    )


def test_clean_asks_before_deleting(store, history):
    refused = run(store.url, "db", "clean", "--before", "30d", input="n\n")
    assert refused.exit_code == 1 and "aborted: nothing deleted" in refused.output
    assert ids(store, callbacks, callbacks.c.id) >= history["callbacks_gone"]
    agreed = run(store.url, "db", "clean", "--before", "30d", input="y\n")
    assert agreed.exit_code == 0 and "Delete these 15 rows?" in agreed.output
    assert ids(store, callbacks, callbacks.c.id) == history["callbacks_keep"]


def test_table_option_limits_the_clean(store, history):
    result = run(store.url, "db", "clean", "--before", "30d", "--table", "callbacks", "--yes")
    assert result.exit_code == 0 and "deleted: callbacks 2" in result.output
    assert "task_records" not in result.output
    assert history["gone"] <= ids(store, task_records, task_records.c.task_id) | ids(
        store, jobs, jobs.c.id
    )


def test_iso_timestamp_cutoff(store, history):
    cutoff = (utcnow() - timedelta(days=30)).replace(tzinfo=None).isoformat()  # naive = UTC
    result = run(store.url, "db", "clean", "--before", cutoff, "--dry-run")
    assert result.exit_code == 0 and "task_records 4" in result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--before", "soon"], "is neither an ISO 8601 timestamp"),
        (["--before", "2999-01-01"], "is in the future"),
        (["--before", "30d", "--table", "leases"], "'leases' is not one of"),
        (["--before", "30d", "--batch-size", "0"], "--batch-size"),
        ([], "Missing option '--before'"),
    ],
)
def test_bad_options_are_one_clear_error(sqlite_url, args, says):
    result = run(sqlite_url, "db", "clean", *args)
    assert result.exit_code == 2 and says in result.output
    assert "Traceback" not in result.output


def test_unreachable_database_is_one_line():
    result = run("postgresql://u:pw@127.0.0.1:1/x", "db", "clean", "--before", "1d", "--yes")
    assert result.exit_code == 2 and "unavailable" in result.output
    assert ":pw@" not in result.output and len(result.output.strip().splitlines()) == 1


def test_beat_task_runs_the_same_retention(store, history):
    app = Celery("retention", broker="memory://", set_as_current=False)
    installed = Recovery(app, database_url=store.url)
    try:
        assert CLEAN_TASK in app.tasks
        report = app.tasks[CLEAN_TASK].apply(kwargs={"older_than": "30d", "batch_size": 3}).get()
    finally:
        installed.close()
        app.close()
    assert report["deleted"] == {
        "callbacks": 2,
        "triggers": 2,
        "reservations": 1,
        "task_records": 4,
        "jobs": 2,
        "revocations": 2,
        "claims": 0,
        "audit_log": 2,
        "task_heartbeats": 0,
    }
    assert history["keep"] <= ids(store, task_records, task_records.c.task_id) | ids(
        store, jobs, jobs.c.id
    )


# -- PostgreSQL: volume and row locks ------------------------------------------------

FINISHED_ROWS = 200_000


def bulk_finished_tries(url: str, count: int, ended_days_ago: int = 40) -> None:
    """Insert ``count`` finished tries server-side (INSERT ... SELECT generate_series)."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                INSERT INTO task_records (task_id, try_number, task_name, state, updated_at,
                                          ended_at, republishable, publish_count)
                SELECT 'old-' || n, 1, 'bulk.task',
                       (ARRAY['success','failed','up_for_retry','revoked'])[1 + n % 4],
                       now() - make_interval(days => :days),
                       now() - make_interval(days => :days), true, 1
                FROM generate_series(1, :count) AS n
                """
            ),
            {"count": count, "days": ended_days_ago},
        )
    engine.dispose()


def count_rows(url: str, where: str = "true") -> int:
    engine = create_engine(url)
    with engine.connect() as conn:
        found = conn.execute(
            select(func.count()).select_from(task_records).where(text(where))
        ).scalar_one()
    engine.dispose()
    return int(found)


@pytest.mark.postgres
def test_clean_of_many_finished_tries_in_batches_keeps_every_active_row(pg_url):
    from celery_recovery.store import Store

    store = Store(pg_url)
    try:
        bulk_finished_tries(pg_url, FINISHED_ROWS)
        active = {add_try(store, s, ended_age=40 * DAY) for s in ("queued", "running", "deferred")}
        recent = add_try(store, "success", ended_age=DAY)
        started = time.monotonic()
        result = run(pg_url, "db", "clean", "--before", "30d", "--yes", "--batch-size", "5000")
        elapsed = time.monotonic() - started
        assert result.exit_code == 0, result.output
        assert f"task_records {FINISHED_ROWS}" in result.output
        assert "(40 batches" in result.output
        assert count_rows(pg_url, "task_id LIKE 'old-%'") == 0
        assert ids(store, task_records, task_records.c.task_id) == active | {recent}
        assert elapsed < 60
    finally:
        store.dispose()


@pytest.mark.postgres
def test_clean_skips_rows_locked_by_a_concurrent_transaction_instead_of_waiting(pg_url):
    from celery_recovery.store import Store

    store = Store(pg_url)
    bulk_finished_tries(pg_url, 100)
    holder = create_engine(pg_url)
    conn = holder.connect()
    tx = conn.begin()
    # A sweep's compare-and-set holds the row lock of two finished tries.
    conn.execute(text("SELECT 1 FROM task_records WHERE task_id IN ('old-7', 'old-8') FOR UPDATE"))
    done = threading.Event()
    outcome: dict = {}

    def clean() -> None:
        outcome["result"] = run(pg_url, "db", "clean", "--before", "30d", "--yes")
        done.set()

    try:
        threading.Thread(target=clean, daemon=True).start()
        # Deterministic: the lock is held for the whole clean, so finishing proves it never
        # waited on it (a blocking clean would still be waiting when the deadline passes).
        assert done.wait(30), "db clean waited on a row another transaction holds"
        assert outcome["result"].exit_code == 0, outcome["result"].output
        assert (
            "deleted: callbacks 0, triggers 0, reservations 0, task_records 98"
            in outcome["result"].output
        )
        assert ids(store, task_records, task_records.c.task_id) == {"old-7", "old-8"}
    finally:
        tx.rollback()
        conn.close()
        holder.dispose()
    # Once released, the next clean takes them.
    assert run(pg_url, "db", "clean", "--before", "30d", "--yes").exit_code == 0
    assert count_rows(pg_url) == 0
    store.dispose()
