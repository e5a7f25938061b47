"""Serving ``/metrics`` over HTTP, and prometheus-client's multiprocess mode for prefork.

A sweep loop or a triggerer is one process: it serves its own metrics on
``recovery_metrics_port``.  A prefork worker runs tasks (and beat's sweep
task) in pool children whose counters its main process cannot see, unless
every process writes them to files in ``PROMETHEUS_MULTIPROC_DIR`` (set in
the worker's environment before it starts, emptied at each start); the
main process then serves the sum.  Nothing listens unless a port is set.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from celery_recovery.core.errors import RecoveryError

if TYPE_CHECKING:
    from celery_recovery.core.settings import RecoverySettings

logger = logging.getLogger("celery_recovery.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Address the metrics server binds: every interface, as scrapers run elsewhere.
DEFAULT_ADDR = "0.0.0.0"

_servers: dict[int, tuple[Any, threading.Thread]] = {}
_servers_lock = threading.Lock()


class MetricsServerError(RecoveryError):
    """The metrics port could not be served (in use, not allowed)."""


def multiprocess_dir() -> str | None:
    """The multiprocess directory, when prometheus-client runs in multiprocess mode."""
    return os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower()) or None


def serve(port: int, addr: str = DEFAULT_ADDR) -> None:
    """Serve ``/metrics`` on ``port`` from a daemon thread (once per port and process).

    In multiprocess mode the page aggregates every process's files.  Raises
    :class:`MetricsServerError` when the port cannot be bound.
    """
    from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

    with _servers_lock:
        if port in _servers:
            return
        registry = REGISTRY
        if multiprocess_dir():
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        try:
            _servers[port] = start_http_server(port, addr, registry=registry)
        except OSError as exc:
            raise MetricsServerError(
                f"cannot serve metrics on {addr}:{port} (recovery_metrics_port): {exc}"
            ) from None
    mode = f"multiprocess, {multiprocess_dir()}" if multiprocess_dir() else "this process"
    logger.info("celery-recovery: serving metrics on http://%s:%d/metrics (%s)", addr, port, mode)


def stop(port: int) -> None:
    """Stop serving ``port`` (tests, and processes that end their work)."""
    with _servers_lock:
        found = _servers.pop(port, None)
    if found is not None:
        server, thread = found
        server.shutdown()
        server.server_close()
        thread.join(5)


def serve_for_worker(settings: RecoverySettings, tasks_in_children: bool) -> None:
    """From a worker's main process: serve when a port is set and the metrics are visible.

    A prefork pool's children hold the counters; without multiprocess mode
    the main process would serve a page of zeros, so it says why and serves
    nothing.  Never raises: a taken port must not stop the worker.
    """
    port = settings.metrics_port
    if port is None:
        return
    if tasks_in_children and not multiprocess_dir():
        logger.warning(
            "celery-recovery: recovery_metrics_port=%d is set but this prefork worker's "
            "children cannot share their metrics: set %s to an empty directory in the "
            "worker's environment to serve them; not serving",
            port,
            MULTIPROC_ENV,
        )
        return
    try:
        serve(port)
    except MetricsServerError as exc:
        logger.warning("celery-recovery: %s; the worker runs on without serving metrics", exc)


def mark_process_dead(pid: int | None = None) -> None:
    """Tell multiprocess mode that ``pid`` (default: this process) has exited.

    Its ``live*`` gauges (triggers running) stop counting; its counters stay,
    as they should.  A no-op outside multiprocess mode; never raises.
    """
    if not multiprocess_dir():
        return
    try:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())
    except Exception as exc:  # a metrics file problem must not disturb a shutdown
        logger.debug("celery-recovery: could not mark process %s dead for metrics: %s", pid, exc)
