"""What the marker watch costs the store: one look at N live jobs, twice a second.

A PostgreSQL store holds ``--jobs`` running worker jobs, each with a process
marker of this host and an advisory-lock key that one session holds (as N
workers' marker connections would: ``pg_locks`` has N rows).  The watch looks
``--looks`` times; the figures are per look and per second at its pace (two
looks a second): statements, wall time, this process's CPU and the server's
(the backend that answered, from ``/proc``), and the rows read.  Nothing is
judged dead (every marker is alive), which is every look but the rare one.

    python benchmarks/marker_watch.py --jobs 1000 --looks 200
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

from benchmarks.throughput import (  # noqa: E402
    PG_ADMIN,
    create_database,
    drop_database,
    process_cpu,
)


def measure(store_url: str, jobs: int, looks: int) -> dict:
    import psycopg
    from celery import Celery
    from sqlalchemy import event

    from celery_recovery import Recovery
    from celery_recovery.core.timeutils import utcnow
    from celery_recovery.liveness.process import process_marker
    from celery_recovery.sweeps.marker_watch import WATCH_INTERVAL, MarkerWatch

    app = Celery("bench-watch", broker="memory://", backend="cache+memory://", set_as_current=False)
    recovery = Recovery(app, database_url=store_url)
    store = recovery.store
    marker, now = process_marker(), utcnow()
    keys = [1_000_000 + i for i in range(jobs)]
    for key in keys:
        store.jobs.add_job(
            {
                "id": uuid.uuid4().hex,
                "job_type": "worker",
                "hostname": "bench",
                "pid": os.getpid(),
                "state": "running",
                "start_date": now,
                "latest_heartbeat": now,
                "process_marker": marker,
                "marker_lock": key,
            }
        )
    holder = psycopg.connect(store_url.replace("+psycopg", ""), autocommit=True)
    for key in keys:
        holder.execute("SELECT pg_advisory_lock(%s)", (key,))

    statements = 0

    def count(*_):
        nonlocal statements
        statements += 1

    engine = store.db.engine
    event.listen(engine, "before_cursor_execute", count)
    watch = MarkerWatch(recovery.context)
    watch.look(at=0.0)  # connected, clock read, every lock seen once
    # One thread: the watch's statements all run on the pool's one connection.
    with store.db.single_statement() as conn:
        server_pids = [conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()]
    statements = 0
    durations = []
    cpu_before, server_before = process_cpu([os.getpid()]), process_cpu(server_pids)
    for i in range(looks):
        started = time.perf_counter()
        failed = watch.look(at=1.0 + i * WATCH_INTERVAL)
        durations.append((time.perf_counter() - started) * 1000)
        assert failed == 0, "a live job was judged dead"
    cpu = process_cpu([os.getpid()]) - cpu_before
    server = process_cpu(server_pids) - server_before
    event.remove(engine, "before_cursor_execute", count)
    holder.close()
    recovery.close()
    per_second = 1 / WATCH_INTERVAL
    return {
        "live_jobs": jobs,
        "held_locks": jobs,
        "looks": looks,
        "statements_per_look": statements / looks,
        "queries_per_second": round(statements / looks * per_second, 1),
        "look_p50_ms": round(statistics.median(durations), 2),
        "look_max_ms": round(max(durations), 2),
        "client_cpu_ms_per_look": round(cpu * 1000 / looks, 2),
        "server_cpu_ms_per_look": round(server * 1000 / looks, 2),
        "server_cpu_share_of_a_core": round(server / looks * per_second, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--looks", type=int, default=200)
    args = parser.parse_args()
    name = create_database()
    try:
        url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
        print(json.dumps(measure(url, args.jobs, args.looks), indent=2))
    finally:
        drop_database(name)


if __name__ == "__main__":
    main()
