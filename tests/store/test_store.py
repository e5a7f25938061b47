"""The store on SQLite and PostgreSQL: schema, jobs, and compare-and-set transitions."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from celery_recovery import JobState, JobType, TaskState
from celery_recovery.core.records import Transition
from celery_recovery.core.timeutils import utcnow
from celery_recovery.messages.records import (
    AWAITING_PUBLISHER,
    capture_publish,
    record_from_capture,
)
from celery_recovery.store import Store, precompiled
from celery_recovery.store.migrate import VERSION_TABLE, current_revision, head_revision
from celery_recovery.store.schema import metadata
from tests.builders import queued, running


def test_migrations_build_exactly_the_declared_schema(store):
    assert current_revision(store.engine) == head_revision()
    with store.engine.connect() as conn:
        diff = compare_metadata(
            MigrationContext.configure(
                conn,
                opts={
                    "compare_type": False,
                    "version_table": VERSION_TABLE,
                    # Other tables may share the database (a user's, another test's).
                    "include_name": lambda name, kind, _: (
                        kind != "table" or name in metadata.tables
                    ),
                },
            ),
            metadata,
        )
    assert diff == []


def test_running_by_job_lookup_uses_a_partial_index(store):
    indexes = {ix["name"]: ix for ix in inspect(store.engine).get_indexes("task_records")}
    assert indexes["ix_task_records_running_job"]["column_names"] == ["job_id"]
    plan_sql = "SELECT task_id FROM task_records WHERE state = 'running' AND job_id = 'x'"
    with store.engine.connect() as conn:
        prefix = "EXPLAIN QUERY PLAN " if store.dialect == "sqlite" else "EXPLAIN "
        if store.dialect == "postgresql":
            conn.exec_driver_sql("SET enable_seqscan = off")
        plan = " ".join(str(row) for row in conn.exec_driver_sql(prefix + plan_sql))
    assert "ix_task_records_running_job" in plan


def test_transition_is_a_compare_and_set(store):
    store.tries.apply_writes([("queued", queued())])
    assert store.tries.mark_running(running())
    assert store.tries.transition("t1", 1, TaskState.RUNNING, TaskState.SUCCESS, ended_at=utcnow())
    # The same change again loses: the try is no longer running.
    assert not store.tries.transition("t1", 1, TaskState.RUNNING, TaskState.FAILED)
    # Another try's key never matches.
    assert not store.tries.transition("t1", 2, TaskState.SUCCESS, TaskState.FAILED)
    (row,) = store.tries.history("t1")
    assert row["state"] == TaskState.SUCCESS and row["job_id"] == "job-a"


def test_concurrent_transitions_of_one_try_have_exactly_one_winner(store):
    store.tries.mark_running(running())
    barrier = threading.Barrier(8)
    results: list[bool] = []

    def contend(index: int) -> None:
        barrier.wait()
        new = TaskState.SUCCESS if index % 2 else TaskState.UP_FOR_RETRY
        results.append(store.tries.transition("t1", 1, TaskState.RUNNING, new))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]


def test_publisher_record_after_worker_claim_keeps_running_state(store):
    # The worker's claim can land before the publisher's buffered queued record.
    assert store.tries.mark_running(running(args=None))
    store.tries.apply_writes([("queued", queued(headers={"root_id": "r"}))])
    (row,) = store.tries.history("t1")
    assert row["state"] == TaskState.RUNNING and row["job_id"] == "job-a"
    assert row["queued_at"] is not None and row["args"] == [1, 2]
    assert row["headers"] == {"root_id": "r"}


def test_a_narrow_claim_landing_first_is_not_publishable_until_the_publisher_record_lands(store):
    """A worker whose message its publisher records claims without the message (it is
    sent to the store once); until the publisher's record lands, a sweep must not
    publish the try again from a row without arguments."""
    assert store.tries.mark_running(
        running(args=None, republishable=False, republish_error=AWAITING_PUBLISHER)
    )
    (row,) = store.tries.history("t1")
    assert row["args"] is None and not row["republishable"]
    assert row["republish_error"] == AWAITING_PUBLISHER
    store.tries.apply_writes([("queued", queued(republishable=True, republish_error=None))])
    (row,) = store.tries.history("t1")
    assert row["state"] == TaskState.RUNNING and row["job_id"] == "job-a"
    assert row["args"] == [1, 2] and row["republishable"] and row["republish_error"] is None


def test_a_narrow_claim_after_the_publisher_record_keeps_the_message(store):
    store.tries.apply_writes([("queued", queued(republishable=True, republish_error=None))])
    store.tries.apply_writes(
        [("running", running(republishable=False, republish_error=AWAITING_PUBLISHER))]
    )
    (row,) = store.tries.history("t1")
    assert row["state"] == TaskState.RUNNING
    assert row["args"] == [1, 2] and row["republishable"] and row["republish_error"] is None


def test_claim_is_refused_for_a_finished_try(store):
    store.tries.mark_running(running())
    store.tries.transition("t1", 1, TaskState.RUNNING, TaskState.SUCCESS)
    assert not store.tries.mark_running(running(job_id="job-b"))
    (row,) = store.tries.history("t1")
    assert row["state"] == TaskState.SUCCESS and row["job_id"] == "job-a"


def test_redelivered_running_try_is_claimed_by_the_new_job(store):
    store.tries.mark_running(running(job_id="job-a"))
    assert store.tries.mark_running(running(job_id="job-b"))
    assert store.tries.history("t1")[0]["job_id"] == "job-b"


def test_tries_are_kept_as_history(store):
    store.tries.mark_running(running(try_number=1))
    store.tries.transition("t1", 1, TaskState.RUNNING, TaskState.UP_FOR_RETRY)
    store.tries.apply_writes([("queued", queued(try_number=2))])
    store.tries.mark_running(running(try_number=2))
    store.tries.transition("t1", 2, TaskState.RUNNING, TaskState.SUCCESS)
    assert [(r["try_number"], r["state"]) for r in store.tries.history("t1")] == [
        (1, TaskState.UP_FOR_RETRY),
        (2, TaskState.SUCCESS),
    ]


def test_batched_writes_apply_in_order(store):
    now = utcnow()
    store.tries.apply_writes(
        [
            ("queued", queued("a")),
            ("running", running("a")),
            ("transition", Transition("a", 1, (TaskState.RUNNING,), {"state": "success"})),
            ("queued", queued("b")),
            ("transition", Transition("b", None, (TaskState.QUEUED,), {"state": "revoked"})),
            ("transition", Transition("a", 1, (TaskState.RUNNING,), {"state": "failed"})),
        ]
    )
    assert store.tries.history("a")[0]["state"] == "success"
    assert store.tries.history("b")[0]["state"] == "revoked"
    assert store.tries.history("a")[0]["updated_at"] >= now - timedelta(seconds=5)


def test_a_batch_gives_the_rows_that_writing_each_alone_gives(store):
    """A batch is one statement per run of distinct tries on PostgreSQL: a try that
    repeats in it, and every kind of value, must come out as single writes leave them."""
    odd = 'quote " backslash \\ newline \n ünïcode ☃'

    def writes(prefix):
        return [
            ("queued", queued(f"{prefix}a", headers={"root_id": odd}, priority=None)),
            ("queued", queued(f"{prefix}b", args=[odd, 1.5, None, True], republishable=False)),
            ("queued", queued(f"{prefix}a", headers={"root_id": "second"}, eta=utcnow())),
            ("running", running(f"{prefix}a", job_id="job-a", worker_pid=7)),
            ("running", running(f"{prefix}b", job_id="job-a", error=odd)),
            ("running", running(f"{prefix}a", job_id="job-b", fencing_token=2**40)),
        ]

    store.tries.apply_writes(writes("batch-"))
    for write in writes("single-"):
        store.tries.apply_writes([write])

    def rows(prefix):
        out = []
        for name in ("a", "b"):
            (row,) = store.tries.history(f"{prefix}{name}")
            out.append(
                {k: v for k, v in row.items() if k not in ("task_id", "external_executor_id")}
            )
        return out

    batched, single = rows("batch-"), rows("single-")
    for row in batched + single:  # the times are each write's own
        for key in ("queued_at", "updated_at", "started_at", "eta"):
            row[key] = row[key] is not None
    assert batched == single
    a, b = batched
    assert a["job_id"] == "job-b" and a["deaths"] == 1 and a["fencing_token"] == 2**40
    assert a["headers"] == {"root_id": "second"} and a["eta"]
    assert b["args"] == [odd, 1.5, None, True] and b["error"] == odd and not b["republishable"]


def test_batched_times_keep_their_microseconds(store):
    at = utcnow().replace(microsecond=123456)
    store.tries.apply_writes(
        [("queued", queued("a", queued_at=at)), ("queued", queued("b", queued_at=at))]
    )
    assert store.tries.history("a")[0]["queued_at"] == at
    assert store.tries.history("b")[0]["queued_at"] == at


@pytest.mark.parametrize(
    "at",
    [
        datetime(2026, 12, 1, 10, 0, 0, 0, tzinfo=UTC),
        datetime(2026, 12, 1, 10, 0, 0, 999999, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC),  # before the epoch
        datetime(2900, 1, 1, 0, 0, 0, 654321, tzinfo=UTC),  # an ETA far ahead
        datetime(2026, 3, 29, 2, 30, 0, 7, tzinfo=timezone(timedelta(hours=-5))),
    ],
    ids=["whole-second", "last-microsecond", "before-epoch", "far-ahead", "other-offset"],
)
def test_a_batch_writes_every_time_exactly(store, at):
    """Batched rows carry their times in another form than single writes (epoch
    microseconds in a JSON array on PostgreSQL): each must read back as the same instant."""
    rows = [queued(name, queued_at=at, eta=at, updated_at=at) for name in ("a", "b")]
    store.tries.apply_writes([("queued", row) for row in rows])
    for name in ("a", "b"):
        (row,) = store.tries.history(name)
        assert (row["queued_at"], row["eta"], row["updated_at"]) == (at, at, at)
        assert row["queued_at"].tzinfo is not None


def test_job_heartbeat_and_end_are_compare_and_set(store):
    now = utcnow()
    job = {
        "id": "j1",
        "job_type": JobType.WORKER,
        "hostname": "h",
        "pid": 1,
        "state": JobState.RUNNING,
        "start_date": now,
        "latest_heartbeat": now,
    }
    store.jobs.add_job(job)
    store.jobs.add_job(job)  # a second registration changes nothing
    later = now + timedelta(seconds=3)
    assert store.jobs.heartbeat("j1", later)
    assert store.jobs.get_job("j1")["latest_heartbeat"] == later
    assert store.jobs.end_job("j1", JobState.SUCCESS, later)
    assert not store.jobs.heartbeat("j1", later + timedelta(seconds=1))
    assert not store.jobs.end_job("j1", JobState.FAILED, later)
    assert store.jobs.get_job("j1")["state"] == JobState.SUCCESS


def test_sqlite_store_runs_in_wal_mode(sqlite_url):
    store = Store(sqlite_url)
    store.ensure_ready()
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    store.dispose()


def test_timestamps_come_back_as_aware_utc(store):
    store.tries.apply_writes([("queued", queued())])
    assert store.tries.history("t1")[0]["queued_at"].utcoffset() == timedelta(0)
    with pytest.raises(Exception, match="naive datetime"):
        store.tries.apply_writes(
            [("queued", queued("t2", queued_at=utcnow().replace(tzinfo=None)))]
        )


@pytest.mark.parametrize("encoder", ["orjson", "standard library"])
def test_a_batch_of_published_records_reads_back_as_written_with_either_encoder(
    store, monkeypatch, encoder
):
    # On PostgreSQL a batch travels as one JSON array (orjson when installed, else the
    # standard library's encoder): the payloads in it are JSON text to escape again.
    if encoder == "orjson":
        pytest.importorskip("orjson", reason="the postgres extra installs orjson on CPython")
    else:
        monkeypatch.setattr(precompiled, "_orjson_dumps", None)
    args = ["naïve — ✓ 漢字", 'quote " and \\ and \n', uuid.UUID(int=7), 2**62, None, True]
    kwargs = {"when": datetime(2026, 12, 3, 7, 0, 0, 1, tzinfo=timezone(timedelta(hours=2)))}
    eta = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
    headers = {"id": "", "task": "proj.add", "retries": 0, "lang": "py", "x-tenant": "é\t\\"}
    body = (args, kwargs, {"callbacks": None, "errbacks": None, "chain": None, "chord": None})
    records = []
    for n in range(3):
        headers = {**headers, "id": f"batch-{n}", "eta": eta.isoformat()}
        capture = capture_publish(headers, body, "", "celery", None, {"priority": 3}, 1.5e9 + n)
        assert capture is not None
        records.append(record_from_capture(capture))
    store.tries.apply_writes([("queued", record) for record in records])
    for n in range(3):
        (row,) = store.tries.history(f"batch-{n}")
        assert row["args"] == args and row["kwargs"] == kwargs
        assert row["headers"] == {"lang": "py", "x-tenant": "é\t\\"}
        assert row["eta"] == eta and row["priority"] == 3
        assert row["queued_at"] == datetime.fromtimestamp(1.5e9 + n, UTC)
        assert row["republishable"] and row["state"] == TaskState.QUEUED
