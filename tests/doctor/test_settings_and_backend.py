"""Thresholds that misjudge a pause, a missing result backend, an in-memory broker,
and a check that fails."""

from __future__ import annotations

import logging

import pytest

from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.settings import RecoverySettings, relation_problems
from celery_recovery.doctor import ExitStatus, Report, Severity, at_start, diagnose, registry
from tests.doctor.helpers import finding, ids, make_app, run

BACKEND = "db+sqlite:///doctor-results.sqlite3"


def plain_app(sqlite_url, backend=BACKEND, broker="memory://", **conf):
    return make_app(broker, backend, sqlite_url, **conf)


def refused(report):
    return sorted((f.subject, f.problem) for f in report.findings if f.id == "settings-refused")


def test_every_refused_threshold_is_named_at_once(sqlite_url):
    app = plain_app(
        sqlite_url,
        recovery_heartbeat_interval=5,
        recovery_zombie_threshold=10,
        recovery_health_check_threshold=12,
        recovery_sweep_interval=11,
    )
    found = refused(run(app))
    assert [subject for subject, _ in found] == [
        "recovery_health_check_threshold",
        "recovery_sweep_interval",
        "recovery_zombie_threshold",
    ]
    assert "recovery_zombie_threshold=10s is shorter than 3 heartbeat intervals" in found[2][1]
    zombie = next(f for f in run(app).findings if f.subject == "recovery_zombie_threshold")
    assert zombie.fix.startswith("app.conf.recovery_zombie_threshold = 30 (at least 3 x")
    sweep = next(f for f in run(app).findings if f.subject == "recovery_sweep_interval")
    assert sweep.fix == "app.conf.recovery_sweep_interval = 10 (or less)"

    # The worker refuses the same settings with the first of these messages.
    with pytest.raises(ConfigurationError) as refusal:
        RecoverySettings.from_app(app)
    values = {"heartbeat_interval": 5, "zombie_threshold": 10}
    values |= {"health_check_threshold": 12, "sweep_interval": 11}
    assert str(refusal.value) == relation_problems(values)[0][1]


def test_a_value_that_cannot_be_read_is_named(sqlite_url):
    report = run(plain_app(sqlite_url, recovery_zombie_treshold=60))
    problem = finding(report, "settings-refused").problem
    assert "unknown setting 'recovery_zombie_treshold'" in problem
    assert "did you mean 'recovery_zombie_threshold'?" in problem


def test_accepted_thresholds_shorter_than_a_pause(sqlite_url):
    report = run(plain_app(sqlite_url, recovery_preset="aggressive"))
    short = finding(report, "zombie-threshold-short")
    assert short.severity is Severity.WARNING
    assert "recovery_zombie_threshold=2s" in short.problem
    assert "recovery_preset = 'kubernetes'" in short.fix
    assert "health-check-threshold-short" in ids(report)
    assert "zombie-threshold-short" not in ids(
        run(plain_app(sqlite_url, recovery_preset="kubernetes"))
    )


@pytest.mark.parametrize("backend", [None, "disabled"])
def test_no_result_backend_is_named_with_what_recovery_cannot_do(sqlite_url, backend):
    missing = finding(run(plain_app(sqlite_url, backend=backend)), "no-result-backend")
    assert missing.severity is Severity.WARNING
    assert "cannot ask what became of a task" in missing.problem
    assert "published again as always" in missing.problem
    assert "is run again even when it had finished" in missing.problem
    assert missing.fix.startswith("app.conf.result_backend = ")
    assert "recovery_unknown_outcome = 'fail'" in missing.fix


def test_the_rpc_backend_is_named_with_its_limits(sqlite_url):
    report = run(plain_app(sqlite_url, backend="rpc://"))
    rpc = finding(report, "rpc-result-backend")
    assert rpc.severity is Severity.WARNING
    assert "only to the process that sent the task" in rpc.problem
    assert "is not adopted" in rpc.problem
    assert "Results still reach their caller after a recovery" in rpc.problem
    assert "no-result-backend" not in ids(report)


def test_ignored_results(sqlite_url):
    app = plain_app(sqlite_url)

    @app.task(shared=False, name="shop.ping", ignore_result=True)
    def ping():
        return None

    ignored = finding(run(app), "results-ignored")
    assert ignored.subject == "tasks shop.ping"
    assert finding(run(plain_app(sqlite_url, task_ignore_result=True)), "results-ignored")


def test_an_in_memory_broker(sqlite_url):
    assert finding(run(plain_app(sqlite_url)), "broker-not-persistent").severity is Severity.ERROR


def test_a_check_that_fails_cannot_tell_and_the_others_still_run(sqlite_url, monkeypatch):
    def broken(deployment, report):
        raise RuntimeError("boom")

    monkeypatch.setattr(registry, "CHECKS", (("broken", broken), *registry.CHECKS))
    report = diagnose(plain_app(sqlite_url))
    assert [(u.check, u.reason) for u in report.unknowns] == [
        ("broken", "the check failed: RuntimeError('boom')")
    ]
    assert "broker-not-persistent" in ids(report)
    assert report.exit_status is ExitStatus.FINDINGS


def test_at_start_logs_each_finding_and_never_raises(sqlite_url, monkeypatch, caplog):
    app = plain_app(sqlite_url)
    settings = RecoverySettings.from_app(app)
    caplog.set_level(logging.INFO, "celery_recovery.doctor")
    thread = at_start.start(app, settings, None)  # type: ignore[arg-type]
    assert thread is not None
    thread.join(30)
    assert at_start.start(app, settings, None) is None  # once per app and process
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith("doctor finding broker-not-persistent (error) in broker memory:")
    assert "Fix: app.conf.broker_url = " in warnings[0]

    def failing(*args, **kwargs) -> Report:
        raise RuntimeError("no")

    monkeypatch.setattr(at_start, "diagnose", failing)
    caplog.clear()
    other = plain_app(sqlite_url)
    at_start.start(other, settings, None).join(30)  # type: ignore[arg-type,union-attr]
    assert "celery-recovery doctor could not run" in caplog.text


def test_remote_control_disabled_says_what_the_second_opinion_loses(sqlite_url):
    report = run(plain_app(sqlite_url, worker_enable_remote_control=False))
    off = finding(report, "remote-control-disabled")
    assert off.severity is Severity.WARNING
    assert "cut off from the store alone" in off.problem and "run a second time" in off.problem
    assert "remote-control-disabled" not in ids(run(plain_app(sqlite_url)))
