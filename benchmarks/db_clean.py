"""How long ``db clean`` takes on PostgreSQL, and how long it can make a sweep wait.

Creates a scratch database, inserts ``--rows`` finished tries (server-side,
``generate_series``) plus active ones, then cleans them in batches while a
thread plays a sweep: every few milliseconds it runs a compare-and-set
``UPDATE`` on a random old finished try (as recording a late outcome does, so
it can meet a row a batch holds) and on an active try.  Prints JSON: the
clean's total time, batches, longest batch, and the sweep's longest statement,
which is bounded by one batch.  The scratch database is dropped afterwards.

    python benchmarks/db_clean.py --rows 1000000 --batch-size 10000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
import uuid
from datetime import timedelta

from sqlalchemy import create_engine, text

from celery_recovery.core.timeutils import utcnow
from celery_recovery.store import Store
from celery_recovery.store.engine import create_store_engine
from celery_recovery.store.migrate import upgrade
from celery_recovery.sweeps.retention import clean

ADMIN_URL = os.environ.get(
    "RECOVERY_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
ACTIVE_ROWS = 1000


def populate(url: str, rows: int) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                INSERT INTO task_records (task_id, try_number, task_name, state, updated_at,
                                          ended_at, recovered_at, republishable, publish_count)
                SELECT 'old-' || n, 1, 'bench.task',
                       (ARRAY['success','failed','up_for_retry','revoked'])[1 + n % 4],
                       now() - interval '40 days', now() - interval '40 days',
                       now() - interval '40 days', true, 1
                FROM generate_series(1, :rows) AS n
                """
            ),
            {"rows": rows},
        )
        conn.execute(
            text(
                """
                INSERT INTO task_records (task_id, try_number, task_name, state, updated_at,
                                          ended_at, republishable, publish_count)
                SELECT 'active-' || n, 1, 'bench.task',
                       (ARRAY['queued','running','deferred'])[1 + n % 3],
                       now(), now() - interval '40 days', true, 1
                FROM generate_series(1, :rows) AS n
                """
            ),
            {"rows": ACTIVE_ROWS},
        )
        conn.execute(text("ANALYZE task_records"))
    engine.dispose()


class SweepLoad(threading.Thread):
    """Compare-and-set updates like a sweep's, timing each statement."""

    def __init__(self, url: str, rows: int) -> None:
        super().__init__(daemon=True)
        self.engine = create_engine(url, isolation_level="AUTOCOMMIT")
        self.rows = rows
        self.stop = threading.Event()
        self.latencies: list[float] = []

    def run(self) -> None:
        with self.engine.connect() as conn:
            while not self.stop.is_set():
                old = f"old-{random.randint(1, self.rows)}"
                active = f"active-{random.randint(1, ACTIVE_ROWS)}"
                for stmt, task_id in (
                    (
                        "UPDATE task_records SET late_state = 'success', late_at = now() "
                        "WHERE task_id = :id AND try_number = 1 AND late_state IS NULL",
                        old,
                    ),
                    (
                        "UPDATE task_records SET updated_at = now() "
                        "WHERE task_id = :id AND try_number = 1 AND state = 'running'",
                        active,
                    ),
                ):
                    started = time.perf_counter()
                    conn.execute(text(stmt), {"id": task_id})
                    self.latencies.append(time.perf_counter() - started)
                time.sleep(0.002)
        self.engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    options = parser.parse_args()

    name = f"celery_recovery_bench_clean_{uuid.uuid4().hex[:8]}"
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        engine = create_store_engine(url, for_migrations=True)
        upgrade(engine)
        engine.dispose()
        started = time.perf_counter()
        populate(url, options.rows)
        populate_seconds = time.perf_counter() - started

        store = Store(url)
        load = SweepLoad(url, options.rows)
        load.start()
        now = utcnow()
        report = clean(store, now - timedelta(days=30), ["task_records"], options.batch_size, now)
        load.stop.set()
        load.join()
        with store.transaction() as conn:
            left_old = conn.execute(
                text("SELECT count(*) FROM task_records WHERE task_id LIKE 'old-%'")
            ).scalar()
            left_active = conn.execute(
                text("SELECT count(*) FROM task_records WHERE task_id LIKE 'active-%'")
            ).scalar()
        store.dispose()
        latencies = sorted(load.latencies)
        print(
            json.dumps(
                {
                    "finished_rows": options.rows,
                    "active_rows": ACTIVE_ROWS,
                    "batch_size": options.batch_size,
                    "populate_seconds": round(populate_seconds, 2),
                    "clean_seconds": round(report.duration, 2),
                    "rows_per_second": round(options.rows / report.duration),
                    "batches": report.batches,
                    "longest_batch_seconds": round(report.longest_batch, 3),
                    "mean_batch_seconds": round(report.duration / max(report.batches, 1), 3),
                    "sweep_statements": len(latencies),
                    "sweep_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
                    "sweep_longest_ms": round(latencies[-1] * 1000, 2),
                    "finished_rows_left": left_old,
                    "active_rows_kept": left_active,
                },
                indent=2,
            )
        )
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
