"""Real ``celery worker`` subprocesses for the tests: start, wait, SIGKILL, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery_recovery.recovery import recovery_for_app

ROOT = Path(__file__).resolve().parent.parent


def wait_for(
    condition: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(interval)


def flush_publisher(app: Any) -> None:
    """Wait until ``app``'s buffered publisher records are in the store.

    A fresh task's worker claims it without its message (the publisher's record
    brings it, up to its flush interval later): a test that reads the message's
    columns right after the result must wait for that record.
    """
    assert recovery_for_app(app).flush(timeout=10), "the publisher's records were not written"


class SessionProcess:
    """A ``celery`` command in its own session, logging to a file: its whole process group
    can be signalled or SIGKILLed at once, as an OOM kill or an eviction would."""

    def __init__(
        self, command: list[str], env: dict[str, str], log_path: Path, cwd: Path = ROOT
    ) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in kill()/stop()
        # A project of its own (tests/django/project) runs from its folder, as
        # `celery -A proj worker` is run from a Django project's.
        path = os.pathsep.join(dict.fromkeys((str(cwd), str(ROOT))))
        self.proc = subprocess.Popen(
            command,
            cwd=cwd,
            env={**os.environ, **env, "PYTHONPATH": path},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        os.killpg(self.proc.pid, signum)

    def kill(self) -> None:
        """SIGKILL the whole process group."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()


class WorkerProcess(SessionProcess):
    """One ``celery worker`` in its own session, so its whole process group can be killed."""

    def __init__(
        self,
        app: str,
        env: dict[str, str],
        log_path: Path,
        pool: str = "prefork",
        concurrency: int = 2,
        name: str = "worker",
        queue: str = "celery",
        extra_args: tuple[str, ...] = (),
        prefix: tuple[str, ...] = (),
        cwd: Path = ROOT,
    ) -> None:
        self.name = name
        #: The node's name before ``@``: unique, because RabbitMQ keeps a killed worker's
        #: exclusive control queue (named after the node) for a moment, and a worker of
        #: the same name starting then exits.
        self.node = f"{name}-{uuid.uuid4().hex[:6]}"
        command = [
            *prefix,  # e.g. tests/fleet/elsewhere.sh: another host name and clock
            sys.executable,
            "-m",
            "celery",
            "-A",
            app,
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-n",
            f"{self.node}@%h",
            "-Q",
            queue,
            "-l",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            *extra_args,
        ]
        # CI runs as root, and some tests send pickled arguments on purpose.
        super().__init__(command, {"C_FORCE_ROOT": "1", **env}, log_path, cwd)

    def owns(self, node_name: str) -> bool:
        """True when ``node_name`` (``name@host``, as a job records it) is this worker's."""
        return node_name.startswith(f"{self.node}@")

    def wait_ready(self, timeout: float = 30.0) -> WorkerProcess:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker {self.name} exited early:\n{self.log[-4000:]}")
            return " ready." in self.log

        wait_for(ready, timeout, what=f"worker {self.name} to be ready")
        return self

    def child_pids(self) -> list[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
        ).stdout
        return [int(pid) for pid in out.split()]

    def stop(self, timeout: float = 20.0) -> int:
        """Warm shutdown (SIGTERM); SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode
