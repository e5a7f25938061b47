"""Fixtures: real ``celery -A ... recovery triggerer`` subprocesses."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import app_env
from tests.workers import SessionProcess, wait_for


class TriggererProcess(SessionProcess):
    """One triggerer in its own session, so SIGKILL takes it down at once."""

    def __init__(self, env: dict[str, str], log_path: Path, args: list[str]) -> None:
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.apps.lifecycle",
            "recovery",
            "triggerer",
            *args,
        ]
        super().__init__(command, env, log_path)

    def job_id(self, store) -> str:
        """This triggerer's job id, once it registered."""

        def found():
            for job in store.jobs.list_jobs(job_type="triggerer", state="running"):
                if job["pid"] == self.pid:
                    return job["id"]
            if self.proc.poll() is not None:
                raise AssertionError(f"triggerer exited early:\n{self.log[-3000:]}")
            return None

        return wait_for(found, 20, what="the triggerer's job row")

    def terminate(self, timeout: float = 15.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


@pytest.fixture
def start_triggerer(
    store_url: str, broker_urls: tuple[str, str], queue: str, tmp_path: Path
) -> Iterator[Callable[..., TriggererProcess]]:
    procs: list[TriggererProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> TriggererProcess:
        full_env = {**app_env(store_url, broker_urls, queue), **(env or {})}
        proc = TriggererProcess(full_env, tmp_path / f"triggerer-{len(procs)}.log", list(args))
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
