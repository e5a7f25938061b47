"""heartbeat()'s argument checks and where it may be called (no worker needed)."""

from __future__ import annotations

import pytest

from celery_recovery import HeartbeatDetailsError, heartbeat, heartbeat_details, recoverable
from celery_recovery.core.errors import ConfigurationError
from celery_recovery.task_heartbeats import MAX_DETAILS_BYTES, heartbeat_timeout_of


def test_heartbeat_outside_a_task_says_where_it_belongs():
    with pytest.raises(RuntimeError, match="inside a task"):
        heartbeat()
    with pytest.raises(RuntimeError, match="inside a task"):
        heartbeat_details()


def test_details_that_are_not_json_or_too_large_are_refused_clearly():
    with pytest.raises(HeartbeatDetailsError, match="takes JSON"):
        heartbeat({"when": object()})
    with pytest.raises(HeartbeatDetailsError, match=f"at most {MAX_DETAILS_BYTES}"):
        heartbeat("x" * (MAX_DETAILS_BYTES + 1))


def test_an_eager_task_may_beat_and_reads_no_details(celery_app):
    @celery_app.task(bind=True, recovery_heartbeat_timeout=5)
    def work(self):
        heartbeat({"step": 1})
        return heartbeat_details()

    assert work.apply().get() is None
    assert heartbeat_timeout_of(work) == 5.0


def test_the_timeout_option_of_recoverable_is_read_like_the_task_attribute(celery_app):
    @celery_app.task(bind=True)
    @recoverable(recovery_heartbeat_timeout=7)
    def work(self):
        return None

    assert heartbeat_timeout_of(work) == 7.0
    with pytest.raises(
        ConfigurationError, match="recovery_heartbeat_timeout=-1 must be a positive number"
    ):
        recoverable(recovery_heartbeat_timeout=-1)
