"""Sentry sees zombies, lost messages and dead beats, and the sweep's cron check-ins.

The real sentry-sdk runs with a transport that keeps the envelopes it is
given instead of sending them: nothing leaves the machine.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from celery_recovery import JobState, JobType
from celery_recovery.core.timeutils import utcnow
from celery_recovery.recovery import recovery_for_app
from celery_recovery.sweeps.tasks import SWEEP_TASK
from celery_recovery.telemetry import sentry as recovery_sentry
from tests.builders import make_queued, make_zombie

sentry_sdk = pytest.importorskip("sentry_sdk")
from sentry_sdk.transport import Transport  # noqa: E402


class CapturingTransport(Transport):
    """Keeps every envelope; ``fail=True`` makes it raise like a broken network stack."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.envelopes: list[Any] = []
        self.fail = False

    def capture_envelope(self, envelope: Any) -> None:
        if self.fail:
            raise ConnectionError("sentry unreachable")
        self.envelopes.append(envelope)

    def items(self, kind: str) -> list[dict[str, Any]]:
        return [i.payload.json for e in self.envelopes for i in e.items if i.type == kind]


def capturing_sentry(**options: Any) -> Iterator[CapturingTransport]:
    """The real sentry-sdk, initialised with ``options``, sending to a CapturingTransport."""
    transport = CapturingTransport()
    sentry_sdk.init(dsn="https://key@sentry.invalid/1", transport=transport, **options)
    recovery_sentry._last_checkin.clear()
    yield transport
    sentry_sdk.get_client().close()
    sentry_sdk.get_global_scope().set_client(None)
    recovery_sentry._last_checkin.clear()


@pytest.fixture
def transport() -> Iterator[CapturingTransport]:
    yield from capturing_sentry(default_integrations=False)


@pytest.fixture
def recovery(client_app):
    return recovery_for_app(client_app)


def test_zombie_is_a_warning_event_with_task_worker_and_heartbeat_age(store, recovery, transport):
    task_id = f"z-{uuid.uuid4().hex[:8]}"
    make_zombie(store, task_id, age=60.0)

    assert recovery.sweep().republished == 1

    (event,) = transport.items("event")
    assert event["level"] == "warning"
    assert event["fingerprint"] == ["celery-recovery", "zombie", "lifecycle.add"]
    assert "lifecycle.add" in event["message"]
    details = event["contexts"]["celery_recovery"]
    assert (details["task_name"], details["task_id"], details["try_number"]) == (
        "lifecycle.add",
        task_id,
        1,
    )
    assert (details["worker_host"], details["worker_pid"], details["action"]) == (
        "gone",
        4242,
        "republished",
    )
    assert 60 <= details["heartbeat_age_seconds"] < 70
    assert event["tags"]["celery_recovery.task_id"] == task_id


def test_zombies_group_per_task_name(store, recovery, transport):
    make_zombie(store, "a1", job_id="j1", task_name="lifecycle.add")
    make_zombie(store, "a2", job_id="j2", task_name="lifecycle.add")
    make_zombie(store, "b1", job_id="j3", task_name="lifecycle.noop", args=())

    recovery.sweep()

    fingerprints = sorted(e["fingerprint"][-1] for e in transport.items("event"))
    assert fingerprints == ["lifecycle.add", "lifecycle.add", "lifecycle.noop"]


def test_lost_message_is_captured_with_its_queue_age(store, recovery, transport):
    task_id = f"lost-{uuid.uuid4().hex[:8]}"
    make_queued(store, task_id, queue="q1")
    recovery.sweep(now=utcnow() + timedelta(seconds=recovery.settings.queued_timeout + 1))

    (event,) = transport.items("event")
    assert event["fingerprint"] == ["celery-recovery", "lost_message", "lifecycle.add"]
    details = event["contexts"]["celery_recovery"]
    assert (details["task_id"], details["try_number"], details["queue"]) == (task_id, 1, "q1")
    assert details["queued_age_seconds"] > recovery.settings.queued_timeout


def test_dead_beat_is_captured(store, recovery, transport):
    past = utcnow() - timedelta(seconds=60)
    store.jobs.add_job(
        {
            "id": "beat1",
            "job_type": JobType.BEAT,
            "hostname": "scheduler-0",
            "pid": 7,
            "state": JobState.RUNNING,
            "start_date": past,
            "latest_heartbeat": past,
        }
    )
    recovery.sweep()
    (event,) = transport.items("event")
    assert event["fingerprint"] == ["celery-recovery", "dead_beat", "beat"]
    assert event["contexts"]["celery_recovery"]["worker_host"] == "scheduler-0"


def test_scheduled_sweep_checks_in_once_a_minute_and_the_fallback_never(recovery, transport):
    sweep_task = recovery.app.tasks[SWEEP_TASK]

    sweep_task()
    sweep_task()  # within CHECKIN_PERIOD: not sent again
    recovery.sweep()  # the workers' fallback path: never checks in

    (checkin,) = transport.items("check_in")
    assert checkin["monitor_slug"] == recovery_sentry.SWEEP_MONITOR == "celery-recovery-sweep"
    assert checkin["status"] == "ok"
    schedule = checkin["monitor_config"]["schedule"]
    assert (schedule["type"], schedule["value"], schedule["unit"]) == ("interval", 1, "minute")
    assert checkin["monitor_config"]["checkin_margin"] >= 1


def test_triggerer_checkin_uses_its_own_monitor(recovery, transport):
    recovery_sentry.triggerer_checkin(recovery.settings)
    (checkin,) = transport.items("check_in")
    assert checkin["monitor_slug"] == "celery-recovery-triggerer"


def test_a_failing_transport_never_breaks_the_sweep(store, recovery, transport):
    transport.fail = True
    make_zombie(store, f"z-{uuid.uuid4().hex[:8]}")
    report = recovery.app.tasks[SWEEP_TASK]()
    assert (report["zombies"], report["republished"], report["errors"]) == (1, 1, 0)


def test_without_sentry_initialised_nothing_is_captured(store, recovery):
    assert not recovery_sentry.active()
    make_zombie(store, f"z-{uuid.uuid4().hex[:8]}")
    assert recovery.sweep().republished == 1


def test_cli_sweep_checks_in(client_app, transport):
    from types import SimpleNamespace

    from click.testing import CliRunner

    from celery_recovery.cli import recovery as cli

    result = CliRunner().invoke(cli, ["sweep", "--json"], obj=SimpleNamespace(app=client_app))

    assert result.exit_code == 0, result.output
    (checkin,) = transport.items("check_in")
    assert (checkin["monitor_slug"], checkin["status"]) == ("celery-recovery-sweep", "ok")


def test_a_process_that_never_initialised_sentry_does_not_import_it():
    """Importing sentry-sdk costs up to a second (it imports gevent and eventlet when
    installed): a sweep's first action, or a triggerer's loop, would pay it for nothing."""
    import subprocess
    import sys

    probe = (
        "import sys; from celery_recovery.telemetry import sentry; "
        "print(sentry.active(), 'sentry_sdk' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
