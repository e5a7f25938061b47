"""Serving /metrics: the port setting, the HTTP endpoint, and prefork workers' multiprocess mode."""

from __future__ import annotations

import socket
import uuid

import pytest
from click.testing import CliRunner

from celery_recovery import ConfigurationError, RecoverySettings
from celery_recovery.cli import recovery
from celery_recovery.telemetry import metrics
from tests.services import free_port
from tests.telemetry.scrape import scrape, value
from tests.workers import wait_for


@pytest.mark.parametrize("given, port", [(None, None), (9808, 9808), ("9808", 9808), ("", None)])
def test_metrics_port_accepts_a_port_or_nothing(given, port):
    assert RecoverySettings.from_sources({"recovery_metrics_port": given}, {}).metrics_port == port


def test_metrics_port_is_off_by_default():
    assert RecoverySettings.from_sources({}, {}).metrics_port is None


@pytest.mark.parametrize("given", [0, 65536, -1, "http", True, 80.5])
def test_bad_metrics_port_is_refused_naming_the_setting(given):
    with pytest.raises(ConfigurationError, match=r"recovery_metrics_port=.* from 1 to 65535"):
        RecoverySettings.from_sources({"recovery_metrics_port": given}, {})


def test_metrics_port_from_the_environment():
    s = RecoverySettings.from_sources({}, {"CELERY_RECOVERY_METRICS_PORT": "9900"})
    assert s.metrics_port == 9900


def test_served_page_has_every_series_from_the_start():
    port = free_port()
    metrics.serve(port, "127.0.0.1")
    try:
        samples = wait_for(lambda: scrape(port), 10, what="the metrics page")
        # Series exist before their first event, so rate() and alerts see them.
        for name, labels in (
            ("celery_recovery_sweep_actions_total", {"cause": "zombie", "action": "failed"}),
            ("celery_recovery_lock_acquisitions_total", {"outcome": "held"}),
            ("celery_recovery_callbacks_total", {"kind": "failure", "outcome": "abandoned"}),
            ("celery_recovery_store_errors_total", {"error": "unavailable"}),
        ):
            assert value(samples, name, **labels) is not None, name
        metrics.serve(port, "127.0.0.1")  # serving again in the same process is a no-op
    finally:
        metrics.stop(port)


def test_a_taken_port_is_a_clear_error():
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        with pytest.raises(metrics.MetricsServerError, match=f"{taken}.*recovery_metrics_port"):
            metrics.serve(taken, "127.0.0.1")


def test_sweep_metrics_port_without_loop_is_refused():
    result = CliRunner().invoke(
        recovery, ["--app", "tests.apps.lifecycle:app", "sweep", "--metrics-port", "9808"]
    )
    assert result.exit_code == 2 and "--metrics-port needs --loop" in result.output


def test_sweep_metrics_port_out_of_range_is_refused():
    result = CliRunner().invoke(recovery, ["sweep", "--loop", "--metrics-port", "0"])
    assert result.exit_code == 2 and "0 is not in the range 1<=x<=65535" in result.output


@pytest.mark.slow
def test_prefork_worker_serves_its_childrens_lock_metrics(
    pg_url, make_client_app, start_worker, tmp_path
):
    # The lock counters are incremented in the pool children; only multiprocess mode
    # lets the worker's main process serve them.
    port = free_port()
    directory = tmp_path / "prometheus"
    directory.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(directory), "CELERY_RECOVERY_METRICS_PORT": str(port)}
    start_worker(store_url=pg_url, concurrency=2, env=env)
    app = make_client_app(pg_url)
    order, ledger = f"m-{uuid.uuid4().hex[:8]}", str(tmp_path / "ledger")

    first = app.send_task("lifecycle.charge", (ledger, order, 0.1)).get(timeout=30)
    again = app.send_task("lifecycle.charge", (ledger, order, 0.1)).get(timeout=30)
    assert first == again

    samples = wait_for(lambda: scrape(port), 10, what="the worker's metrics page")
    acquisitions = {
        outcome: value(samples, "celery_recovery_lock_acquisitions_total", outcome=outcome)
        for outcome in ("acquired", "done", "held", "error")
    }
    assert acquisitions == {"acquired": 1, "done": 1, "held": 0, "error": 0}
