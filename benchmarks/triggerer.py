"""One triggerer process holding N concurrent TimeDeltaTriggers: memory, CPU, delay.

For each N: N deferred tries and their trigger rows are written to a fresh
PostgreSQL store (as N tasks that called ``defer(TimeDeltaTrigger(...,
end_from_trigger=True))`` would have; writing them directly keeps workers out
of the measurement), due uniformly over a window that starts once the
triggerer can have claimed them all.  One ``celery-recovery triggerer``
process (one asyncio loop, so one core) claims them, holds them all at once,
and completes each task itself (result backend + record) when it is due.
Sampled from /proc: peak resident memory and CPU seconds.  Delay: from each
trigger's due time to its try's ``success`` (``ended_at``).  Prints JSON.

    python benchmarks/triggerer.py --sizes 10000 50000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

from benchmarks.throughput import PG_ADMIN, create_database, drop_database  # noqa: E402

BROKER = "redis://127.0.0.1:6379/11"
BACKEND = "redis://127.0.0.1:6379/12"
CLASSPATH = "celery_recovery.triggers.temporal.DateTimeTrigger"


def seed(store_url: str, n: int, start_in: float, window: float) -> float:
    """Write the deferred tries; returns the first due time (epoch seconds)."""
    from sqlalchemy import insert

    from celery_recovery.core.timeutils import utcnow
    from celery_recovery.store import Store
    from celery_recovery.store.schema import task_records, triggers

    store = Store(store_url)
    now = utcnow()
    first_due = now + timedelta(seconds=start_in)
    records, rows = [], []
    for i in range(n):
        task_id = f"bench-{i}"
        due = first_due + timedelta(seconds=window * i / n)
        records.append(
            {
                "task_id": task_id,
                "try_number": 1,
                "task_name": "bench.noop",
                "state": "deferred",
                "external_executor_id": task_id,
                "updated_at": now,
                "republishable": True,
                "publish_count": 1,
            }
        )
        rows.append(
            {
                "classpath": CLASSPATH,
                "kwargs": {"moment": due.isoformat(), "end_from_trigger": True, "result": i},
                "task_id": task_id,
                "try_number": 1,
                "queue": "default",
                "created_at": now,
            }
        )
    with store.transaction() as conn:
        for lo in range(0, n, 5000):
            conn.execute(insert(task_records), records[lo : lo + 5000])
            conn.execute(insert(triggers), rows[lo : lo + 5000])
    store.dispose()
    return first_due.timestamp()


def proc_sample(pid: int) -> tuple[int, float]:
    """(resident bytes, CPU seconds) of ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss, (int(fields[11]) + int(fields[12])) / ticks


def run(n: int, window: float) -> dict:
    import redis

    from celery_recovery.store import Store

    for db in (11, 12):
        redis.Redis.from_url(f"redis://127.0.0.1:6379/{db}").flushdb()
    database = create_database()
    store_url = PG_ADMIN.rsplit("/", 1)[0] + f"/{database}"
    start_in = 10 + n / 2500  # time to claim them all before the first is due
    try:
        first_due = seed(store_url, n, start_in, window)
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "BENCH_BROKER": BROKER,
            "BENCH_BACKEND": BACKEND,
            "CELERY_RECOVERY_DATABASE_URL": store_url,
        }
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery_recovery.cli",
                "--app",
                "benchmarks.bench_app",
                "triggerer",
                "--capacity",
                str(n),
                "--loglevel",
                "WARNING",
            ],
            cwd=ROOT,
            env=env,
        )
        store = Store(store_url)
        started = time.monotonic()
        peak_rss, cpu, held_all_at = 0, 0.0, None
        deadline = started + start_in + window + 120
        try:
            while time.monotonic() < deadline:
                rss, cpu = proc_sample(proc.pid)
                peak_rss = max(peak_rss, rss)
                with store.transaction() as conn:
                    left, held = conn.exec_driver_sql(
                        "SELECT count(*), count(triggerer_id) FROM triggers"
                    ).one()
                if held_all_at is None and held == n:
                    held_all_at = time.monotonic() - started
                if left == 0:
                    break
                time.sleep(0.5)
            rss, cpu = proc_sample(proc.pid)
            wall = time.monotonic() - started
        finally:
            proc.terminate()
            proc.wait(30)
        with store.transaction() as conn:
            ended = conn.exec_driver_sql(
                "SELECT task_id, extract(epoch FROM ended_at) FROM task_records "
                "WHERE state = 'success'"
            ).all()
        store.dispose()
        delays = sorted(
            float(at) - (first_due + window * int(task_id.split("-")[1]) / n)
            for task_id, at in ended
        )
        return {
            "n": n,
            "completed": len(delays),
            "due_window_seconds": window,
            "held_all_after_seconds": held_all_at and round(held_all_at, 1),
            "peak_rss_mib": round(peak_rss / 2**20, 1),
            "cpu_seconds": round(cpu, 2),
            "cpu_share_while_running": round(cpu / wall, 2),
            "delay_p50_seconds": round(statistics.median(delays), 3) if delays else None,
            "delay_p99_seconds": round(delays[int(len(delays) * 0.99) - 1], 3) if delays else None,
            "delay_max_seconds": round(delays[-1], 3) if delays else None,
        }
    finally:
        drop_database(database)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10000, 50000])
    parser.add_argument("--window", type=float, default=60.0, help="seconds the due times span")
    args = parser.parse_args()
    print(json.dumps({"runs": [run(n, args.window) for n in args.sizes]}, indent=2))


if __name__ == "__main__":
    main()
