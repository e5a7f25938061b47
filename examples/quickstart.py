"""Quickstart: celery-recovery on a laptop, with no server at all.

Run it with ``python examples/quickstart.py``.  It uses Celery's
``filesystem://`` broker, an SQLite result backend and the package's embedded
SQLite store, starts a real worker, sends a task that succeeds, one that
fails and one that retries, and prints what the store recorded about each.
It exits with status 1 if any record is not what it should be.

The same file is the Celery app the worker imports (``-A quickstart``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from celery import Celery

from celery_recovery import Recovery

WORKDIR = Path(os.environ.get("QUICKSTART_DIR", Path.cwd() / ".demo" / "quickstart")).resolve()
BROKER_DIR = WORKDIR / "broker"

app = Celery(
    "quickstart",
    broker="filesystem://",
    backend=f"db+sqlite:///{WORKDIR / 'results.sqlite3'}",
)
app.conf.broker_transport_options = {
    "data_folder_in": str(BROKER_DIR),
    "data_folder_out": str(BROKER_DIR),
    "control_folder": str(WORKDIR / "control"),
}
app.conf.recovery_database_url = f"sqlite:///{WORKDIR / 'celery_recovery.sqlite3'}"
recovery = Recovery(app)


@app.task
def add(x, y):
    return x + y


@app.task
def fail():
    raise ValueError("this task always fails")


@app.task(bind=True, max_retries=2)
def flaky(self):
    if self.request.retries == 0:
        raise self.retry(countdown=0.5, exc=ConnectionError("first try fails"))
    return "ok on try 2"


def main() -> int:
    for folder in (BROKER_DIR, WORKDIR / "control"):
        folder.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parent),
        "QUICKSTART_DIR": str(WORKDIR),
        "C_FORCE_ROOT": "1",
    }
    log = open(WORKDIR / "worker.log", "w")  # noqa: SIM115
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "quickstart",
            "worker",
            "-c",
            "2",
            "-l",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=WORKDIR,
    )
    try:
        results = {
            "add(2, 3)": add.delay(2, 3),
            "fail()": fail.delay(),
            "flaky()": flaky.delay(),
        }
        print(f"worker pid {worker.pid}; store {recovery.settings.masked_database_url}")
        for label, result in results.items():
            try:
                value = result.get(timeout=30, propagate=False)
            except Exception as exc:  # the backend itself failed: report and go on
                value = exc
            print(f"  {label:<10} -> {result.state:<8} {value!r}")
        recovery.flush()
        return report(results)
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()
        recovery.close()


def report(results: dict) -> int:
    expected = {
        "add(2, 3)": ["success"],
        "fail()": ["failed"],
        "flaky()": ["up_for_retry", "success"],
    }
    deadline = time.monotonic() + 10
    while True:
        seen = {
            label: [t["state"] for t in recovery.store.tries.history(r.id)]
            for label, r in results.items()
        }
        if seen == expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    print("\nWhat celery-recovery recorded:")
    print(f"  {'task':<10} {'try':>3}  {'state':<13} {'worker job':<12} {'ran for':>8}  note")
    for label, result in results.items():
        for t in recovery.store.tries.history(result.id):
            took = ""
            if t["started_at"] and t["ended_at"]:
                took = f"{(t['ended_at'] - t['started_at']).total_seconds() * 1000:.0f} ms"
            note = t["error"] or t["state_reason"] or ""
            job = (t["job_id"] or "")[:10]
            print(
                f"  {label:<10} {t['try_number']:>3}  {t['state']:<13} {job:<12} {took:>8}  {note}"
            )
    jobs = recovery.store.jobs.list_jobs("worker")
    print(f"\nWorker jobs with heartbeats: {len(jobs)} (one per pool process)")
    if seen != expected:
        print(f"\nUNEXPECTED records: {seen}, expected {expected}", file=sys.stderr)
        return 1
    print("\nAll records are as expected.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
