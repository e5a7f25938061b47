"""Run the demo: two workers, tasks, a SIGKILL, and the recovery, shown live."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

ORDERS = 4
TASK_SECONDS = 4.0
DEADLINE = 50.0


def run_demo(echo: Callable[[str], None] = click.echo) -> int:
    """Returns the exit status: 0 when every task completed exactly once after the kill."""
    # The demo prints what the sweep does itself; keep its log lines off the screen.
    logging.getLogger("celery_recovery").setLevel(logging.ERROR)
    folder = Path(tempfile.mkdtemp(prefix="celery-recovery-demo-"))
    for sub in ("broker", "control"):
        (folder / sub).mkdir()
    os.environ["RECOVERY_DEMO_DIR"] = str(folder)
    from celery_recovery.demo.app import app, recovery  # configured from the folder above

    workers: dict[str, subprocess.Popen[bytes]] = {}
    started = time.monotonic()
    try:
        for name in ("alpha", "beta"):
            workers[name] = _start_worker(name, folder)
        echo(_bold("celery-recovery demo") + f"  (store: {recovery.settings.masked_database_url})")
        echo(
            f"started workers alpha (pid {workers['alpha'].pid}) and beta "
            f"(pid {workers['beta'].pid}); preset 'aggressive': zombie after "
            f"{recovery.settings.zombie_threshold:g}s, sweep every "
            f"{recovery.settings.sweep_interval:g}s"
        )
        # Each worker is two jobs: its main process and its one pool process.
        _wait(lambda: len(recovery.store.jobs.list_jobs("worker")) >= 4, 30, "workers to start")
        results = [app.send_task("demo.charge_order", (i, TASK_SECONDS)) for i in range(ORDERS)]
        echo(f"sent {ORDERS} tasks that take {TASK_SECONDS:g}s each")

        victim, task_id = _wait(lambda: _running_on(recovery, workers), 20, "a task to start")
        os.killpg(workers[victim].pid, signal.SIGKILL)
        workers[victim].wait()
        killed = time.monotonic()
        echo(_red(f"SIGKILL worker {victim} (whole process group) while it runs task {task_id}"))
        echo("  plain Celery would now lose that task for good (early ack); watching recovery:")

        recovered_at = _watch(recovery, results, killed, echo)
        status = _summary(recovery, results, task_id, killed, recovered_at, started, echo)
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        recovery.close()
        kept = _keep_store(folder / "celery_recovery.sqlite3")
        shutil.rmtree(folder, ignore_errors=True)
    echo("")
    echo("see it in the console (read-only; then open http://127.0.0.1:9809/recoveries):")
    echo(f"  celery-recovery --database-url sqlite:///{kept} web")
    echo("  (needs the web extra: pip install 'celery-recovery[web]')")
    return status


#: Where the demo leaves a copy of its store, for the console (replaced by each run).
KEPT_STORE = Path(tempfile.gettempdir()) / "celery-recovery-demo.sqlite3"


def _keep_store(store: Path) -> Path:
    """Copy the demo's store (a consistent snapshot, WAL included) to :data:`KEPT_STORE`."""
    import sqlite3

    source = sqlite3.connect(store)
    target = sqlite3.connect(KEPT_STORE)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()
    return KEPT_STORE


def _start_worker(name: str, folder: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RECOVERY_DEMO_DIR": str(folder), "C_FORCE_ROOT": "1"}
    log = open(folder / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the worker
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "celery_recovery.demo.app",
            "worker",
            "-P",
            "prefork",
            "-c",
            "1",
            "-n",
            f"{name}@%h",
            "-l",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-O",
            "fair",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _running_on(recovery: Any, workers: dict[str, subprocess.Popen[bytes]]) -> Any:
    for record in recovery.store.tries.list_tries(state="running"):
        job = recovery.store.jobs.get_job(record["job_id"]) if record["job_id"] else None
        if job and job["node_name"]:
            name = job["node_name"].split("@", 1)[0]
            if name in workers:
                return name, record["task_id"]
    return None


def _watch(recovery: Any, results: list, killed: float, echo: Callable[[str], None]) -> float:
    """Sweep every sweep interval (what beat does) and print what happens."""
    recovered_at = None
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        report = recovery.sweep()
        since = time.monotonic() - killed
        if report.zombies:
            echo(
                _yellow(
                    f"  +{since:4.1f}s  sweep found {report.zombies} zombie(s): worker "
                    "stopped heartbeating; asked the result backend: not finished"
                )
            )
        if report.republished:
            recovered_at = recovered_at or time.monotonic()
            echo(
                _green(
                    f"  +{since:4.1f}s  re-published {report.republished} task(s) as try 2 "
                    "(same task id, retries + 1)"
                )
            )
        if report.reserved_republished:
            recovered_at = recovered_at or time.monotonic()
            echo(
                _green(
                    f"  +{since:4.1f}s  re-published {report.reserved_republished} task(s) the "
                    "dead worker had taken but not started (prefetched)"
                )
            )
        if report.lost_republished:
            echo(
                _yellow(
                    f"  +{since:4.1f}s  {report.lost_republished} message(s) the dead worker "
                    "had taken were lost: re-published"
                )
            )
        done = sum(1 for r in results if r.ready())
        if done == len(results):
            echo(_green(f"  +{since:4.1f}s  all {len(results)} tasks finished"))
            return recovered_at or time.monotonic()
        time.sleep(recovery.settings.sweep_interval)
    return recovered_at or float("nan")


def _summary(
    recovery: Any,
    results: list,
    killed_task: str,
    killed: float,
    recovered_at: float,
    started: float,
    echo: Callable[[str], None],
) -> int:
    # Workers write outcomes behind (every 20 ms): let the last ones land.
    def settled() -> bool:
        return all(
            (tries := recovery.store.tries.history(r.id)) and tries[-1]["state"] == "success"
            for r in results
            if r.successful()
        )

    deadline = time.monotonic() + 10
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.1)
    echo("")
    echo(_bold(f"{'task':<38} {'tries':<26} {'result'}"))
    ok = True
    for result in results:
        tries = recovery.store.tries.history(result.id)
        states = " -> ".join(f"{t['try_number']}:{t['state']}" for t in tries)
        value = result.result if result.successful() else result.state
        mark = "  <- killed" if result.id == killed_task else ""
        echo(f"{result.id:<38} {states:<26} {value}{mark}")
        ok &= result.successful() and tries[-1]["state"] == "success"
    echo("")
    echo(
        f"kill -> re-published: {recovered_at - killed:.1f}s; "
        f"whole demo: {time.monotonic() - started:.1f}s"
    )
    if ok:
        echo(_green("recovered: every task completed, the killed one on the other worker."))
        return 0
    echo(_red("NOT recovered: some task did not complete (see the table)."))
    return 1


def _wait(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise click.ClickException(f"demo: timed out waiting for {what}")


def _bold(text: str) -> str:
    return click.style(text, bold=True)


def _red(text: str) -> str:
    return click.style(text, fg="red")


def _green(text: str) -> str:
    return click.style(text, fg="green")


def _yellow(text: str) -> str:
    return click.style(text, fg="yellow")
