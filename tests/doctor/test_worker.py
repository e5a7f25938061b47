"""A real worker runs the doctor once when it is ready and logs what it finds,
without waiting for it; ``recovery_doctor_at_start = False`` turns it off."""

from __future__ import annotations

import re

import pytest
from celery import Celery

from tests.workers import WorkerProcess, wait_for

pytestmark = pytest.mark.slow

SUMMARY = re.compile(r"doctor: \d+ finding\(s\)")


def start(name, broker, backend, store_url, queue, tmp_path, **env):
    worker_env = {
        "DOCTOR_TEST_BROKER": broker,
        "DOCTOR_TEST_BACKEND": backend,
        "DOCTOR_TEST_QUEUE": queue,
        "DOCTOR_TEST_INSTALL": "1",
        "CELERY_RECOVERY_DATABASE_URL": store_url,
        **env,
    }
    return WorkerProcess(
        "tests.doctor.app",
        worker_env,
        tmp_path / f"{name}.log",
        concurrency=1,
        name=name,
        queue=queue,
    )


def add_on(queue, broker, backend):
    client = Celery("doctor_client", broker=broker, backend=backend, set_as_current=False)
    try:
        return client.send_task("doctor.add", (2, 3), queue=queue).get(timeout=30)
    finally:
        client.close()


def test_the_worker_logs_the_findings_once_after_it_is_ready(bad_redis, sqlite_url, tmp_path):
    broker, backend = f"{bad_redis.url}/0", f"{bad_redis.url}/1"
    on = start("on", broker, backend, sqlite_url, "doctor-on", tmp_path)
    off = start(
        "off",
        broker,
        backend,
        sqlite_url,
        "doctor-off",
        tmp_path,
        CELERY_RECOVERY_DOCTOR_AT_START="false",
    )
    try:
        on.wait_ready()
        wait_for(lambda: SUMMARY.search(on.log), 30, what="the doctor's summary in the log")
        log = on.log
        assert log.index(" ready.") < log.index("doctor finding redis-eviction (error) in redis")
        assert "CONFIG SET maxmemory-policy noeviction" in log
        assert "doctor finding redis-not-persistent (warning)" in log
        assert len(SUMMARY.findall(log)) == 1
        assert "doctor: 2 finding(s), 0 question(s) it cannot tell" in log
        assert add_on("doctor-on", broker, backend) == 5  # the worker works on

        off.wait_ready()
        assert add_on("doctor-off", broker, backend) == 5
        assert "doctor finding" not in off.log and not SUMMARY.search(off.log)
    finally:
        on.kill()
        off.kill()
