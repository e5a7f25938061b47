"""A process's job row is in the store before the process takes work."""

from __future__ import annotations

import sqlite3
import threading
import time

from celery import Celery

from celery_recovery import JobType, Recovery
from tests.workers import wait_for


def test_a_job_started_while_the_store_is_busy_is_registered_before_start_job_returns(
    sqlite_url,
):
    # A worker's pool processes start together and each opens the store: one holds
    # SQLite's write lock (here for 0.3 s) while another registers its job.  A pool
    # process that took a task before its row landed, killed at once, would leave a
    # try no sweep judges until the missing-job grace passes.
    app = Celery("registration", broker="memory://", set_as_current=False)
    app.conf.recovery_database_url = sqlite_url
    recovery = Recovery(app)
    recovery.store.jobs.list_jobs()  # the schema exists before the lock is taken
    path = sqlite_url.removeprefix("sqlite:///")
    locked, release = threading.Event(), threading.Event()

    def hold_the_write_lock() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(5)
        conn.execute("COMMIT")
        conn.close()

    holder = threading.Thread(target=hold_the_write_lock)
    holder.start()
    try:
        assert locked.wait(5)
        threading.Timer(0.3, release.set).start()
        job_id = recovery.runtime.start_job(JobType.WORKER, node_name="w@host")
        assert recovery.runtime.heartbeat.registered, "start_job returned before its row landed"
        assert recovery.store.jobs.get_job(job_id) is not None
    finally:
        release.set()
        holder.join(5)
        recovery.close()


def test_a_job_whose_store_is_down_still_starts(tmp_path):
    # The store unreachable: the process carries on (its heartbeat keeps trying).
    app = Celery("registration", broker="memory://", set_as_current=False)
    app.conf.recovery_database_url = "postgresql+psycopg://postgres@127.0.0.1:1/none"
    recovery = Recovery(app)
    done = []
    thread = threading.Thread(
        target=lambda: done.append(recovery.runtime.start_job(JobType.WORKER)), daemon=True
    )
    began = time.monotonic()
    thread.start()
    wait_for(lambda: done, 10, what="start_job to return with the store down")
    print(f"start_job returned after {time.monotonic() - began:.2f}s with the store down")
    assert not recovery.runtime.heartbeat.registered
