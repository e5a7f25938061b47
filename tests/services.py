"""Where the test services are, and what to do when one is missing.

Locally a missing service skips its tests with the reason; in CI
(``CI=true``) it fails them, so a broken CI machine cannot pass by skipping.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

REDIS_URL = os.environ.get("RECOVERY_TEST_REDIS", "redis://127.0.0.1:6379")
#: The tests' broker database; the result backend uses the next one.  Two test
#: sessions on one Redis need different numbers (each flushes its own at start).
BROKER_DB = int(os.environ.get("RECOVERY_TEST_REDIS_DB", "9"))
BACKEND_DB = BROKER_DB + 1
RABBITMQ_URL = os.environ.get("RECOVERY_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")
PG_ADMIN_URL = os.environ.get(
    "RECOVERY_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
#: Credentials for the local SQS server (moto accepts any): set for the test process and
#: its workers, so that boto3 looks for no real ones (nothing leaves the machine).
SQS_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def answering(url: str, default_port: int) -> bool:
    parsed = urlparse(url.replace("+psycopg", ""))
    try:
        with socket.create_connection((parsed.hostname, parsed.port or default_port), timeout=1):
            return True
    except OSError:
        return False


def require(name: str, url: str, default_port: int) -> None:
    if answering(url, default_port):
        return
    message = f"{name} is not answering at {url}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: service tests must not be skipped)", pytrace=False)
    pytest.skip(f"{message}; start it to run this test")


def create_pg_database(
    prefix: str, revision: str | None = "head"
) -> tuple[str, Callable[[], None]]:
    """A new PostgreSQL database migrated to ``revision`` (None: left empty, for another
    schema than the store's): its URL, and a function that drops it."""
    from sqlalchemy import create_engine, text

    from celery_recovery.store.engine import create_store_engine
    from celery_recovery.store.migrate import upgrade

    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    if revision is not None:
        engine = create_store_engine(url, for_migrations=True)
        upgrade(engine, revision)
        engine.dispose()

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return url, drop


def free_port() -> int:
    """A TCP port nothing listens on at 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_until_answering(
    command: list[str], port: int, name: str, timeout: float, why: Callable[[], str], **popen: Any
) -> Callable[[], None]:
    """Start ``command`` in a session of its own and wait until 127.0.0.1:``port`` answers;
    a function that stops it.  Fails the test, with ``why()``, if it exits or is too slow."""
    proc = subprocess.Popen(command, start_new_session=True, **popen)

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    deadline = time.monotonic() + timeout
    while not answering(f"tcp://127.0.0.1:{port}", port):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop()
            pytest.fail(f"{name} did not start on port {port}{why()}")
        time.sleep(0.05)
    return stop


def start_sqs_server(log_path: str) -> tuple[str, Callable[[], None]]:
    """Start moto's SQS server on 127.0.0.1 on a free port: the ``sqs://`` broker URL, and
    a function that stops it.

    Locally a missing ``moto[server]`` skips the SQS tests; in CI it fails them.
    """
    try:
        import moto.server  # noqa: F401
    except ImportError:
        message = "moto[server] is not installed (pip install -e '.[dev]')"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    port = free_port()
    with open(log_path, "ab") as log:
        stop = serve_until_answering(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            port,
            "moto's SQS server",
            30,
            lambda: f" (see {log_path})",
            env={**os.environ, **SQS_ENVIRONMENT},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    user, password = SQS_ENVIRONMENT["AWS_ACCESS_KEY_ID"], SQS_ENVIRONMENT["AWS_SECRET_ACCESS_KEY"]
    return f"sqs://{user}:{password}@127.0.0.1:{port}", stop


#: PgBouncer as most guides configure it: transaction pooling, and only the startup
#: parameter that JDBC drivers send ignored (it refuses ``options``).
PGBOUNCER_STOCK = "extra_float_digits"
#: The workaround a user of an older celery-recovery found: ``options`` accepted and
#: dropped (the timeouts it carried are then silently lost).
PGBOUNCER_OPTIONS_IGNORED = "extra_float_digits,options"


def start_pgbouncer(folder: str, ignore_startup_parameters: str) -> tuple[int, Callable[[], None]]:
    """Debian's PgBouncer in transaction mode on 127.0.0.1 on a free port, in front of the
    tests' PostgreSQL: its port, and a function that stops it.

    Locally a missing ``pgbouncer`` skips the pooler's tests; in CI (``.ci/run`` installs
    it) it fails them."""
    import shutil

    binary = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )
    if binary is None:
        message = "pgbouncer is not installed (apt-get install pgbouncer; .ci/run does)"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    pg = urlparse(PG_ADMIN_URL.replace("+psycopg", ""))
    port = free_port()
    os.makedirs(folder, exist_ok=True)
    config = os.path.join(folder, "pgbouncer.ini")
    with open(os.path.join(folder, "users.txt"), "w") as users:
        users.write(f'"{pg.username}" ""\n')
    with open(config, "w") as ini:
        ini.write(
            f"[databases]\n* = host={pg.hostname} port={pg.port or 5432}\n\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {folder}/users.txt\n"
            "pool_mode = transaction\n"
            f"ignore_startup_parameters = {ignore_startup_parameters}\n"
            "max_client_conn = 1000\ndefault_pool_size = 40\n"
            f"logfile = {folder}/pgbouncer.log\n"
        )
    os.chmod(folder, 0o777)
    for name in os.listdir(folder):
        os.chmod(os.path.join(folder, name), 0o666)
    # PgBouncer refuses to run as root: as root (CI), it runs as PostgreSQL's own user.
    command = [binary, *(["-u", "postgres"] if os.geteuid() == 0 else []), config]

    def why() -> str:
        log = os.path.join(folder, "pgbouncer.log")
        return ":\n" + (Path(log).read_text()[-2000:] if os.path.exists(log) else "")

    stop = serve_until_answering(
        command, port, "PgBouncer", 20, why, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    return port, stop


def start_own_postgres() -> tuple[str, Callable[[], None], Callable[[], None]]:
    """A PostgreSQL server of the test's own (Debian's binaries, a new cluster on a free
    port), migrated for the store: its URL, a function that restarts it (what a restart
    or a failover does to every session) and one that stops it.  The tests' shared
    server is never restarted: other tests use it at the same time."""
    import glob
    import shutil

    binaries = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[4]))
    if not binaries:
        message = "PostgreSQL's server binaries are not installed (/usr/lib/postgresql/*/bin)"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    bindir = binaries[-1]
    # Not under pytest's tmp_path: its folders are private to root, and the server runs
    # as its own user.
    folder = Path(tempfile.mkdtemp(prefix="recovery-pg-"))
    os.chmod(folder, 0o777)
    data, log = folder / "data", folder / "server.log"
    # The server refuses to run as root: as root (CI), it runs as its own user.
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    subprocess.run(
        [*as_postgres, f"{bindir}/initdb", "-D", str(data), "-A", "trust", "-U", "postgres"],
        check=True,
        capture_output=True,
    )
    port = free_port()
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"

    def pg_ctl(*args: str) -> None:
        done = subprocess.run(
            [*as_postgres, f"{bindir}/pg_ctl", "-D", str(data), "-l", str(log), "-w", *args]
            + (["-o", options] if args[0] != "stop" else []),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise AssertionError(f"pg_ctl {' '.join(args)} failed: {done.stderr}\n{tail}")

    pg_ctl("start")
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    from celery_recovery.store.engine import create_store_engine
    from celery_recovery.store.migrate import upgrade

    engine = create_store_engine(url, for_migrations=True)
    upgrade(engine, "head")
    engine.dispose()

    def stop() -> None:
        pg_ctl("stop", "-m", "immediate")
        shutil.rmtree(folder, ignore_errors=True)

    return url, lambda: pg_ctl("restart", "-m", "fast"), stop
