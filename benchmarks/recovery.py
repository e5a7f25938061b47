"""Recovery speed: SIGKILL to completion, per preset, and the cost of an idle sweep.

1. For each preset (aggressive, default) and liveness marker mode: start
   workers, give every pool process a task (long on its first try, short once
   recovered), SIGKILL all those workers at once (fresh workers are already
   up), sweep every ``sweep_interval`` (as beat would), and time each killed
   task from the kill to its completion.  Redis broker and backend,
   PostgreSQL store.  Marker modes: ``off`` (heartbeats alone, as before
   markers), ``auto`` (this sweep runs on the workers' host, so it sees their
   processes are gone), ``lock`` (``auto`` with the process markers erased,
   as a sweep on another host sees them: the advisory lock alone).
2. One sweep pass over PostgreSQL holding 1,000,000 finished tries and 10,000
   running tries of live workers (nothing to do): its duration.

Prints JSON.

    python benchmarks/recovery.py --workers 5 --concurrency 2 --markers off,auto,lock
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

from benchmarks.throughput import PG_ADMIN, create_database, drop_database  # noqa: E402

#: Redis databases of the broker and the result backend (the next one).
_DB = int(os.environ.get("RECOVERY_BENCH_REDIS_DB", "13"))
BROKER = f"redis://127.0.0.1:6379/{_DB}"
BACKEND = f"redis://127.0.0.1:6379/{_DB + 1}"
TASK_SECONDS = 600  # far longer than any recovery: only the re-run completes


def start_worker(
    name: str,
    queue: str,
    store_url: str,
    preset: str | None,
    concurrency: int,
    markers: str = "auto",
    broker: tuple[str, str] = (BROKER, BACKEND),
):
    """A real worker of tests/apps/lifecycle.py in its own session, output discarded.
    ``preset`` None: the settings' defaults, and the fallback sweep left as it is."""
    from celery_recovery.beat_schedules import preset_settings

    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "C_FORCE_ROOT": "1",
        "RECOVERY_TEST_PLAIN": "0",
        "RECOVERY_TEST_BROKER": broker[0],
        "RECOVERY_TEST_BACKEND": broker[1],
        "RECOVERY_TEST_QUEUE": queue,
        "CELERY_RECOVERY_DATABASE_URL": store_url,
        "CELERY_RECOVERY_LIVENESS_MARKERS": "off" if markers == "off" else "auto",
    }
    if preset is not None:
        env["CELERY_RECOVERY_PRESET"] = preset
        # Sweeps come from this benchmark (standing in for beat), not the fallback.
        env["CELERY_RECOVERY_SWEEP_INTERVAL"] = str(preset_settings(preset)["sweep_interval"])
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.apps.lifecycle",
            "worker",
            "-c",
            str(concurrency),
            "-n",
            f"{name}@%h",
            "-Q",
            queue,
            "-l",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def kill_to_completion(
    preset: str, workers: int, concurrency: int, store_url: str, markers: str = "auto"
) -> dict:
    from celery_recovery.recovery import recovery_for_app
    from tests.apps.lifecycle import create_app

    queue = f"bench-recovery-{uuid.uuid4().hex[:8]}"
    mode = "off" if markers == "off" else "auto"
    app = create_app(
        BROKER,
        BACKEND,
        queue,
        {"database_url": store_url, "preset": preset, "liveness_markers": mode},
    )
    recovery = recovery_for_app(app)
    doomed = [
        start_worker(f"doomed{i}", queue, store_url, preset, concurrency, markers)
        for i in range(workers)
    ]
    count = workers * concurrency
    _wait(lambda: len(recovery.store.jobs.list_jobs("worker")) >= count, 120)
    if markers == "lock":
        _erase_process_markers(recovery.store)
    results = [app.send_task("lifecycle.slow_first_try", (TASK_SECONDS, 0.2)) for _ in range(count)]
    _wait(lambda: len(recovery.store.tries.list_tries(state="running", limit=count)) == count, 120)
    survivors = [
        start_worker(f"survivor{i}", queue, store_url, preset, concurrency, markers)
        for i in range(2)
    ]
    time.sleep(3)  # survivors up before the kill, as in a real cluster
    from celery_recovery.core.timeutils import utcnow

    early = sum(1 for r in results if len(recovery.store.tries.history(r.id)) > 1)
    for proc in doomed:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed = time.monotonic()
    killed_wall = utcnow()
    done: dict[str, float] = {}
    interval = recovery.settings.sweep_interval
    deadline = killed + recovery.settings.zombie_threshold + interval * 4 + 120
    next_sweep = killed + interval * random.random()  # beat's phase is unrelated to the kill
    while len(done) < count and time.monotonic() < deadline:
        if time.monotonic() >= next_sweep:
            recovery.sweep()
            next_sweep += interval
        for result in results:
            if (
                result.id not in done
                and result.ready()
                and _started_again(recovery, result.id, killed_wall)
            ):
                done[result.id] = time.monotonic() - killed
        time.sleep(0.1 if len(done) < count else 0)
    for proc in survivors:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    recovery.close()
    times = sorted(done.values())
    return {
        "preset": preset,
        "markers": markers,
        "killed_tasks": count,
        "worker_kills": workers,
        "recovered": len(times),
        # Live workers declared dead before the kill (heartbeats starved on a loaded host).
        "false_alarms_before_kill": early,
        "zombie_threshold_s": recovery.settings.zombie_threshold,
        "sweep_interval_s": interval,
        "kill_to_completion_p50_s": round(statistics.median(times), 2) if times else None,
        "kill_to_completion_max_s": round(max(times), 2) if times else None,
    }


