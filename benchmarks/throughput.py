"""Throughput of plain Celery against Celery with celery-recovery on PostgreSQL.

The same N no-op tasks go through one prefork worker (concurrency 2, Redis
broker and result backend), in alternating rounds: plain, recovery, plain,
recovery...  Each round's rate is tasks / (last result - first publish), the
publisher included (its queued records are part of the cost).  Prints JSON.

    python benchmarks/throughput.py --tasks 3000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PG_ADMIN = os.environ.get("BENCH_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def create_database() -> str:
    from sqlalchemy import create_engine, text

    from celery_recovery.store.engine import create_store_engine
    from celery_recovery.store.migrate import upgrade

    name = f"celery_recovery_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    engine = create_store_engine(url, for_migrations=True)
    upgrade(engine)
    engine.dispose()
    return name


def drop_database(name: str) -> None:
    from sqlalchemy import create_engine, text

    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def round_env(plain: bool, store_url: str, queue: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}",
        "BENCH_PLAIN": "1" if plain else "0",
        "BENCH_QUEUE": queue,
        "C_FORCE_ROOT": "1",
    }
    env.pop("CELERY_RECOVERY_DATABASE_URL", None)
    if not plain:
        env["CELERY_RECOVERY_DATABASE_URL"] = store_url
    return env


def run_round(plain: bool, tasks: int, store_url: str) -> float:
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    env = round_env(plain, store_url, queue)
    log = open(f"/tmp/bench-worker-{queue}.log", "w")  # noqa: SIM115
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench_app",
            "worker",
            "-P",
            "prefork",
            "-c",
            "2",
            "-Q",
            queue,
            "-l",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
        ],
        cwd=HERE,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        time.sleep(0)  # the publisher waits for the worker through the broker
        out = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--publish", str(tasks)],
            cwd=HERE,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        ).stdout
        return float(json.loads(out.strip().splitlines()[-1])["rate"])
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
        log.close()


def publish(tasks: int) -> None:
    """Publisher side of one round (run in its own process, with the round's app)."""
    import bench_app
    from celery.result import ResultSet

    # Wait until the worker answers so its start-up is not timed.
    deadline = time.monotonic() + 60
    while not bench_app.app.control.ping(timeout=0.5):
        if time.monotonic() > deadline:
            raise SystemExit("the benchmark worker did not start")
    bench_app.noop.delay(-1).get(timeout=30)
    start = time.perf_counter()
    results = ResultSet([bench_app.noop.delay(i) for i in range(tasks)])
    results.join_native(timeout=600)
    elapsed = time.perf_counter() - start
    print(json.dumps({"rate": tasks / elapsed, "seconds": elapsed}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each kind")
    parser.add_argument("--publish", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.publish is not None:
        publish(args.publish)
        return
    name = create_database()
    store_url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    plain_rates: list[float] = []
    recovery_rates: list[float] = []
    try:
        for _ in range(args.rounds):
            plain_rates.append(run_round(True, args.tasks, store_url))
            recovery_rates.append(run_round(False, args.tasks, store_url))
    finally:
        drop_database(name)
    plain, recovery = statistics.median(plain_rates), statistics.median(recovery_rates)
    print(
        json.dumps(
            {
                "tasks": args.tasks,
                "rounds": args.rounds,
                "plain_tasks_per_s": round(plain, 1),
                "recovery_postgres_tasks_per_s": round(recovery, 1),
                "ratio": round(recovery / plain, 3),
                "plain_rounds": [round(r, 1) for r in plain_rates],
                "recovery_rounds": [round(r, 1) for r in recovery_rates],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
