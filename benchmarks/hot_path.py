"""What the hot path costs per task, piece by piece, in one process and without a broker.

``throughput.py`` runs the real thing, but on a shared two-core machine its
rates, and even its CPU per task, move by 10-25 % between runs: too much to
see a change of a few percent.  This measures the pieces alone:

- ``pool``: tasks run through Celery's own tracer, as a prefork pool process
  runs them (``fast_trace_task``), plain and with ``Recovery(app)``: the
  ``before_start`` that claims the try, the resume ``__call__`` and the
  ``task_postrun`` handler.  The
  writer only buffers here (its batches are the next piece).  ``recovery``
  runs messages published seconds ago (the claim leaves the message to the
  publisher's record), ``recovery-fresh`` messages published just now, as a
  queue that keeps up delivers them (the claim carries the message too),
  ``recovery-excluded`` a task ``recovery_exclude_tasks`` names;
- ``publisher``: ``apply_async`` through kombu's in-memory transport, plain
  and with ``Recovery(app)`` (also for an excluded task), the writer only
  buffering;
- ``writer``: a pool process's finished claims and a publisher's queued rows,
  applied by the write-behind path (``TryRepository.apply_writes``) in
  batches of 50, per row, on PostgreSQL and SQLite (client side only).

By default each figure is CPU time (``time.process_time``), the median of
``--repeat`` fresh processes.  With ``--instructions`` it is the number of
instructions valgrind's callgrind counts, which is the same on any machine
whatever else it runs: each piece runs twice, with N and 2N tasks, and the
difference is divided by N, so start-up cancels out.  The ``pool`` and
``publisher`` figures include building each message; what matters is the
difference between plain and ``Recovery``, which the report gives.

    python benchmarks/hot_path.py
    python benchmarks/hot_path.py --instructions
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

#: The pieces and the variants each is measured in.
PIECES = {
    "pool": ("plain", "recovery", "recovery-fresh", "recovery-excluded"),
    "publisher": ("plain", "recovery", "recovery-excluded"),
    "writer": ("postgres-claims", "postgres-queued", "sqlite-claims", "sqlite-queued"),
}
#: Rows per batch of the ``writer`` piece (a busy pool process writes about this many).
BATCH = 50


class _NoHeartbeat:
    """A job without a heartbeat thread (its beats would be noise in the counts)."""

    job_id = "hot-path-benchmark"

    def stop(self, state: Any) -> None:
        pass


def _app(variant: str, store_url: str | None) -> tuple[Any, Any]:
    """The benchmark's app: plain, or with ``Recovery(app)`` (``recovery-excluded``: with
    the task named in ``recovery_exclude_tasks``)."""
    from celery import Celery

    app = Celery("hot_path", broker="memory://", backend="cache+memory://")
    installed = None
    if variant != "plain":
        from celery_recovery import Recovery

        app.conf.recovery_database_url = store_url
        if variant == "recovery-excluded":
            app.conf.recovery_exclude_tasks = ["bench.*"]
        installed = Recovery(app)
        runtime = installed.runtime
        runtime.heartbeat = _NoHeartbeat()  # type: ignore[assignment]
        # Buffer only: the writer's batches are measured by the ``writer`` piece.
        runtime.writer._start = lambda: None  # type: ignore[method-assign]

    @app.task(name="bench.noop")
    def noop(i: int) -> int:
        return i

    return app, installed


def _drain(installed: Any) -> None:
    """Take what the writer buffered, as its batches would: records it builds when it
    takes a batch are built (that work is the hot path's too, in the writer's thread),
    then forgotten (records kept for the whole run would make the garbage collector's
    passes ever longer)."""
    if installed is not None:
        from celery_recovery.runtime.write_behind import _resolved

        writer = installed.runtime.writer
        _resolved(list(writer._pending))
        writer._pending.clear()
        writer._open_claims.clear()


def _sqlite_store() -> str:
    from benchmarks.throughput import create_sqlite_store

    return create_sqlite_store(tempfile.mkdtemp(prefix="hot-path-"))


def run_pool(variant: str, n: int) -> float:
    """CPU seconds of ``n`` no-op tasks run through the worker's tracer."""
    from celery.app.trace import build_tracer, fast_trace_task, setup_worker_optimizations

    app, installed = _app(variant, _sqlite_store())
    # Seconds since its publish: long enough ago for a narrow claim, or just now.
    age = 0.0 if variant == "recovery-fresh" else 5.0
    setup_worker_optimizations(app, "hot-path")
    task = app.tasks["bench.noop"]
    task.__trace__ = build_tracer(task.name, task, app.loader, "hot-path", app=app)
    body = ((1,), {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None})

    def request(task_id: str) -> dict[str, Any]:
        headers = dict(app.amqp.as_task_v2(task_id, task.name, (1,), {}).headers)
        # As a publisher with celery-recovery stamps it.
        headers["recovery_published_at"] = time.time() - age
        headers["delivery_info"] = {"exchange": "", "routing_key": "celery", "redelivered": False}
        return headers

    def run(count: int) -> None:
        for i in range(count):
            task_id = str(uuid.uuid4())
            fast_trace_task(task.name, task_id, request(task_id), body, None, None)
            if i % BATCH == 0:
                _drain(installed)

    run(max(n // 10, 10))  # warm: first calls build caches
    start = time.process_time()
    run(n)
    return time.process_time() - start


def run_publisher(variant: str, n: int) -> float:
    """CPU seconds of ``n`` ``apply_async`` calls through kombu's in-memory transport."""
    app, installed = _app(variant, _sqlite_store())
    task = app.tasks["bench.noop"]

    def run(count: int) -> None:
        for i in range(count):
            task.delay(i)
            if i % BATCH == 0:
                _drain(installed)

    run(max(n // 10, 10))
    start = time.process_time()
    run(n)
    return time.process_time() - start


def _claim(now: Any) -> dict[str, Any]:
    from celery_recovery.core.states import TaskState

    task_id = str(uuid.uuid4())
    return {
        "task_id": task_id,
        "try_number": 1,
        "task_name": "bench.noop",
        "state": TaskState.SUCCESS,  # a short task's claim, its outcome folded in
        "external_executor_id": task_id,
        "job_id": uuid.uuid4().hex,
        "worker_hostname": "celery@hot-path",
        "worker_pid": 4242,
        "queued_at": now,
        "started_at": now,
        "ended_at": now,
        "updated_at": now,
        "republishable": False,
        "republish_error": "awaiting the publisher's record",
    }


def _queued(now: Any) -> dict[str, Any]:
    from celery_recovery.core.states import TaskState
    from celery_recovery.messages.records import encode_json

    task_id = str(uuid.uuid4())
    return {
        "task_id": task_id,
        "try_number": 1,
        "task_name": "bench.noop",
        "state": TaskState.QUEUED,
        "external_executor_id": task_id,
        "queue": "celery",
        "exchange": "",
        "routing_key": "celery",
        "priority": None,
        "headers": encode_json({"lang": "py", "root_id": task_id, "parent_id": None})[0],
        "args": encode_json([1])[0],
        "kwargs": encode_json({})[0],
        "options": encode_json({"embed": {}})[0],
        "eta": None,
        "expires": None,
        "queued_at": now,
        "updated_at": now,
        "republishable": True,
        "republish_error": None,
    }


def run_writer(variant: str, n: int) -> float:
    """CPU seconds of writing ``n`` rows in batches of :data:`BATCH` (client side)."""
    from benchmarks.throughput import PG_ADMIN, create_database, drop_database
    from celery_recovery.core.records import WriteKind
    from celery_recovery.core.timeutils import utcnow
    from celery_recovery.store import Store

    store_kind, rows = variant.split("-")
    name = None
    if store_kind == "postgres":
        name = create_database()
        url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    else:
        url = _sqlite_store()
    store = Store(url)
    kind, make = (WriteKind.RUNNING, _claim) if rows == "claims" else (WriteKind.QUEUED, _queued)
    try:

        def batches(count: int) -> list[list[tuple[Any, Any]]]:
            now = utcnow()
            return [
                [(kind, make(now)) for _ in range(BATCH)] for _ in range(max(count // BATCH, 1))
            ]

        for batch in batches(BATCH * 4):  # warm: connection, compiled statements
            store.tries.apply_writes(batch)
        todo = batches(n)
        start = time.process_time()
        for batch in todo:
            store.tries.apply_writes(batch)
        return time.process_time() - start
    finally:
        store.dispose()
        if name is not None:
            drop_database(name)


RUNNERS = {"pool": run_pool, "publisher": run_publisher, "writer": run_writer}


def _one(piece: str, variant: str, n: int, instructions: bool) -> float:
    """One measurement in a fresh process: CPU seconds, or instructions under callgrind."""
    command = [sys.executable, __file__, "--measure", piece, variant, str(n)]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    if instructions:
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command]
        env["PYTHONHASHSEED"] = "0"  # the same string hashes, so the same dict probes
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{piece}/{variant} failed:\n{done.stderr[-3000:]}")
    if instructions:
        found = re.search(r"Collected : (\d+)", done.stderr)
        if found is None:
            raise SystemExit(f"callgrind printed no count:\n{done.stderr[-2000:]}")
        return float(found.group(1))
    return float(json.loads(done.stdout.strip().splitlines()[-1])["cpu_s"])


def measure(piece: str, variant: str, n: int, repeat: int, instructions: bool) -> float:
    """Per task (or row): microseconds of CPU, or instructions."""
    if instructions:
        return (_one(piece, variant, 2 * n, True) - _one(piece, variant, n, True)) / n
    return statistics.median(_one(piece, variant, n, False) * 1e6 / n for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instructions", action="store_true", help="count with callgrind")
    parser.add_argument("--tasks", type=int, help="tasks (rows) per measurement")
    parser.add_argument("--repeat", type=int, default=5, help="processes per CPU-time figure")
    parser.add_argument("--pieces", default=",".join(PIECES))
    parser.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        piece, variant, n = args.measure
        print(json.dumps({"cpu_s": RUNNERS[piece](variant, int(n))}))
        return
    n = args.tasks or (2000 if args.instructions else 20000)
    unit = "instructions" if args.instructions else "cpu_us"
    report: dict[str, Any] = {"unit": f"{unit} per task (writer: per row)", "tasks": n}
    for piece in args.pieces.split(","):
        figures = {
            v: round(measure(piece, v, n, args.repeat, args.instructions), 1) for v in PIECES[piece]
        }
        if "plain" in figures:
            figures["added"] = round(figures["recovery"] - figures["plain"], 1)
        if "recovery-fresh" in figures:
            figures["added_fresh"] = round(figures["recovery-fresh"] - figures["plain"], 1)
        if "recovery-excluded" in figures:
            figures["added_excluded"] = round(figures["recovery-excluded"] - figures["plain"], 1)
        report[piece] = figures
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
