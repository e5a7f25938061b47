"""How long the sweep holds back a dead worker's tries on SQS (pure logic; the real
workers are in test_sqs.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery import Celery

from celery_recovery.core.timeutils import utcnow
from celery_recovery.dead_receives import open_receive_wait, republish_delay


def app_on(broker: str, **transport_options) -> Celery:
    app = Celery("dead_receives", broker=broker, set_as_current=False)
    app.conf.broker_transport_options = transport_options
    return app


def test_only_an_sqs_receive_outlives_its_worker():
    assert open_receive_wait(app_on("sqs://k:s@127.0.0.1:9")) == 10.0  # kombu's default
    assert open_receive_wait(app_on("sqs://k:s@127.0.0.1:9", wait_time_seconds=3)) == 3.0
    assert open_receive_wait(app_on("redis://127.0.0.1:6379/0")) == 0.0
    assert open_receive_wait(app_on("amqp://guest:guest@127.0.0.1//")) == 0.0


@pytest.mark.parametrize(
    "beat_ago,expected",
    [
        (1.5, 3),  # found dead 1.5 s after its last beat: 0.5 + 3 + 1 - 1.5 = 3 s to go
        (0.0, 5),
        (10.0, 0),  # every receive it could have left open has ended
        (None, 0),  # a lost message: no dead job, nothing to wait for
    ],
)
def test_the_delay_ends_after_the_last_receive_the_dead_job_may_have_left_open(beat_ago, expected):
    app = app_on("sqs://k:s@127.0.0.1:9", wait_time_seconds=3)
    now = utcnow()
    beat = None if beat_ago is None else now - timedelta(seconds=beat_ago)
    assert republish_delay(app, 0.5, beat, now) == expected


def test_no_delay_on_a_broker_whose_dead_consumers_take_nothing():
    now = utcnow()
    assert republish_delay(app_on("redis://127.0.0.1:6379/0"), 0.5, now, now) == 0
