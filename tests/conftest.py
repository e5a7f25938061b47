"""Fixtures: real Redis, a fresh PostgreSQL database per session, SQLite files, real workers."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection
from sqlalchemy import create_engine, text

from celery_recovery.recovery import recovery_for_app
from celery_recovery.runtime.context import installed
from celery_recovery.store import Store
from celery_recovery.store.schema import metadata
from tests.apps.lifecycle import create_app
from tests.services import (
    BACKEND_DB,
    BROKER_DB,
    PG_ADMIN_URL,
    PGBOUNCER_OPTIONS_IGNORED,
    PGBOUNCER_STOCK,
    RABBITMQ_URL,
    REDIS_URL,
    SQS_ENVIRONMENT,
    create_pg_database,
    require,
    start_pgbouncer,
    start_sqs_server,
)
from tests.workers import ROOT, WorkerProcess

#: Short timings so that tests observe heartbeats quickly: the ``aggressive`` preset's
#: heartbeat and thresholds (four missed heartbeats), which the chaos run holds to under load.
FAST_SETTINGS = {
    "heartbeat_interval": 0.5,
    "zombie_threshold": 2.0,
    "health_check_threshold": 2.0,
    "sweep_interval": 1.0,
    "adoption_timeout": 10.0,
}


#: How much of each worker or beat log a failed test shows (the end, where it stopped).
LOG_TAIL = 6000


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """A failed test shows the end of every log its workers and beats wrote.

    They run as subprocesses and log to files under the test's ``tmp_path``,
    which a CI run does not keep: without this a flaky failure there says only
    what the test itself saw.
    """
    report = yield
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.when == "call" and report.failed and isinstance(tmp_path, Path):
        for log in sorted(tmp_path.glob("*.log")):
            lines = _collapsed(log.read_text(errors="replace").splitlines())
            notable = [line for line in lines if NOTABLE_LOG_LINE.search(line)]
            if notable:
                text = "\n".join(notable[-NOTABLE_LINES:])
                report.sections.append((f"{log.name}: its warnings and errors", text))
            tail = "\n".join(lines)[-LOG_TAIL:]
            report.sections.append((f"{log.name}: its last {LOG_TAIL} characters", tail))
    return report


#: Log lines a failure's report shows whatever their place in the log.
NOTABLE_LOG_LINE = re.compile(r"WARNING|ERROR|CRITICAL|Traceback")
NOTABLE_LINES = 150
#: A Celery log line's timestamp, which repeated lines differ by.
_LOG_STAMP = re.compile(r"^\[[0-9-]+ [0-9:,]+: ")


def _collapsed(lines: list[str]) -> list[str]:
    """The log with lines that repeat one of the few before it, apart from their
    timestamp, counted instead of shown (an unlock task retrying every second, its
    "received" and "retry" lines alternating, fills the tail otherwise)."""
    out: list[str] = []
    recent: deque[str] = deque(maxlen=4)
    repeats = 0
    for line in lines:
        message = _LOG_STAMP.sub("", line)
        if message in recent:
            repeats += 1
            continue
        if repeats:
            out.append(f"    ... and {repeats} more lines like the ones above")
            repeats = 0
        out.append(line)
        recent.append(message)
    if repeats:
        out.append(f"    ... and {repeats} more lines like the ones above")
    return out


@pytest.fixture(scope="session", autouse=True)
def _clean_environment() -> Iterator[None]:
    """Settings from the developer's shell must not leak into the tests."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("CELERY_RECOVERY_")}
    yield
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _no_installation_outlives_its_test() -> Iterator[None]:
    """Close what a test installed and left open.

    Publish signals do not say which app sent them, so with one installation in
    the process every publish is taken for it: one left over from an earlier test
    would stamp a later test's plain publishes.
    """
    before = set(map(id, installed()))
    yield
    for context in installed():
        if id(context) not in before and (left := recovery_for_app(context.app)) is not None:
            left.close()


@pytest.fixture(scope="session")
def redis_service() -> str:
    require("Redis", REDIS_URL, 6379)
    import redis

    for db in (BROKER_DB, BACKEND_DB):  # the tests' broker and result backend: start from nothing
        redis.Redis.from_url(f"{REDIS_URL}/{db}").flushdb()
    return REDIS_URL


@pytest.fixture(scope="session")
def pg_database_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, migrated to head."""
    require("PostgreSQL", PG_ADMIN_URL, 5432)
    url, drop = create_pg_database("celery_recovery_test")
    yield url
    drop()


@pytest.fixture
def pg_url(pg_database_url: str) -> str:
    """The session's PostgreSQL store, emptied for this test."""
    engine = create_engine(pg_database_url)
    with engine.begin() as conn:
        names = ", ".join(table.name for table in metadata.sorted_tables)
        conn.execute(text(f"TRUNCATE {names}"))
    engine.dispose()
    return pg_database_url


def _pgbouncer(ignore_startup_parameters: str) -> Iterator[int]:
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="celery-recovery-pgbouncer-")
    port, stop = start_pgbouncer(folder, ignore_startup_parameters)
    yield port
    stop()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def pgbouncer_port() -> Iterator[int]:
    """PgBouncer in transaction mode with the configuration most guides give, for the
    session, in front of the tests' PostgreSQL."""
    require("PostgreSQL", PG_ADMIN_URL, 5432)
    yield from _pgbouncer(PGBOUNCER_STOCK)


@pytest.fixture(scope="session")
def pgbouncer_lenient_port() -> Iterator[int]:
    """The same, with ``options`` accepted and dropped."""
    require("PostgreSQL", PG_ADMIN_URL, 5432)
    yield from _pgbouncer(PGBOUNCER_OPTIONS_IGNORED)


def through_port(url: str, port: int) -> str:
    """``url`` with its port replaced: the same database through a pooler."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(port=port).render_as_string(hide_password=False)


@pytest.fixture
def pgbouncer_url(pg_url: str, pgbouncer_port: int) -> str:
    """The session's PostgreSQL store, emptied for this test, through PgBouncer."""
    return through_port(pg_url, pgbouncer_port)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'recovery.sqlite3'}"


