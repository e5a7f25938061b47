"""A worker whose broker connection goes through a proxy the test can freeze, and its probe."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
from click.testing import Result
from sqlalchemy import select

from celery_recovery.core.presets import PRESETS
from celery_recovery.store import Store
from celery_recovery.store.schema import audit_log
from tests.cli.helpers import run
from tests.proxy import TcpProxy
from tests.workers import WorkerProcess, wait_for

#: The aggressive preset's stall timeout, and the bound the issue promises with it.
STALL_TIMEOUT = PRESETS["aggressive"]["stalled_consumer_timeout"]
DETECTION_BOUND = 15.0


def node_of(worker: WorkerProcess) -> str:
    """The Celery node name the worker's jobs record (``name@host``)."""
    return f"{worker.node}@{socket.gethostname()}"


def probe(store_url: str, worker: WorkerProcess) -> Result:
    """``celery-recovery jobs check --job-type worker --hostname <node>``."""
    return run(store_url, "jobs", "check", "--job-type", "worker", "--hostname", node_of(worker))


def wait_stalled(store_url: str, worker: WorkerProcess, since: float) -> tuple[Result, float]:
    """Poll the probe until it fails; its result and the seconds from ``since`` (monotonic)."""

    def failed() -> Result | None:
        result = probe(store_url, worker)
        return result if result.exit_code == 1 else None

    result = wait_for(failed, DETECTION_BOUND + 10, interval=0.25, what="the probe to fail")
    return result, time.monotonic() - since


def consumer_state(store_url: str, worker: WorkerProcess) -> dict[str, Any] | None:
    store = Store(store_url)
    try:
        found = store.jobs.consumer_jobs(node_of(worker))
    finally:
        store.dispose()
    return found[0] if found else None


def stall_audit_rows(store_url: str) -> list[dict[str, Any]]:
    store = Store(store_url)
    try:
        with store.transaction() as conn:
            query = select(audit_log).where(audit_log.c.action == "stalled")
            return [dict(r) for r in conn.execute(query).mappings()]
    finally:
        store.dispose()


@pytest.fixture
def broker_proxy(broker_urls: tuple[str, str]) -> Iterator[tuple[TcpProxy, str]]:
    """A proxy to the test's broker, and the broker URL through it."""
    url = urlparse(broker_urls[0])
    proxy = TcpProxy(url.hostname or "127.0.0.1", url.port or 6379).start()
    auth = f"{url.username or ''}:{url.password or ''}@" if url.username else ""
    yield proxy, url._replace(netloc=f"{auth}127.0.0.1:{proxy.port}").geturl()
    proxy.cut()


@pytest.fixture
def start_proxied_worker(
    start_worker: Callable[..., WorkerProcess],
    broker_proxy: tuple[TcpProxy, str],
) -> Callable[..., WorkerProcess]:
    """Start a worker that reaches its broker through the proxy (the aggressive stall timeout)."""

    def start(store_url: str, **env: str) -> WorkerProcess:
        settings = {
            "RECOVERY_TEST_BROKER": broker_proxy[1],
            "CELERY_RECOVERY_STALLED_CONSUMER_TIMEOUT": str(STALL_TIMEOUT),
            **env,
        }
        return start_worker(store_url, env=settings)

    return start
