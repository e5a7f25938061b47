"""The stall probe's question to the broker, against real Redis and RabbitMQ, and SQS
(moto's server on 127.0.0.1)."""

from __future__ import annotations

import time

import pytest
from celery import Celery

from celery_recovery.stalls.broker import ready_messages
from tests.apps.lifecycle import sqs_transport_options
from tests.services import free_port
from tests.workers import wait_for


@pytest.mark.parametrize("broker", ["redis", "rabbitmq", "sqs"])
def test_the_ready_messages_of_a_workers_queues_are_counted(broker, broker_urls, queue):
    app = Celery("probe", broker=broker_urls[0], set_as_current=False)
    app.conf.task_default_queue = queue
    if broker == "sqs":  # SQS counts ApproximateNumberOfMessages: kombu's queue size
        app.conf.broker_transport_options = sqs_transport_options()
    try:
        # A queue never declared holds nothing
        assert ready_messages(app, [queue, f"{queue}-other"], timeout=2) == 0
        # Given three messages waiting in a queue nobody consumes
        for n in range(3):
            app.send_task("lifecycle.add", (n, 1))
        # Then the probe counts them, and only them (RabbitMQ's count follows the
        # publishes within moments: its confirms are not waited for here)
        counted = []
        wait_for(
            lambda: (
                counted.append(ready_messages(app, [queue, f"{queue}-other"], 2))
                or counted[-1] >= 3
            ),
            10,
            what="the three messages to be counted",
        )
        assert counted[-1] == 3, counted
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge(queue)
        app.close()


@pytest.mark.parametrize("scheme", ["redis", "amqp"])
def test_a_broker_that_does_not_answer_fails_the_probe_within_its_timeout(scheme):
    app = Celery("probe", broker=f"{scheme}://127.0.0.1:{free_port()}//", set_as_current=False)
    began = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - each transport raises its own connection error
        ready_messages(app, ["anything"], timeout=1)
    assert time.monotonic() - began < 5
    app.close()
