"""Private Redis and PostgreSQL servers that fault tests may restart and kill.

The shared services on the default ports belong to everybody's tests; faults
are only ever injected into these, each on a free port of its own.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from tests.services import free_port
from tests.workers import wait_for

PG_BIN = Path(os.environ.get("RECOVERY_TEST_PG_BIN", "/usr/local/bin"))


def _answering(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class PrivateRedis:
    """A ``redis-server`` child on a free port; ``restart()`` keeps the port.

    With ``persistent`` it writes an fsynced append-only file, as a production
    Redis holding locks must (docs/failure-modes.md); without, a restart
    forgets every queued message, result and lock.
    """

    def __init__(
        self, directory: Path, persistent: bool = False, options: tuple[str, ...] = ()
    ) -> None:
        self.directory = directory
        self.persistent = persistent
        #: More redis-server options, e.g. ("--maxmemory-policy", "allkeys-lru").
        self.options = options
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> PrivateRedis:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.persistent
            else ["--appendonly", "no"]
        )
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", *persistence, "--dir", str(self.directory), *self.options]
        with open(self.directory / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: _answering(self.port), 10, what=f"redis-server on {self.port}")
        return self

    def stop(self) -> None:
        """SIGKILL: nothing is saved on the way down (the AOF is already fsynced)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> float:
        """Kill and start again; the seconds it was unreachable."""
        began = time.monotonic()
        self.stop()
        self.start()
        return time.monotonic() - began


def _as_postgres(*command: str) -> subprocess.CompletedProcess:
    # initdb and postgres refuse to run as root.
    prefix = [] if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--"]
    return subprocess.run([*prefix, *command], capture_output=True, text=True, check=True)


class PrivatePostgres:
    """A throw-away PostgreSQL cluster on a free port (initdb once per session)."""

    def __init__(self) -> None:
        # Not under pytest's tmp tree: that is private to root, and the socket path is short.
        self.directory = Path(tempfile.mkdtemp(prefix="recovery-pg-"))
        self.data = self.directory / "data"
        self.port = free_port()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> PrivatePostgres:
        if os.geteuid() == 0:
            # The cluster's own user must own its directory (a fresh one under /tmp).
            owner = pwd.getpwnam("postgres")
            shutil.chown(self.directory, owner.pw_uid, owner.pw_gid)
        _as_postgres(str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")
        self._ctl("start", "-w")
        return self

    def _ctl(self, action: str, *options: str) -> None:
        _as_postgres(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off",
            "-l",
            str(self.directory / "postgres.log"),
            action,
            *options,
        )

    def restart(self, mode: str) -> float:
        """``pg_ctl restart -m fast|immediate``; the seconds it took."""
        began = time.monotonic()
        self._ctl("restart", "-w", "-m", mode)
        return time.monotonic() - began

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._ctl("stop", "-m", "immediate")
        shutil.rmtree(self.directory, ignore_errors=True)

    def terminate_backends(self, database: str) -> int:
        """``pg_terminate_backend`` every other connection to ``database``; how many."""
        engine = create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                return len(
                    conn.execute(
                        text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = :db AND pid <> pg_backend_pid()"
                        ),
                        {"db": database},
                    ).all()
                )
        finally:
            engine.dispose()
