"""Capacity of one PostgreSQL store: the write path of many publishers and workers.

Celery itself is left out: each simulated process makes the records the
signal handlers make and hands them to the same write-behind writer, so what
is measured is the store's side of the hot path.  Per stream of tasks there
are three processes (not threads), as in a deployment:

- a publisher: the ``queued`` record of each message it publishes;
- a worker's main process: the reservation of each message it receives
  (committed every 0.2 s, as a prefork main process does);
- a pool process: the ``running`` claim when the task starts and its outcome
  when it ends (a no-op task).

Each level offers a total rate, spread over the streams, for a fixed time;
the report says which rate was sustained (every record written), the
server's CPU per task (its backends' CPU in ``/proc``), and rows and
commits per task.  The last level (``max``) runs every process flat out.
The simulated processes run on the same machine as the server, so the
highest rates say as much about this machine's cores as about PostgreSQL:
size a database by ``server_cpu_ms_per_task``.

    python benchmarks/capacity.py --streams 4 --rates 500,1000,2000,max --seconds 10
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

from benchmarks.throughput import (  # noqa: E402
    PG_ADMIN,
    create_database,
    drop_database,
    process_cpu,
    server_pids,
    table_counters,
    wait_for_backends_to_leave,
)

#: Seconds a worker's pool process starts a task after its publisher sent it.
START_LAG = 0.003
ROLES = ("publisher", "receiver", "runner")


def _schedule(rate: float | None, index: int, start: float, lag: float) -> None:
    """Wait until task ``index`` of a stream offered at ``rate`` is due (None: at once)."""
    if rate is None:
        return
    delay = start + lag + index / rate - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _published_at(start_epoch: float, rate: float | None, index: int) -> float:
    """The publish time a stream's task ``index`` carries in its header (both roles agree)."""
    return start_epoch + index / (rate or 1000.0)


def _request(task_id: str, published_at: float) -> Any:
    """What a pool process's ``task.request`` holds for a no-op task."""
    return SimpleNamespace(
        id=task_id,
        recovery_published_at=published_at,
        retries=0,
        args=[1],
        kwargs={},
        callbacks=None,
        errbacks=None,
        chain=None,
        chord=None,
        root_id=task_id,
        parent_id=None,
        group=None,
        group_index=None,
        shadow=None,
        origin="gen1@bench",
        delivery_info={"exchange": "", "routing_key": "celery", "priority": 0},
        eta=None,
        expires=None,
        hostname="celery@bench",
    )


def run_role(
    role: str,
    stream: str,
    url: str,
    rate: float | None,
    tasks: int,
    clock: Any,
    out: Any,
    go: Any,
    leave: Any,
) -> None:
    """One simulated process: write ``tasks`` tasks' records of ``role``, then report.

    It says it is ready on ``out``, starts at the instants ``clock`` holds once
    ``go`` is set, and keeps its connections until ``leave`` is set (the
    server's CPU is read from its backends before they end).
    """
    from celery_recovery.core.records import Transition, WriteKind
    from celery_recovery.core.settings import RecoverySettings
    from celery_recovery.core.states import JobType, TaskState
    from celery_recovery.core.timeutils import utcnow
    from celery_recovery.messages.records import (
        capture_publish,
        claim_from_request,
        record_from_capture,
    )
    from celery_recovery.runtime.process import ProcessRuntime
    from celery_recovery.signals.reservations import MAIN_PROCESS_FLUSH_INTERVAL
    from celery_recovery.store import Store

    settings = RecoverySettings.from_sources(overrides={"recovery_database_url": url})
    runtime = ProcessRuntime(Store(url), settings)
    job_id = None
    if role != "publisher":
        job_id = runtime.start_job(JobType.WORKER, node_name=f"{role}@{stream}")
    if role == "receiver":
        runtime.writer.flush_interval = MAIN_PROCESS_FLUSH_INTERVAL
    runtime.store.ensure_ready()
    lag = {"publisher": 0.0, "receiver": START_LAG / 2, "runner": START_LAG}[role]
    out.put({"ready": role})
    go.wait()
    start, start_epoch = clock[0], clock[1]
    cpu_start = time.process_time()
    while time.monotonic() < start:
        time.sleep(0.001)
    for index in range(tasks):
        _schedule(rate, index, start, lag)
        task_id = f"{stream}-{index}"
        now = utcnow()
        published = _published_at(start_epoch, rate, index)
        if role == "publisher":
            headers = {"id": task_id, "task": "bench.noop", "retries": 0, "root_id": task_id}
            body = ([index], {}, {"callbacks": None, "errbacks": None, "chain": None})
            capture = capture_publish(headers, body, "", "celery", None, {"priority": 0}, published)
            assert capture is not None
            runtime.write(WriteKind.QUEUED, record_from_capture(capture))
        elif role == "receiver":
            runtime.write(WriteKind.RESERVED, (task_id, 1, job_id, now))
        else:
            task = SimpleNamespace(name="bench.noop", request=_request(task_id, published))
            # As the task classes' before_start claims: the message is added only if the
            # try has not ended when the writer takes the claim.
            runtime.record_start(
                claim_from_request(task, now, job_id, task.request, message_when_written=True)
            )
            done = utcnow()
            runtime.write(
                WriteKind.TRANSITION,
                Transition(
                    task_id,
                    1,
                    (TaskState.RUNNING,),
                    {"state": TaskState.SUCCESS, "ended_at": done, "updated_at": done},
                ),
            )
    runtime.writer.flush(timeout=120)
    out.put(
        {
            "role": role,
            "finished": time.monotonic(),
            "cpu": time.process_time() - cpu_start,
        }
    )
    leave.wait()
    runtime.close()


def run_level(url: str, streams: int, rate: float | None, seconds: float, tasks_max: int) -> dict:
    per_stream = rate / streams if rate is not None else None
    tasks = int(per_stream * seconds) if per_stream is not None else tasks_max
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    go, leave = ctx.Event(), ctx.Event()
    clock = ctx.Array("d", 2)  # when the streams start: monotonic and wall clock
    # A stream's three roles share its task ids.
    names = [f"s{n}-{uuid.uuid4().hex[:6]}" for n in range(streams)]
    procs = [
        ctx.Process(
            target=run_role,
            args=(role, name, url, per_stream, tasks, clock, out, go, leave),
        )
        for name in names
        for role in ROLES
    ]
    before = table_counters(url)
    for proc in procs:
        proc.start()
    for _ in procs:
        out.get(timeout=120)  # every process connected and ready
    start = clock[0] = time.monotonic() + 0.2
    clock[1] = time.time() + 0.2
    go.set()
    servers = server_pids(url)
    server_cpu = process_cpu(servers)
    load = os.getloadavg()[0]
    reports = [out.get(timeout=600) for _ in procs]
    finished = max(r["finished"] for r in reports)
    server_cpu = process_cpu(server_pids(url)) - server_cpu
    leave.set()
    for proc in procs:
        proc.join(60)
    wait_for_backends_to_leave(url)
    delta = {k: v - before[k] for k, v in table_counters(url).items()}
    total = tasks * streams
    elapsed = finished - start
    client = {role: sum(r["cpu"] for r in reports if r["role"] == role) for role in ROLES}
    return {
        "offered_tasks_per_s": rate if rate is not None else "max",
        "sustained_tasks_per_s": round(total / elapsed, 1),
        "tasks": total,
        "load_1min": round(load, 2),
        "server_cpu_ms_per_task": round(1000 * server_cpu / total, 3),
        "server_cores_busy": round(server_cpu / elapsed, 2),
        "client_cpu_ms_per_task": {k: round(1000 * v / total, 3) for k, v in client.items()},
        "rows_per_task": round(
            (delta["inserted"] + delta["updated"] + delta["deleted"]) / total, 3
        ),
        "commits_per_task": round(delta["commits"] / total, 4),
        "hot_ratio": round(delta["task_hot_updates"] / max(delta["task_updates"], 1), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=4, help="publisher/worker triples")
    parser.add_argument("--rates", default="500,1000,2000,max", help="offered tasks/s per level")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each level")
    parser.add_argument("--max-tasks", type=int, default=5000, help="tasks per stream at max")
    args = parser.parse_args()
    name = create_database()
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    levels = []
    try:
        for rate in args.rates.split(","):
            offered = None if rate == "max" else float(rate)
            levels.append(run_level(url, args.streams, offered, args.seconds, args.max_tasks))
            print(json.dumps(levels[-1]), file=sys.stderr)
    finally:
        drop_database(name)
    print(json.dumps({"streams": args.streams, "levels": levels}, indent=2))


if __name__ == "__main__":
    main()
