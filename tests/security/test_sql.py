"""Claim: SQL is parameterised (docs/security.md, "SQL").

Every statement is built with SQLAlchemy Core (values travel as bound
parameters); no value is formatted into SQL text.  A scan of the package
source fails on any string formatting passed to ``execute``,
``exec_driver_sql`` or ``text()``; hostile names round-trip through the store
and the CLI as data.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from celery_recovery import TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.store.schema import metadata
from tests.builders import add_job, add_try
from tests.cli.helpers import run, run_json

PACKAGE = Path(__file__).resolve().parents[2] / "celery_recovery"
SQL_CALLS = {"execute", "executemany", "exec_driver_sql", "text"}

#: Formatted SQL the scan allows, each with why no input can reach it.
ALLOWED = {
    # SQLite PRAGMAs take no bound parameters; the value is an int from a module constant.
    ("store/engine.py", 'f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT * 1000)}"'),
}

HOSTILE = [
    "'; DROP TABLE jobs; --",
    'x" OR "1"="1',
    "o'brien",
    "robert'); DELETE FROM task_records; --",
    "%(task_id)s %s {0} :task_id ?",
    "back\\slash \\' quote",
    "ünïcødé ☃ \t tab",
]


def _formatted(node: ast.AST) -> bool:
    """Whether ``node`` builds a string by formatting (f-string, %, .format, +)."""
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(v, ast.FormattedValue) for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
        return any(
            isinstance(side, ast.Constant | ast.JoinedStr | ast.BinOp) and _stringy(side)
            for side in (node.left, node.right)
        )
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
    )


def _stringy(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, ast.JoinedStr | ast.BinOp)


def formatted_sql(source: str) -> list[tuple[int, str]]:
    """(line, source) of each SQL call whose statement argument is formatted."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in SQL_CALLS and _formatted(node.args[0]):
            found.append((node.lineno, ast.get_source_segment(source, node.args[0]) or ""))
    return found


def test_the_scan_catches_every_way_of_formatting_sql():
    planted = """
conn.execute(text(f"SELECT * FROM jobs WHERE id = '{job_id}'"))
conn.exec_driver_sql("DELETE FROM jobs WHERE id = '%s'" % job_id)
conn.execute("UPDATE jobs SET state = '{}'".format(state))
cursor.execute("SELECT " + column + " FROM jobs")
sa.text(f"DROP TABLE {name}")
conn.execute(text("SELECT * FROM jobs WHERE id = :id"), {"id": job_id})
"""
    assert sorted(line for line, _ in formatted_sql(planted)) == [2, 3, 4, 5, 6]


def test_no_sql_in_the_package_is_built_by_string_formatting():
    found = {
        (str(path.relative_to(PACKAGE)), segment)
        for path in sorted(PACKAGE.rglob("*.py"))
        for _, segment in formatted_sql(path.read_text())
    }
    assert found <= ALLOWED, f"formatted SQL (use bound parameters): {sorted(found - ALLOWED)}"


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_names_and_ids_round_trip_through_the_store(store, hostile):
    now = utcnow()
    job_id = add_job(store, hostname=hostile)
    store.tries.apply_writes(
        [
            (
                "queued",
                {
                    "task_id": hostile,
                    "try_number": 1,
                    "task_name": hostile,
                    "state": "queued",
                    "queue": hostile,
                    "routing_key": hostile,
                    "args": [hostile],
                    "kwargs": {hostile: hostile},
                    "headers": {hostile: hostile},
                    "queued_at": now,
                    "updated_at": now,
                },
            )
        ]
    )
    assert store.tries.mark_running(
        {
            "task_id": hostile,
            "try_number": 1,
            "task_name": hostile,
            "state": "running",
            "job_id": job_id,
            "worker_hostname": hostile,
            "started_at": now,
            "updated_at": now,
        }
    )
    assert store.tries.transition(
        hostile, 1, TaskState.RUNNING, TaskState.FAILED, state_reason=hostile, error=hostile
    )
    [row] = store.tries.history(hostile)
    assert (row["task_id"], row["task_name"], row["queue"], row["state_reason"]) == (
        hostile,
        hostile,
        hostile,
        hostile,
    )
    assert row["args"] == [hostile] and row["kwargs"] == {hostile: hostile}
    assert [r["task_id"] for r in store.tries.list_tries(task_name=hostile)] == [hostile]
    assert store.tries.list_tries(task_name=hostile + "'") == []
    assert store.jobs.get_job(job_id)["hostname"] == hostile
    # Every table is still there, with what it held.
    with store.transaction() as conn:
        for table in metadata.sorted_tables:
            conn.execute(table.select().limit(1)).all()
    assert len(store.jobs.list_jobs()) == 1


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_cli_filters_are_data_not_sql(store_url, store, hostile):
    add_try(store, "failed", task_name=hostile, ended_age=10)
    add_try(store, "failed", task_name="shop.refund", ended_age=10)
    job = add_job(store, hostname=hostile)

    rows = run_json(store_url, "inspect", "tasks", "--task-name", hostile)
    assert [r["task_name"] for r in rows] == [hostile]
    table = run(store_url, "inspect", "tasks", "--task-name", hostile)
    assert table.exit_code == 0
    checked = run(store_url, "jobs", "check", "--job-type", "worker", "--hostname", hostile)
    assert checked.exit_code == 0 and job in checked.output
    missing = run(store_url, "jobs", "check", "--job-type", "worker", "--hostname", hostile + "'")
    assert missing.exit_code == 1
    assert len(json.loads(run(store_url, "inspect", "tasks", "--json").output)) == 2
    assert [j["id"] for j in store.jobs.list_jobs()] == [job]