#: ``RECOVERY_TEST_ONE_STORE=sqlite`` (or ``postgresql``): a test that runs on both
#: stores with otherwise the same parameters runs on that one only.  The older Celery
#: versions' compatibility cores use it (.ci/run): the store does not depend on Celery's
#: version, and the newest runs everything on both.
ONE_STORE = os.environ.get("RECOVERY_TEST_ONE_STORE")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not ONE_STORE:
        return
    if ONE_STORE not in ("sqlite", "postgresql"):
        raise pytest.UsageError(
            f"RECOVERY_TEST_ONE_STORE={ONE_STORE!r}: allowed are 'sqlite' and 'postgresql'"
        )

    def variant(item: pytest.Item) -> tuple[str, tuple[tuple[str, str], ...]] | None:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "store_url" not in callspec.params:
            return None
        others = tuple(sorted((k, repr(v)) for k, v in callspec.params.items() if k != "store_url"))
        return item.nodeid.split("[")[0], others

    kept = {variant(item) for item in items if _store_of(item) == ONE_STORE}
    selected, deselected = [], []
    for item in items:
        twin_kept = _store_of(item) not in (None, ONE_STORE) and variant(item) in kept
        (deselected if twin_kept else selected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


def _store_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else callspec.params.get("store_url")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str:
    """Each store test runs on the embedded SQLite default and on PostgreSQL; a test may
    also ask for ``pgbouncer`` (PostgreSQL through PgBouncer in transaction mode)."""
    fixture = {"sqlite": "sqlite_url", "postgresql": "pg_url", "pgbouncer": "pgbouncer_url"}
    return request.getfixturevalue(fixture[request.param])


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    store = Store(store_url)
    store.ensure_ready()
    yield store
    store.dispose()


@pytest.fixture(scope="session")
def sqs_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's SQS server on 127.0.0.1, for the session: its ``sqs://`` broker URL.

    The AWS credentials it accepts (any) are set in this process's environment, which
    the workers inherit."""
    saved = {key: os.environ.get(key) for key in SQS_ENVIRONMENT}
    os.environ.update(SQS_ENVIRONMENT)
    url, stop = start_sqs_server(str(tmp_path_factory.mktemp("sqs") / "moto.log"))
    yield url
    stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def queue() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def broker() -> str:
    """The broker the test's app and workers use; tests parametrize it to run on both."""
    return "redis"


@pytest.fixture
def result_backend() -> str:
    """The result backend of the test's app and workers: ``redis`` (every test's unless it
    parametrizes this), ``rpc`` (replies to the caller's queue), ``database``
    (SQLAlchemy's, on PostgreSQL) or ``none`` (``result_backend`` unset)."""
    return "redis"


@pytest.fixture(scope="session")
def pg_results_url() -> Iterator[str]:
    """A PostgreSQL database of its own for Celery's database result backend."""
    require("PostgreSQL", PG_ADMIN_URL, 5432)
    url, drop = create_pg_database("celery_results_test")
    yield "db+" + url
    drop()


@pytest.fixture
def broker_urls(
    broker: str, queue: str, result_backend: str, request: pytest.FixtureRequest
) -> Iterator[tuple[str, str]]:
    """(broker, result backend): Redis for both, or RabbitMQ, SQS (moto's server) or the
    filesystem transport with a Redis result backend; ``result_backend`` picks another."""
    import redis

    redis_service = request.getfixturevalue("redis_service")
    backend = f"{redis_service}/{BACKEND_DB}"
    # Tests reuse task ids such as "t1": a result one test stored (the sweep stores the
    # failures it decides) must not answer another test's probe of the backend.
    redis.Redis.from_url(backend).flushdb()
    if result_backend == "rpc":
        backend = "rpc://"
    elif result_backend == "none":
        backend = ""
    elif result_backend == "database":
        backend = request.getfixturevalue("pg_results_url")
    else:
        assert result_backend == "redis", result_backend
    if broker == "redis":
        yield f"{redis_service}/{BROKER_DB}", backend
        return
    if broker == "sqs":
        yield request.getfixturevalue("sqs_service"), backend
        return
    if broker == "filesystem":
        # The demo's broker: files in a folder of the test's own (see tests/apps/lifecycle).
        folder = request.getfixturevalue("tmp_path") / "broker"
        for sub in ("data", "control"):
            (folder / sub).mkdir(parents=True)
        yield f"filesystem://{folder}", backend
        return
    assert broker == "rabbitmq", broker
    require("RabbitMQ", RABBITMQ_URL, 5672)
    yield RABBITMQ_URL, backend
    # Celery declares the test's queue durable: do not leave it behind on the server.
    with Connection(RABBITMQ_URL) as conn:
        conn.default_channel.queue_delete(queue)


@pytest.fixture
def make_client_app(broker_urls: tuple[str, str], queue: str) -> Iterator[Callable[..., Any]]:
    """Build a publishing app in the test process (with or without celery-recovery)."""
    apps = []

    def make(store_url: str | None, **overrides: Any) -> Any:
        recovery = (
            None
            if store_url is None
            else {"database_url": store_url, **lock_settings(broker_urls), **FAST_SETTINGS}
            | overrides
        )
        app = create_app(*broker_urls, queue, recovery)
        apps.append(app)
        return app

    yield make
    for app in apps:
        installed = recovery_for_app(app)
        if installed is not None:
            installed.close()
        forget_result_subscriptions(app)
        app.close()


def forget_result_subscriptions(app: Any) -> None:
    """Drop the app's result subscriptions before the test's Redis may go away.

    An ``AsyncResult`` the test left behind unsubscribes when the garbage
    collector takes it, in whichever later test that happens; against a Redis
    that test stopped (``tests/faults``), Celery retries the reconnection 20
    times a second apart, and the later test times out.
    """
    backend = getattr(app._local, "backend", None)
    consumer = getattr(backend, "result_consumer", None)
    if consumer is None or not hasattr(consumer, "subscribed_to"):
        return
    consumer.subscribed_to.clear()
    getattr(consumer, "_pending_unsubscribe", set()).clear()
    pubsub, consumer._pubsub = getattr(consumer, "_pubsub", None), None
    if pubsub is not None:
        with contextlib.suppress(Exception):
            pubsub.close()


@pytest.fixture
def client_app(make_client_app: Callable[..., Any], store_url: str) -> Any:
    return make_client_app(store_url)


def app_env(
    store_url: str | None, broker_urls: tuple[str, str], queue: str, plain: bool = False
) -> dict[str, str]:
    """Environment of a subprocess running tests.apps.lifecycle with the fast settings."""
    return {
        "RECOVERY_TEST_BROKER": broker_urls[0],
        "RECOVERY_TEST_BACKEND": broker_urls[1],
        "RECOVERY_TEST_QUEUE": queue,
        "RECOVERY_TEST_PLAIN": "1" if plain else "0",
        **{f"CELERY_RECOVERY_{k.upper()}": str(v) for k, v in FAST_SETTINGS.items()},
        **({"CELERY_RECOVERY_DATABASE_URL": store_url} if store_url else {}),
        **{f"CELERY_RECOVERY_{k.upper()}": v for k, v in lock_settings(broker_urls).items()},
    }


def lock_settings(broker_urls: tuple[str, str]) -> dict[str, str]:
    """Idempotency locks default to a Redis broker; with another they use the Redis database
    of the tests' result backend (whatever backend the test's app has)."""
    return {} if broker_urls[0].startswith("redis") else {"redis_url": f"{REDIS_URL}/{BACKEND_DB}"}


@pytest.fixture
def start_beat(
    store_url: str, broker_urls: tuple[str, str], queue: str, tmp_path: Path
) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start ``celery beat`` subprocesses (sweep scheduled or not); killed at teardown."""
    procs: list[subprocess.Popen] = []

    def start(schedule_sweep: bool = True) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(ROOT), **app_env(store_url, broker_urls, queue)}
        if schedule_sweep:
            env["RECOVERY_TEST_BEAT_INTERVAL"] = str(FAST_SETTINGS["sweep_interval"])
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.apps.lifecycle",
            "beat",
            "-l",
            "INFO",
            "-s",
            str(tmp_path / f"beat-schedule-{len(procs)}"),
        ]
        with open(tmp_path / "beat.log", "ab") as log:
            proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture
def start_worker(
    tmp_path: Path, broker_urls: tuple[str, str], queue: str, request: pytest.FixtureRequest
) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real ``celery worker`` subprocesses; every one is SIGKILLed at teardown."""
    workers: list[WorkerProcess] = []

    def start(
        store_url: str | None = None,
        pool: str = "prefork",
        concurrency: int = 2,
        name: str | None = None,
        plain: bool = False,
        env: dict[str, str] | None = None,
        prefix: tuple[str, ...] = (),
    ) -> WorkerProcess:
        if store_url is None and not plain:
            store_url = request.getfixturevalue("store_url")
        name = name or f"w{len(workers) + 1}"
        worker_env = {**app_env(store_url, broker_urls, queue, plain), **(env or {})}
        worker = WorkerProcess(
            "tests.apps.lifecycle",
            worker_env,
            tmp_path / f"{name}.log",
            pool=pool,
            concurrency=concurrency,
            name=name,
            queue=queue,
            prefix=prefix,
        )
        workers.append(worker)
        return worker.wait_ready()

    yield start
    for worker in workers:
        worker.kill()


@pytest.fixture
def dead_pid() -> tuple[int, str]:
    """The pid and process marker of a process that has exited."""
    from celery_recovery.liveness.process import process_marker

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    marker = process_marker(child.pid)
    child.kill()
    child.wait()
    assert marker is not None
    return child.pid, marker
