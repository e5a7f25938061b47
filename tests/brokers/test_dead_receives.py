"""How long the sweep holds back a dead worker's tries on SQS (pure logic; the real
workers are in test_sqs.py)."""

from __future__ import annotations

from celery import Celery

from celery_recovery.messages.dead_receives import MARGIN, open_receive_wait, republish_delay


def app_on(broker: str, **transport_options) -> Celery:
    app = Celery("dead_receives", broker=broker, set_as_current=False)
    app.conf.broker_transport_options = transport_options
    return app


def test_only_an_sqs_receive_outlives_its_worker():
    assert open_receive_wait(app_on("sqs://k:s@127.0.0.1:9")) == 10.0  # kombu's default
    assert open_receive_wait(app_on("sqs://k:s@127.0.0.1:9", wait_time_seconds=3)) == 3.0
    assert open_receive_wait(app_on("redis://127.0.0.1:6379/0")) == 0.0
    assert open_receive_wait(app_on("amqp://guest:guest@127.0.0.1//")) == 0.0


def test_the_delay_outlasts_a_receive_begun_at_any_moment_before_now():
    assert republish_delay(app_on("sqs://k:s@127.0.0.1:9", wait_time_seconds=3)) == 3 + MARGIN
    assert republish_delay(app_on("sqs://k:s@127.0.0.1:9", wait_time_seconds=2.5)) == 5
    # Short polling: a receive returns at once, nothing to wait for but the margin.
    assert republish_delay(app_on("sqs://k:s@127.0.0.1:9", wait_time_seconds=0)) == 0


def test_no_delay_on_a_broker_whose_dead_consumers_take_nothing():
    assert republish_delay(app_on("redis://127.0.0.1:6379/0")) == 0
    assert republish_delay(app_on("filesystem://")) == 0
