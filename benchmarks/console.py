"""How fast the console's pages are with ``--rows`` tries in PostgreSQL.

Creates a scratch database, fills it server-side (``generate_series``): tries
of 50 task names queued over 30 days (1,000 running, 1,000 queued past the
timeout, 1,000 deferred with their triggers), ``--rows / 10`` audit rows, 5,000
jobs and 200 callback rows; then requests every page, HTML and JSON, through
the whole app (routing, read-only queries, templates, headers) ``--repeat``
times each, including deep keyset pages.  Prints JSON: per page, the median,
95th percentile and slowest response in milliseconds.  The database is
dropped afterwards.

    python benchmarks/console.py --rows 1000000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine, text
from starlette.testclient import TestClient

from celery_recovery.core.settings import RecoverySettings
from celery_recovery.web.app import create_app, secured

# The scratch database is made the way the tests make theirs.
sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]
from tests.services import create_pg_database  # noqa: E402

#: What a page may take with a million tries (the console's promise).
BUDGET_MS = 200.0

POPULATE = [
    # Finished tries of 50 names over 30 days; every 10th task was retried as try 2.
    """
    INSERT INTO task_records (task_id, try_number, task_name, state, queue, args, kwargs,
                              job_id, worker_hostname, worker_pid, queued_at, started_at,
                              ended_at, updated_at, republishable, publish_count)
    SELECT 'task-' || n, t, 'bench.task_' || n % 50,
           CASE WHEN t = 1 AND n % 10 = 0 THEN 'up_for_retry' ELSE 'success' END,
           'default', '[1, 2]', '{}', 'job-' || n % 5000, 'host-' || n % 20, 1000 + n % 5000,
           q, q, q + interval '2 seconds', now(), true, 1
    FROM (
        SELECT n, t, now() - (n || ' seconds')::interval * (2592000.0 / :tasks)
                     + (t || ' seconds')::interval AS q
        FROM generate_series(1, :tasks) AS n, generate_series(1, 2) AS t
        WHERE t = 1 OR n % 10 = 0
    ) AS tries
    """,
    """
    INSERT INTO task_records (task_id, try_number, task_name, state, queue, job_id,
                              queued_at, started_at, updated_at, republishable, publish_count)
    SELECT 'active-' || n, 1, 'bench.task_' || n % 50,
           (ARRAY['running', 'queued', 'deferred'])[1 + n % 3], 'default',
           CASE WHEN n % 3 = 0 THEN 'job-' || n % 5000 END,
           now() - interval '1 hour', now() - interval '1 hour', now(), true, 1
    FROM generate_series(1, 3000) AS n
    """,
    """
    INSERT INTO triggers (classpath, kwargs, task_id, try_number, queue, timeout_at, created_at)
    SELECT 'celery_recovery.triggers.DateTimeTrigger', '{"moment": "2030-01-01T00:00:00+00:00"}',
           'active-' || n, 1, 'triggers', now() + interval '1 day', now() - interval '1 hour'
    FROM generate_series(1, 3000) AS n WHERE n % 3 = 2
    """,
    """
    INSERT INTO jobs (id, job_type, hostname, node_name, pid, state, start_date, end_date,
                      latest_heartbeat)
    SELECT 'job-' || n, (ARRAY['worker', 'worker', 'worker', 'beat', 'triggerer'])[1 + n % 5],
           'host-' || n % 20, 'celery@host-' || n % 20, 1000 + n,
           CASE WHEN n < 40 THEN 'running' ELSE 'success' END,
           now() - (n || ' minutes')::interval,
           CASE WHEN n < 40 THEN NULL ELSE now() - (n || ' minutes')::interval END,
           CASE WHEN n < 40 THEN now() ELSE now() - (n || ' minutes')::interval END
    FROM generate_series(0, 4999) AS n
    """,
    """
    INSERT INTO audit_log (at, action, reason, task_id, try_number, task_name, detail, job_id,
                           hostname, pid, last_heartbeat, recovery_seconds, actor)
    SELECT now() - (n || ' seconds')::interval * (2592000.0 / (:rows / 10)),
           (ARRAY['republished', 'failed', 'reconciled', 'dropped', 'callback_delivered'])
               [1 + n % 5],
           (ARRAY['worker_lost', 'message_lost', 'stale_delivery'])[1 + n % 3],
           'task-' || n * 5, 1, 'bench.task_' || n % 50, 'worker lost: bench', 'job-' || n % 5000,
           'host-' || n % 20, 1000 + n % 5000, now() - interval '40 seconds', 33.5, 'sweeper:1'
    FROM generate_series(1, :rows / 10) AS n
    """,
    """
    INSERT INTO callbacks (task_id, try_number, kind, payload, created_at)
    SELECT 'task-' || n, 1, 'failure', '{"reason": "worker lost", "args": [1]}', now()
    FROM generate_series(1, 200) AS n
    """,
    """
    INSERT INTO leases (name, token, completed_at, report)
    VALUES ('sweep', 0, now(), '{"zombies": 1, "republished": 1, "duration": 0.04}')
    """,
]


def tasks_of(rows: int) -> int:
    """Tasks made for ``rows`` tries (one in ten has two tries; 3,000 tries are active)."""
    return (rows - 3000) * 10 // 11


def populate(url: str, rows: int) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        for statement in POPULATE:
            params = {"rows": rows, "tasks": (rows - 3000) * 10 // 11}
            conn.execute(
                text(statement).bindparams(
                    **{k: v for k, v in params.items() if f":{k}" in statement}
                )
            )
        for table in ("task_records", "triggers", "jobs", "audit_log", "callbacks"):
            conn.execute(text(f"ANALYZE {table}"))
    engine.dispose()


def cursors(client: TestClient) -> dict[str, str]:
    """Keyset cursors deep into each list (about 20 pages in)."""
    deep = {}
    for name, path in (
        ("recoveries", "/api/recoveries?limit=500"),
        ("tasks", "/api/tasks?q=bench.task_7&limit=500"),
        ("jobs", "/api/jobs?limit=200"),
    ):
        before = None
        for _ in range(20):
            page = client.get(path + (f"&before={before}" if before else "")).json()
            before = page["next_before"] or before
        deep[name] = before or ""
    return deep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument(
        "--keep", action="store_true", help="keep the scratch database (its URL is printed)"
    )
    options = parser.parse_args()

    url, drop = create_pg_database("celery_recovery_bench_console")
    try:
        started = time.perf_counter()
        populate(url, options.rows)
        populate_seconds = time.perf_counter() - started
        settings = RecoverySettings.from_sources({}, {}, {"database_url": url})
        app = secured(create_app(settings), settings, "127.0.0.1")
        with TestClient(app) as client:
            deep = cursors(client)
            retried = f"task-{tasks_of(options.rows) // 20 * 10}"
            pages = {
                "overview": "/",
                "recoveries": "/recoveries",
                "recoveries filtered": "/recoveries?action=failed&reason=worker_lost",
                "recoveries deep": f"/recoveries?before={deep['recoveries']}",
                "task by id": f"/tasks/{retried}",
                "search by id": f"/api/tasks?q={retried}",
                "search by name": "/tasks?q=bench.task_7",
                "search by name deep": f"/tasks?q=bench.task_7&before={deep['tasks']}",
                "jobs": "/jobs",
                "jobs deep": f"/jobs?before={deep['jobs']}",
                "jobs filtered": "/jobs?type=worker&state=running",
                "deferred": "/deferred",
                "callbacks": "/callbacks",
            }
            results = {}
            for label, path in pages.items():
                for twin in (path, _api(path)):
                    times = []
                    for _ in range(options.repeat):
                        begin = time.perf_counter()
                        response = client.get(twin, follow_redirects=False)
                        times.append((time.perf_counter() - begin) * 1000)
                        assert response.status_code in (200, 303), (twin, response.status_code)
                    times.sort()
                    results[f"{label} ({'json' if '/api/' in twin else 'html'})"] = {
                        "median_ms": round(statistics.median(times), 1),
                        "p95_ms": round(times[int(len(times) * 0.95) - 1], 1),
                        "max_ms": round(times[-1], 1),
                    }
        slowest = max(r["p95_ms"] for r in results.values())
        print(
            json.dumps(
                {
                    "tries": options.rows,
                    "audit_rows": options.rows // 10,
                    "populate_seconds": round(populate_seconds, 1),
                    "repeat": options.repeat,
                    "budget_ms": BUDGET_MS,
                    "slowest_p95_ms": slowest,
                    "within_budget": slowest < BUDGET_MS,
                    "pages": results,
                },
                indent=2,
            )
        )
    finally:
        if options.keep:
            print(f"kept {url}")
        else:
            drop()


def _api(path: str) -> str:
    if path.startswith("/api/"):
        return path
    return "/api/overview" if path == "/" else "/api" + path


if __name__ == "__main__":
    main()
