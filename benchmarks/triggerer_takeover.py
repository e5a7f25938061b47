"""A killed triggerer's triggers, taken over by another: kill to all held, p50 and p99.

Two ``celery-recovery triggerer`` processes run on a fresh PostgreSQL store
holding N deferred tries whose triggers are due an hour later (written directly,
as in ``benchmarks/triggerer.py``).  One claims them all; the other is a
standby whose marker watch has seen the holder's markers.  The holder is
SIGKILLed and the time is taken until the other holds all N; a new triggerer
then starts as the next standby, and the next kill waits until its watch has
looked.  ``--marker lock`` clears the triggerers' process markers, so the
standby judges the holder by its advisory lock alone, as from another host.

    python benchmarks/triggerer_takeover.py --kills 20 --preset default
    python benchmarks/triggerer_takeover.py --kills 20 --preset default --marker lock
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

from benchmarks.beat import _until, percentile  # noqa: E402
from benchmarks.throughput import PG_ADMIN, create_database, drop_database  # noqa: E402
from benchmarks.triggerer import BACKEND, BROKER, seed  # noqa: E402

#: Seconds a new standby's watch is given to see the holder's markers held (it looks
#: twice a second and judges only a marker it saw).
FIRST_LOOKS = 1.5


def _triggerer(store_url: str, preset: str, log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "BENCH_BROKER": BROKER,
        "BENCH_BACKEND": BACKEND,
        "CELERY_RECOVERY_DATABASE_URL": store_url,
        "CELERY_RECOVERY_PRESET": preset,
    }
    command = [sys.executable, "-m", "celery_recovery.cli", "--app", "benchmarks.bench_app",
               "triggerer", "--loglevel", "INFO"]  # fmt: skip
    with open(log, "ab") as out:
        return subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def takeover(kills: int, n: int, preset: str, marker: str) -> dict:
    from celery_recovery import JobState
    from celery_recovery.store import Store

    database = create_database()
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{database}"
    logs = Path(f"/tmp/bench-triggerer-takeover-{database}")
    logs.mkdir()
    seed(url, n, start_in=3600, window=60)
    store = Store(url)

    def job_of(proc: subprocess.Popen) -> str | None:
        jobs = store.jobs.list_jobs("triggerer", JobState.RUNNING)
        return next((str(j["id"]) for j in jobs if j["pid"] == proc.pid), None)

    def holders() -> dict[str, int]:
        with store.transaction() as conn:
            rows = conn.exec_driver_sql(
                "SELECT triggerer_id, count(*) FROM triggers GROUP BY triggerer_id"
            ).all()
        return {str(holder): int(count) for holder, count in rows}

    def forget_process_markers() -> None:
        with store.transaction() as conn:
            conn.exec_driver_sql(
                "UPDATE jobs SET process_marker = NULL WHERE job_type = 'triggerer'"
            )

    procs = [_triggerer(url, preset, logs / "t0.log")]
    taken: list[float] = []
    try:
        holder_job = _until(lambda: job_of(procs[0]), 30, 0.05, "the first triggerer's job")
        _until(lambda: holders().get(holder_job) == n, 120, 0.1, f"the first to hold all {n}")
        holder = procs[0]
        for i in range(kills):
            standby = _triggerer(url, preset, logs / f"t{i + 1}.log")
            procs.append(standby)
            standby_job = _until(lambda s=standby: job_of(s), 30, 0.05, "the standby's job")
            if marker == "lock":
                forget_process_markers()
            time.sleep(FIRST_LOOKS)
            os.killpg(holder.pid, signal.SIGKILL)
            killed = time.monotonic()
            holder.wait()
            _until(
                lambda j=standby_job: holders().get(j) == n, 120, 0.01, "the standby to hold all"
            )
            taken.append(time.monotonic() - killed)
            holder = standby
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        store.dispose()
        drop_database(database)
    return {
        "preset": preset,
        "marker": "the advisory lock alone" if marker == "lock" else "process marker and lock",
        "triggers": n,
        "kills": kills,
        "kill_to_all_held_p50_seconds": percentile(taken, 0.5),
        "kill_to_all_held_p99_seconds": percentile(taken, 0.99),
        "kill_to_all_held_max_seconds": round(max(taken), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--triggers", type=int, default=100)
    parser.add_argument("--preset", choices=["default", "kubernetes", "aggressive"],
                        default="default")  # fmt: skip
    parser.add_argument("--marker", choices=["auto", "lock"], default="auto")
    args = parser.parse_args()
    print(json.dumps(takeover(args.kills, args.triggers, args.preset, args.marker), indent=2))


if __name__ == "__main__":
    main()
