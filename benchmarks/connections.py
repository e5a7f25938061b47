"""Store connections per process: what one prefork worker holds, directly and behind
PgBouncer.

For each concurrency: a fresh PostgreSQL store, one worker (``-c N``, Redis broker
and backend, default preset), 40 short tasks and then 2 x N tasks of 1 s that keep
every pool process busy, published by a plain Celery app (so every session is the
worker's); the server sessions open to the store's database (``pg_stat_activity``)
are counted at rest after the short tasks and at their highest while the long ones
run.  Behind PgBouncer (started here, transaction
mode, the configuration most guides give) the same counts are taken at the
server: the pooler's sessions, bounded by its pool size, whatever the clients.

Prints JSON.

    python benchmarks/connections.py --concurrency 1,4,8 [--pgbouncer]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

from benchmarks.recovery import start_worker  # noqa: E402
from benchmarks.throughput import PG_ADMIN, create_database, drop_database  # noqa: E402

_DB = int(os.environ.get("RECOVERY_BENCH_REDIS_DB", "13"))
BROKER = f"redis://127.0.0.1:6379/{_DB}"
BACKEND = f"redis://127.0.0.1:6379/{_DB + 1}"


def sessions(name: str) -> int:
    from sqlalchemy import create_engine, text

    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        count = conn.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE datname = :name"), {"name": name}
        ).scalar_one()
    admin.dispose()
    return int(count)


def _wait(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("timed out")
        time.sleep(0.1)


def measure(concurrency: int, pooler_port: int | None) -> dict:
    from celery_recovery.store import Store
    from tests.apps.lifecycle import create_app

    name = create_database()
    direct = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    url = direct
    if pooler_port is not None:
        from sqlalchemy.engine import make_url

        url = make_url(direct).set(port=pooler_port).render_as_string(hide_password=False)
    queue = f"bench-connections-{uuid.uuid4().hex[:8]}"
    node = f"bench-{uuid.uuid4().hex[:6]}"
    worker = start_worker(node, queue, url, None, concurrency, broker=(BROKER, BACKEND))
    # A plain Celery publisher, so that every session counted is the worker's own (its
    # claims then carry the whole message: the same connections, a little more data).
    app = create_app(BROKER, BACKEND, queue, None)
    store = Store(url)
    try:
        _wait(lambda: len(store.jobs.list_jobs("worker")) >= concurrency + 1, 60)
        store.dispose()
        short = [app.send_task("lifecycle.add", (i, 1)) for i in range(40)]
        for result in short:
            result.get(timeout=60)
        time.sleep(2)  # the writers' last batches and heartbeats: "at rest"
        at_rest = sessions(name)
        long = [app.send_task("lifecycle.sleep_for", (1.0,)) for _ in range(2 * concurrency)]
        busiest = 0
        while not all(r.ready() for r in long):
            busiest = max(busiest, sessions(name))
            time.sleep(0.05)
        return {
            "concurrency": concurrency,
            "behind_pgbouncer": pooler_port is not None,
            "at_rest": at_rest,
            "under_load": busiest,
            "processes": concurrency + 1,
        }
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)
        store.dispose()
        app.close()
        drop_database(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--pgbouncer", action="store_true", help="also measure behind PgBouncer")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    runs = [measure(c, None) for c in levels]
    if args.pgbouncer:
        from tests.services import PGBOUNCER_STOCK, start_pgbouncer

        folder = tempfile.mkdtemp(prefix="celery-recovery-bench-pgbouncer-")
        port, stop = start_pgbouncer(folder, PGBOUNCER_STOCK)
        try:
            runs += [measure(c, port) for c in levels]
        finally:
            stop()
    print(json.dumps({"runs": runs}, indent=2))


if __name__ == "__main__":
    main()
