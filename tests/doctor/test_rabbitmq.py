"""A RabbitMQ broker, read on the real server: durable queues, persistent messages,
and the consumer timeout against the longest hold."""

from __future__ import annotations

import pytest
from kombu import Queue

from celery_recovery.doctor import ExitStatus
from celery_recovery.doctor.management import MANAGEMENT_PORT, ServerQueue, server_queue
from tests.doctor.helpers import finding, ids, make_app, run
from tests.services import RABBITMQ_URL, answering, require

#: A backend the doctor does not read, so that the broker's findings stand alone.
BACKEND = "db+sqlite:///doctor-results.sqlite3"


@pytest.fixture
def rabbitmq() -> str:
    require("RabbitMQ", RABBITMQ_URL, 5672)
    return RABBITMQ_URL


def test_transient_queue_and_messages_and_a_short_consumer_timeout(rabbitmq, sqlite_url):
    app = make_app(
        rabbitmq,
        BACKEND,
        sqlite_url,
        task_queues=[
            Queue("doctor-reports", durable=False, queue_arguments={"x-consumer-timeout": 60000})
        ],
        task_default_queue="doctor-reports",
        task_default_delivery_mode="transient",
    )

    @app.task(shared=False, name="shop.report", acks_late=True, time_limit=600)
    def report_task():
        return None

    report = run(app)
    assert ids(report) == [
        "rabbitmq-consumer-timeout",
        "rabbitmq-queue-not-durable",
        "rabbitmq-transient-messages",
    ]
    # It asked the server itself, and its management API when that answers.
    assert any(line.startswith("rabbitmq broker amqp://guest:***@") for line in report.read)
    if answering(f"http://127.0.0.1:{MANAGEMENT_PORT}", MANAGEMENT_PORT):
        assert any("queue doctor-reports (on the server)" in line for line in report.read)
    else:
        assert any(
            line.startswith(
                f"rabbitmq management API: http://127.0.0.1:{MANAGEMENT_PORT}/api did not answer"
            )
            for line in report.read
        )
    timeout = finding(report, "rabbitmq-consumer-timeout")
    assert timeout.subject == "queue doctor-reports"
    assert "time_limit=600s of the acks_late task shop.report" in timeout.problem
    assert "x-consumer-timeout of 60s" in timeout.problem
    assert "'x-consumer-timeout': 900000" in timeout.fix
    assert "durable=True" in finding(report, "rabbitmq-queue-not-durable").fix
    assert finding(report, "rabbitmq-transient-messages").fix == (
        "app.conf.task_default_delivery_mode = 'persistent'"
    )


def test_celery_defaults_pass_and_a_long_hold_without_a_known_timeout_cannot_be_told(
    rabbitmq, sqlite_url
):
    app = make_app(rabbitmq, BACKEND, sqlite_url)
    report = run(app)
    assert report.findings == [] and report.unknowns == []

    @app.task(shared=False, name="shop.archive", acks_late=True, time_limit=7200)
    def archive():
        return None

    report = run(make_app(rabbitmq, BACKEND, sqlite_url, task_acks_late=True))
    assert report.exit_status is ExitStatus.NOTHING_FOUND  # a new app: no such task

    report = run(app)
    assert report.exit_status is ExitStatus.CANNOT_TELL
    [unknown] = report.unknowns
    assert unknown.check == "rabbitmq" and unknown.subject == "queue celery"
    assert "longer than RabbitMQ's default consumer_timeout (1800s)" in unknown.reason
    assert "x-consumer-timeout" in unknown.fix


def test_a_rabbitmq_that_does_not_answer_cannot_be_told(closed_port, sqlite_url):
    report = run(make_app(f"amqp://guest:guest@127.0.0.1:{closed_port}//", BACKEND, sqlite_url))
    assert report.exit_status is ExitStatus.CANNOT_TELL
    [unknown] = report.unknowns
    assert unknown.check == "rabbitmq" and "did not answer" in unknown.reason


def test_the_management_apis_view_of_a_queue():
    """The API's JSON, as ``GET /api/queues/VHOST/NAME`` returns it (RabbitMQ 3.12+)."""
    assert server_queue(
        {"durable": False, "auto_delete": False, "arguments": {"x-consumer-timeout": 90000}}
    ) == ServerQueue(False, False, 90.0, "x-consumer-timeout")
    by_policy = server_queue(
        {
            "durable": True,
            "auto_delete": True,
            "arguments": {},
            "policy": "long-tasks",
            "effective_policy_definition": {"consumer-timeout": 3600000},
        }
    )
    assert by_policy == ServerQueue(True, True, 3600.0, "policy long-tasks consumer-timeout")
    assert server_queue({"durable": True, "arguments": {}}).consumer_timeout is None
