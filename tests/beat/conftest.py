"""Real ``celery beat`` processes running :class:`celery_recovery.beat.Scheduler`."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from celery_recovery.messages.headers import RESENT_HEADER
from tests.conftest import app_env
from tests.workers import SessionProcess, WorkerProcess, wait_for


class BeatProcess(SessionProcess):
    """One ``celery beat`` in its own session: SIGKILL, SIGSTOP and SIGCONT it whole."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        command = [sys.executable, "-m", "celery", "-A", "tests.apps.beat_app", "beat"]
        super().__init__([*command, "-l", "INFO"], env, log_path)


@pytest.fixture
def start_ha_beat(
    store_url: str, broker_urls: tuple[str, str], queue: str, tmp_path: Path
) -> Iterator[Callable[..., BeatProcess]]:
    """Start beats running the given schedule (see tests/apps/beat_app.py); killed at the end."""
    beats: list[BeatProcess] = []

    def start(
        schedule: dict[str, Any],
        sweep: bool = False,
        database_url: str | None = None,
        env: dict[str, str] | None = None,
    ) -> BeatProcess:
        env = {
            **app_env(database_url or store_url, broker_urls, queue),
            "RECOVERY_TEST_BEAT_SCHEDULE": json.dumps(schedule),
            **(env or {}),
        }
        if sweep:
            env["RECOVERY_TEST_BEAT_INTERVAL"] = "1.0"
        beat = BeatProcess(env, tmp_path / f"beat{len(beats) + 1}.log")
        beats.append(beat)
        return beat

    yield start
    for beat in beats:
        if beat.proc.poll() is None:
            beat.signal(signal.SIGCONT)
        beat.kill()


@pytest.fixture
def start_beat_worker(
    store_url: str, broker_urls: tuple[str, str], queue: str, tmp_path: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    """A real worker of tests/apps/beat_app.py (it knows ``beat.ledger``); SIGKILLed at the end."""
    workers: list[WorkerProcess] = []

    def start(
        pool: str = "solo", concurrency: int = 1, env: dict[str, str] | None = None
    ) -> WorkerProcess:
        env = {**app_env(store_url, broker_urls, queue), **(env or {})}
        log = tmp_path / f"worker{len(workers) + 1}.log"
        worker = WorkerProcess(
            "tests.apps.beat_app", env, log, pool=pool, concurrency=concurrency, queue=queue
        )
        workers.append(worker)
        return worker.wait_ready()

    yield start
    for worker in workers:
        worker.kill()


def queued_runs(
    broker_url: str, queue: str, copies: bool = False
) -> list[tuple[str, str, datetime]]:
    """(task name, task id, scheduled time) of every message waiting in the Redis queue.

    A run a new leader sent again, not knowing whether its claimant had sent it, is
    marked as a possible copy (a worker drops it if the first ran): left out unless
    ``copies``.
    """
    import redis

    client = redis.Redis.from_url(broker_url)
    runs = []
    for raw in reversed(client.lrange(queue, 0, -1)):  # LPUSHed: oldest last
        headers = json.loads(raw)["headers"]
        scheduled = headers.get("recovery_scheduled_at")
        if scheduled is None or (headers.get(RESENT_HEADER) and not copies):
            continue
        runs.append((headers["task"], headers["id"], datetime.fromisoformat(scheduled)))
    return runs


def leader_pid(store: Any) -> int | None:
    """The pid of the beat holding the lease now (its holder name is ``rand:pid@host``)."""
    lease = store.leases.lease("beat-leader")
    if not lease or not lease["holder"]:
        return None
    return int(lease["holder"].split(":", 1)[1].split("@", 1)[0])


def wait_for_leader(store: Any, beats: list[BeatProcess], timeout: float = 30.0) -> BeatProcess:
    by_pid = {b.pid: b for b in beats}
    return wait_for(lambda: by_pid.get(leader_pid(store) or 0), timeout, what="a beat to lead")
