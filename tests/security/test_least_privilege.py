"""Claim: the package runs with the least privileges docs/security.md documents
(docs/security.md, "Least privileges").

The grants are read from the documentation itself, so the page and the test
cannot drift apart: a PostgreSQL role with exactly the documented grants runs
the whole workload and cannot change the schema; a Redis ACL user with exactly
the documented line runs the locks and nothing else.
"""

from __future__ import annotations

import json
import re
import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, text
from sqlalchemy.exc import ProgrammingError

from celery_recovery import JobType, TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.locks.redis_lock import ACQUIRED, DONE, HELD, IdempotencyLocks
from celery_recovery.recovery import recovery_for_app
from celery_recovery.store import FAILURE, RESUME, SUCCESS, Finish, Firing, Store
from celery_recovery.store.engine import create_store_engine
from celery_recovery.store.migrate import upgrade
from tests.builders import add_job, add_try, make_zombie
from tests.cli.helpers import run
from tests.services import BROKER_DB, PG_ADMIN_URL, REDIS_URL, require
from tests.sweeps.helpers import count

DOC = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()


def doc_blocks(section: str, language: str) -> list[str]:
    """The fenced ``language`` blocks of the ``### section`` part of the page."""
    part = DOC.split(f"### {section}\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", part, re.S)


def sql_statements(block: str) -> list[str]:
    lines = [line for line in block.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


@pytest.fixture
def least_privileged_pg() -> Iterator[tuple[str, str]]:
    """A fresh database migrated by the superuser, with the documented roles and grants.

    Yields (the app role's URL, the superuser's URL of the same database).
    """
    require("PostgreSQL", PG_ADMIN_URL, 5432)
    uid = uuid.uuid4().hex[:8]
    name, app_role, migrator = f"recovery_priv_{uid}", f"ra_{uid}", f"rm_{uid}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    superuser_url = f"{base}/{name}"
    engine = create_store_engine(superuser_url, for_migrations=True)
    upgrade(engine)
    engine.dispose()
    statements = [
        s.replace("recovery_migrator", migrator)
        .replace("recovery_app", app_role)
        .replace("DATABASE recovery", f'DATABASE "{name}"')
        for block in doc_blocks("PostgreSQL", "sql")
        for s in sql_statements(block)
    ]
    assert len(statements) >= 9, statements
    db_admin = create_engine(superuser_url, isolation_level="AUTOCOMMIT")
    with db_admin.connect() as conn:
        for statement in statements:
            conn.execute(text(statement))
    db_admin.dispose()
    host = base.split("@", 1)[1]
    try:
        yield f"postgresql+psycopg://{app_role}:change-me-too@{host}/{name}", superuser_url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'DROP ROLE IF EXISTS "{app_role}"'))
            conn.execute(text(f'DROP ROLE IF EXISTS "{migrator}"'))
        admin.dispose()


def test_the_documented_postgresql_grants_run_the_whole_workload_and_no_ddl(
    least_privileged_pg, make_client_app, tmp_path
):
    url, _superuser_url = least_privileged_pg
    app = make_client_app(url)
    recovery = recovery_for_app(app)
    store = recovery.store
    now = utcnow()

    # A task's lifecycle through the Store API.
    job = add_job(store)
    assert store.jobs.heartbeat(job, now)
    task = add_try(store, "queued", task_name="lifecycle.add")
    assert store.tries.mark_running(
        {
            "task_id": task,
            "try_number": 1,
            "task_name": "lifecycle.add",
            "state": "running",
            "job_id": job,
            "started_at": now,
            "updated_at": now,
        }
    )
    assert store.tries.transition(task, 1, TaskState.RUNNING, TaskState.SUCCESS, ended_at=now)

    # A sweep: one zombie failed (max_retries=0) with its callback, one published again.
    ledger = tmp_path / "ledger"
    make_zombie(store, "z-fail", task_name="lifecycle.ledger_sleep_once", args=(str(ledger), 1))
    make_zombie(store, "z-retry", job_id="deadjob2")
    report = recovery.sweep()
    assert (report.failed, report.republished, report.errors) == (1, 1, 0)
    # The failed try's on_failure and the retried try's on_retry.
    assert report.callbacks_delivered == 2 and count(ledger, "on_failure") == 1
    assert store.outbox.pending_callbacks() == []

    # Deferral and the triggerer's claim, fire and finish.
    triggerer = add_job(store, job_type=JobType.TRIGGERER.value)
    for n in (1, 2, 3):
        record = {
            "task_id": f"d{n}",
            "try_number": 1,
            "task_name": "lifecycle.add",
            "state": "running",
            "updated_at": now,
            "external_executor_id": f"d{n}",
        }
        trigger = {"classpath": "m.T", "kwargs": {"n": n}, "queue": "q", "created_at": now}
        assert store.triggers.defer_try(record, trigger, now) == (True, None)
    rows = {r["task_id"]: r for r in store.triggers.claim_triggers(triggerer, ["q"], 10, now, 30)}
    assert sorted(rows) == ["d1", "d2", "d3"]
    header = ("recovery_resume", {"method": "m", "kwargs": {}, "event": 1})
    decided, _ = store.triggers.fire_triggers(
        triggerer, [Firing(rows["d1"]["id"], "d1", 1, RESUME, {"n": 1}, header)], now
    )
    assert decided[rows["d1"]["id"]][0] == RESUME
    finishes = [
        Finish(rows["d2"]["id"], "d2", 1, SUCCESS, "completed by its trigger"),
        Finish(rows["d3"]["id"], "d3", 1, FAILURE, "failed", "boom", "E"),
    ]
    assert store.triggers.finish_triggers(triggerer, finishes, now) == 2
    assert store.triggers.release_triggers(triggerer) == 1
    assert store.leases.acquire_lease("priv-test", "me", now, 10) is not None

    # The operator commands, as the same role.
    assert run(url, "db", "current").exit_code == 0
    assert run(url, "inspect", "jobs", "--json").exit_code == 0
    assert run(url, "jobs", "check", "--job-type", "triggerer").exit_code == 0
    add_try(store, "success", ended_age=7200)
    cleaned = run(url, "db", "clean", "--before", "1h", "--yes")
    assert cleaned.exit_code == 0 and "deleted: " in cleaned.output, cleaned.output

    # No DDL.
    engine = create_engine(url)
    try:
        for ddl in (
            "CREATE TABLE intruder (i int)",
            "DROP TABLE jobs",
            "ALTER TABLE jobs ADD COLUMN intruder int",
            "TRUNCATE task_records",
            "CREATE INDEX intruder ON jobs (pid)",
        ):
            with engine.begin() as conn, pytest.raises(ProgrammingError, match=r"permission|owner"):
                conn.execute(text(ddl))
    finally:
        engine.dispose()
    assert Store(url).jobs.list_jobs()  # everything is still there