def _erase_process_markers(store) -> None:
    from sqlalchemy import update

    from celery_recovery.store.schema import jobs

    with store.transaction() as conn:
        conn.execute(update(jobs).values(process_marker=None))


def _started_again(recovery, task_id: str, since) -> bool:
    """A try started after the kill: the recovered run (not a false alarm before it)."""
    return any(
        t["try_number"] >= 2 and t["started_at"] is not None and t["started_at"] >= since
        for t in recovery.store.tries.history(task_id)
    )


def idle_sweep(store_url: str, history: int, running: int, passes: int) -> dict:
    from celery import Celery
    from sqlalchemy import create_engine, text

    from celery_recovery import Recovery

    engine = create_engine(store_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (id, job_type, hostname, pid, state, start_date, "
                "latest_heartbeat) "
                "SELECT 'job' || g, 'worker', 'bench', g, 'running', now(), now() "
                "FROM generate_series(1, 100) g"
            )
        )
        conn.execute(
            text(
                "INSERT INTO task_records (task_id, try_number, task_name, state, args, kwargs, "
                "republishable, queued_at, started_at, ended_at, updated_at, publish_count, "
                "job_id) "
                "SELECT 'hist-' || g, 1, 'bench.task', 'success', '[1]', '{}', true, "
                "now() - interval '1 day', now() - interval '1 day', now() - interval '1 day', "
                "now() - interval '1 day', 1, 'job' || (g % 100 + 1) "
                "FROM generate_series(1, :n) g"
            ),
            {"n": history},
        )
        conn.execute(
            text(
                "INSERT INTO task_records (task_id, try_number, task_name, state, args, kwargs, "
                "republishable, queued_at, started_at, updated_at, publish_count, job_id) "
                "SELECT 'run-' || g, 1, 'bench.task', 'running', '[1]', '{}', true, now(), now(), "
                "now(), 1, 'job' || (g % 100 + 1) FROM generate_series(1, :n) g"
            ),
            {"n": running},
        )
        conn.execute(text("ANALYZE"))
    app = Celery("bench-idle", broker="memory://", backend="cache+memory://", set_as_current=False)
    recovery = Recovery(app, database_url=store_url)
    keep_alive = text("UPDATE jobs SET latest_heartbeat = now()")
    durations = []
    for _ in range(passes):
        with engine.begin() as conn:
            conn.execute(keep_alive)
        report = recovery.sweep()
        assert report.zombies == 0 and report.errors == 0, report
        durations.append(report.duration * 1000)
    recovery.close()
    engine.dispose()
    durations.sort()
    return {
        "history_rows": history,
        "running_tries": running,
        "passes": passes,
        "idle_sweep_p50_ms": round(statistics.median(durations), 1),
        "idle_sweep_max_ms": round(max(durations), 1),
    }


def _kill_on_a_new_store(args, preset: str, markers: str, pooler: int | None) -> dict:
    name = create_database()
    try:
        url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
        if pooler is not None:
            from sqlalchemy.engine import make_url

            url = make_url(url).set(port=pooler).render_as_string(hide_password=False)
        run = kill_to_completion(preset, args.workers, args.concurrency, url, markers)
        return {**run, "behind_pgbouncer": pooler is not None}
    finally:
        drop_database(name)


def _wait(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("benchmark: timed out waiting for the workers")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=5, help="workers SIGKILLed at once")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--presets", default="aggressive,default")
    parser.add_argument(
        "--markers", default="auto", help="liveness marker modes to compare: off, auto, lock"
    )
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--running", type=int, default=10_000)
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--skip-idle", action="store_true", help="only the kill measurements")
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        help="also every kill with the store behind PgBouncer (transaction mode, stock config)",
    )
    args = parser.parse_args()
    out: dict = {"kills": [], "idle_sweep": None}
    poolers: list[int | None] = [None]
    stop_pooler = None
    if args.pgbouncer:
        import tempfile

        from tests.services import PGBOUNCER_STOCK, start_pgbouncer

        folder = tempfile.mkdtemp(prefix="celery-recovery-bench-pgbouncer-")
        port, stop_pooler = start_pgbouncer(folder, PGBOUNCER_STOCK)
        poolers.append(port)
    try:
        for pooler in poolers:
            for preset in args.presets.split(","):
                for markers in args.markers.split(","):
                    out["kills"].append(_kill_on_a_new_store(args, preset, markers, pooler))
    finally:
        if stop_pooler is not None:
            stop_pooler()
    if not args.skip_idle:
        name = create_database()
        try:
            url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
            out["idle_sweep"] = idle_sweep(url, args.history, args.running, args.passes)
        finally:
            drop_database(name)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
