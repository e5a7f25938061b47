"""Kill to done elsewhere, one kill at a time: p50 and p99 per preset, and a pause not misjudged.

Three workers (concurrency 1, Redis broker and backend, PostgreSQL store) wait
for tasks; this process sweeps as ``celery-recovery sweep --loop`` does (every
``sweep_interval``, and at once after its marker watch finds a death).  Each
round sends one task (its first try 600 s, its recovered run ``--task-seconds``),
SIGKILLs what runs it (``worker``: the worker's whole process group; ``pool``:
the pool process alone, which its main process reports; the task is then one that
``task_retry_on_worker_lost`` retries at once, with no body left to run), and times
the kill to the task's result.  A replacement worker starts before the next round.

``--pause`` also SIGSTOPs a worker running a task (5 s longer than the pause) for that
many seconds under each preset and reports how many tries the task took (1: not misjudged).

Marker modes: ``auto`` (this process runs on the workers' host and sees their
processes), ``lock`` (process markers erased, as a sweeper on another host sees
them: the advisory lock alone), ``off`` (heartbeats alone).

    python benchmarks/kills.py --kills 20 --presets default,kubernetes,aggressive
    python benchmarks/kills.py --kills 20 --presets default --markers lock --pause 20
    python benchmarks/kills.py --kills 20 --presets default --targets worker --pgbouncer
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

from benchmarks.recovery import BACKEND, BROKER, _erase_process_markers, start_worker  # noqa: E402
from benchmarks.throughput import PG_ADMIN, create_database, drop_database  # noqa: E402
from tests.workers import wait_for  # noqa: E402

FIRST_TRY_SECONDS = 600  # the killed run never finishes: only the recovered one does
WORKERS = 3


class Sweeper:
    """Sweeps every interval and after each death its marker watch finds, in a thread."""

    def __init__(self, recovery, watch: bool) -> None:
        self.recovery = recovery
        self.woken = threading.Event()
        self.stopped = threading.Event()
        # A checkout from before the watch (``--baseline`` runs) has no watch_markers.
        if watch and hasattr(recovery, "watch_markers"):
            recovery.watch_markers(on_deaths=self.woken.set)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        interval = self.recovery.settings.sweep_interval
        while not self.stopped.is_set():
            self.woken.clear()
            self.recovery.sweep()
            self.woken.wait(interval)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(30)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(share * len(ordered)) - 1)]


def serial_kills(
    preset: str, store_url: str, kills: int, target: str, markers: str, task_seconds: float
) -> dict:
    app, queue, recovery = _bench_app("kills", store_url, preset, markers)
    store = recovery.store
    workers = {}

    def add_worker() -> None:
        name = f"w{len(workers)}-{uuid.uuid4().hex[:4]}"
        workers[name] = start_worker(name, queue, store_url, preset, 1, markers)

    for _ in range(WORKERS):
        add_worker()
    wait_for(lambda: _running_workers(store) >= 2 * WORKERS, 120)
    sweeper = Sweeper(recovery, watch=markers != "off")
    times, twice = [], 0
    try:
        for _ in range(kills):
            if markers == "lock":
                _erase_process_markers(store)
            time.sleep(1.5)  # the watch has looked at every marker since the last round
            if target == "worker":
                task = ("lifecycle.slow_first_try", (FIRST_TRY_SECONDS, task_seconds))
            else:
                # Celery 5.7's task_retry_on_worker_lost retries it (its next run is at
                # once); on 5.5 and 5.6 the killed try fails, as Celery decides.
                ledger = str(Path(tempfile.mkdtemp()) / "ledger")
                task = ("lifecycle.killable_retried", (ledger, FIRST_TRY_SECONDS))
            result = app.send_task(*task)
            task_id = result.id
            running = wait_for(lambda task_id=task_id: _running_try(store, task_id), 60)
            job = store.jobs.get_job(running["job_id"])
            name = (job["node_name"] or "").split("@")[0]
            if target == "worker":
                proc = workers.pop(name)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            else:
                os.kill(job["pid"], signal.SIGKILL)
            killed = time.monotonic()
            result.get(timeout=recovery.settings.zombie_threshold * 3 + 120, propagate=False)
            times.append(time.monotonic() - killed)
            twice += len(store.tries.history(result.id)) > 2
            if target == "worker":
                add_worker()
                wait_for(lambda: _running_workers(store) >= 2 * WORKERS, 120)
    finally:
        _tear_down(sweeper, workers.values(), recovery)
    return {
        "preset": preset,
        "target": target,
        "markers": markers,
        "kills": len(times),
        "task_seconds": task_seconds,
        "kill_to_done_p50_s": round(statistics.median(times), 2),
        "kill_to_done_p99_s": round(percentile(times, 0.99), 2),
        "kill_to_done_max_s": round(max(times), 2),
        "ran_more_than_twice": twice,
    }


def pause(preset: str, store_url: str, seconds: float, markers: str) -> dict:
    """SIGSTOP the worker running a task for ``seconds`` (the task runs 5 s past the pause)."""
    app, queue, recovery = _bench_app("pause", store_url, preset, markers)
    store = recovery.store
    workers = {f"p{i}": start_worker(f"p{i}", queue, store_url, preset, 1, markers) for i in (0, 1)}
    wait_for(lambda: _running_workers(store) >= 4, 120)
    if markers == "lock":
        _erase_process_markers(store)
    sweeper = Sweeper(recovery, watch=markers != "off")
    try:
        time.sleep(1.5)
        result = app.send_task("lifecycle.slow_first_try", (seconds + 5, seconds + 5))
        running = wait_for(lambda: _running_try(store, result.id), 60)
        name = (store.jobs.get_job(running["job_id"])["node_name"] or "").split("@")[0]
        paused = workers[name]
        os.killpg(paused.pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.killpg(paused.pid, signal.SIGCONT)
        result.get(timeout=seconds + 120, propagate=False)
        tries = len(store.tries.history(result.id))
    finally:
        _tear_down(sweeper, workers.values(), recovery)
    return {"preset": preset, "markers": markers, "sigstop_s": seconds, "tries": tries}


def _bench_app(kind: str, store_url: str, preset: str, markers: str):
    """The publishing app (tests/apps/lifecycle.py) on a queue of its own; its Recovery."""
    from celery_recovery.recovery import recovery_for_app
    from tests.apps.lifecycle import create_app

    queue = f"bench-{kind}-{uuid.uuid4().hex[:8]}"
    mode = "off" if markers == "off" else "auto"
    settings = {"database_url": store_url, "preset": preset, "liveness_markers": mode}
    app = create_app(BROKER, BACKEND, queue, settings)
    return app, queue, recovery_for_app(app)


def _tear_down(sweeper: Sweeper, workers, recovery) -> None:
    sweeper.stop()
    for proc in workers:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    recovery.close()


def _running_workers(store) -> int:
    return len(store.jobs.list_jobs("worker", "running"))


def _running_try(store, task_id: str):
    return next(
        (t for t in store.tries.history(task_id) if t["state"] == "running" and t["job_id"]), None
    )


def _on_a_new_store(run, pooler: int | None, *args):
    """``run(preset, url, ...)`` on a new database, reached through PgBouncer's ``pooler``
    port when given (the store then holds no advisory lock: process markers only)."""
    from sqlalchemy.engine import make_url

    name = create_database()
    try:
        url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
        if pooler is not None:
            url = make_url(url).set(port=pooler).render_as_string(hide_password=False)
        return {**run(*args[:1], url, *args[1:]), "behind_pgbouncer": pooler is not None}
    finally:
        drop_database(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--presets", default="default,kubernetes,aggressive")
    parser.add_argument("--targets", default="worker,pool", help="worker, pool")
    parser.add_argument("--markers", default="auto", help="auto, lock, off")
    parser.add_argument("--task-seconds", type=float, default=4.0)
    parser.add_argument("--pause", type=float, default=0, help="SIGSTOP seconds (0: none)")
    parser.add_argument(
        "--pgbouncer", action="store_true", help="the store behind PgBouncer (transaction mode)"
    )
    args = parser.parse_args()
    out: dict = {"kills": [], "pauses": []}
    pooler, stop_pooler = None, None
    if args.pgbouncer:
        from tests.services import PGBOUNCER_STOCK, start_pgbouncer

        folder = tempfile.mkdtemp(prefix="celery-recovery-bench-pgbouncer-")
        pooler, stop_pooler = start_pgbouncer(folder, PGBOUNCER_STOCK)
    try:
        _measure(args, pooler, out)
    finally:
        if stop_pooler is not None:
            stop_pooler()
    print(json.dumps(out, indent=2))


def _measure(args: argparse.Namespace, pooler: int | None, out: dict) -> None:
    for preset in args.presets.split(","):
        for markers in args.markers.split(","):
            for target in args.targets.split(",") if args.kills else ():
                run = _on_a_new_store(
                    serial_kills, pooler, preset, args.kills, target, markers, args.task_seconds
                )
                print(json.dumps(run), file=sys.stderr)
                out["kills"].append(run)
            if args.pause:
                run = _on_a_new_store(pause, pooler, preset, args.pause, markers)
                print(json.dumps(run), file=sys.stderr)
                out["pauses"].append(run)


if __name__ == "__main__":
    main()