@pytest.fixture
def acl_redis_url() -> Iterator[str]:
    """A Redis ACL user made from the documented ``ACL SETUSER`` line; deleted afterwards."""
    require("Redis", REDIS_URL, 6379)
    [block] = doc_blocks("Redis", "text")
    [line] = [ln for ln in block.splitlines() if ln.startswith("ACL SETUSER")]
    user = f"recovery_locks_{uuid.uuid4().hex[:8]}"
    admin = redis.Redis.from_url(f"{REDIS_URL}/{BROKER_DB}")
    admin.execute_command(*shlex.split(line.replace("recovery_locks", user)))
    try:
        yield f"redis://{user}:change-me@{REDIS_URL.split('://', 1)[1]}/{BROKER_DB}"
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        for key in admin.scan_iter(match="celery-recovery:*:priv-*"):
            admin.delete(key)
        admin.close()


def test_the_documented_redis_acl_runs_the_locks_and_nothing_else(acl_redis_url):
    key, other = f"priv-{uuid.uuid4().hex[:8]}", f"priv-{uuid.uuid4().hex[:8]}"
    locks = IdempotencyLocks.from_url(acl_redis_url)
    try:
        for script in (locks._acquire, locks._renew, locks._release):
            assert locks.client.script_load(script.script) == script.sha
        got = locks.acquire(key, "me", 10)
        assert got.outcome == ACQUIRED
        assert locks.acquire(key, "you", 10).outcome == HELD
        assert locks.renew(key, got.value, 10)
        assert locks.renew_many([(key, got.value, 10)]) == [True]
        assert locks.holder_of(key)[:2] == ("me", got.token)
        held = locks.acquire(other, "them", 30)
        assert locks.release(key, got.value, json.dumps({"ok": 1}), 10)
        done = locks.acquire(key, "me", 10)
        assert done.outcome == DONE and json.loads(done.result) == {"ok": 1}

        from click.testing import CliRunner

        from celery_recovery.cli import recovery as cli

        result = CliRunner().invoke(
            cli, ["inspect", "locks", "--json"], env={"CELERY_RECOVERY_REDIS_URL": acl_redis_url}
        )
        assert result.exit_code == 0, result.output
        assert other in [row["key"] for row in json.loads(result.output)]
        assert locks.release(other, held.value, None, 10)

        for denied in (
            lambda: locks.client.set("not-ours", 1),
            lambda: locks.client.get("not-ours"),
            lambda: locks.client.flushdb(),
            lambda: locks.client.keys("*"),
            lambda: locks.client.config_get("maxmemory"),
            lambda: locks.client.eval("return 1", 0),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                denied()
    finally:
        locks.client.close()


def test_the_doc_names_every_command_the_lock_scripts_call():
    """If a script starts calling another command, the ACL line must say so."""
    from celery_recovery.locks import redis_lock

    called = set()
    for script in (redis_lock._ACQUIRE, redis_lock._RENEW, redis_lock._RELEASE):
        called |= {c.lower() for c in re.findall(r"redis\.call\('(\w+)'", script)}
    [block] = doc_blocks("Redis", "text")
    allowed = set(re.findall(r"\+([\w|]+)", block))
    assert called <= allowed, called - allowed
