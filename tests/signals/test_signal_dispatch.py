"""The per-task signals once celery-recovery is installed: Celery's own objects, with
their receivers cached per sender (:mod:`celery_recovery.signals.dispatch`), and
handlers that catch their own errors.

A user's receiver connected or disconnected after ``Recovery(app)``, a weakly
held one that dies, and one connected for one sender only must be called exactly
as without the cache; a broken handler must never reach the publisher or the task.
"""

from __future__ import annotations

import gc
import logging

import pytest
from celery import Celery
from celery.signals import after_task_publish, before_task_publish, task_postrun, task_received

from celery_recovery import Recovery
from celery_recovery.core.log_once import LogOnce
from celery_recovery.signals import guard, publish
from celery_recovery.signals.dispatch import PER_TASK_SIGNALS


@pytest.fixture
def app(sqlite_url):
    app = Celery("dispatch", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.recovery_database_url = sqlite_url
    app.conf.task_always_eager = False

    @app.task(name="dispatch.add", shared=False)
    def add(x, y):
        return x + y

    @app.task(name="dispatch.other", shared=False)
    def other():
        return None

    recovery = Recovery(app)
    yield app
    recovery.close()


def test_the_per_task_signals_cache_their_receivers_once_recovery_is_installed(app):
    assert all(signal.use_caching for signal in PER_TASK_SIGNALS)
    assert {before_task_publish, after_task_publish, task_received, task_postrun} == set(
        PER_TASK_SIGNALS
    )


def test_a_receiver_connected_after_a_send_is_called_at_the_next_one(app):
    seen: list[str] = []
    app.tasks["dispatch.add"].delay(1, 2)  # fills the cache for this sender

    def late(sender=None, **_):
        seen.append(sender)

    before_task_publish.connect(late, weak=False, dispatch_uid="test.late")
    try:
        app.tasks["dispatch.add"].delay(1, 2)
        assert seen == ["dispatch.add"]
    finally:
        before_task_publish.disconnect(dispatch_uid="test.late")
    app.tasks["dispatch.add"].delay(1, 2)
    assert seen == ["dispatch.add"], "a disconnected receiver is not called again"


def test_a_receiver_for_one_sender_is_called_for_that_sender_only(app):
    seen: list[str] = []

    def only_add(sender=None, **_):
        seen.append(sender)

    after_task_publish.connect(only_add, sender="dispatch.add", weak=False, dispatch_uid="t.one")
    try:
        app.tasks["dispatch.other"].delay()
        app.tasks["dispatch.add"].delay(1, 2)
        app.tasks["dispatch.other"].delay()
        assert seen == ["dispatch.add"]
    finally:
        after_task_publish.disconnect(sender="dispatch.add", dispatch_uid="t.one")


def test_a_weakly_held_receiver_that_dies_is_not_called(app):
    seen: list[str] = []

    class Listener:
        def on_publish(self, sender=None, **_):
            seen.append(sender)

    listener = Listener()
    before_task_publish.connect(listener.on_publish)  # weak, Celery's default
    app.tasks["dispatch.add"].delay(1, 2)
    assert seen == ["dispatch.add"]
    del listener
    gc.collect()
    app.tasks["dispatch.add"].delay(1, 2)
    assert seen == ["dispatch.add"]


def test_a_broken_publish_handler_never_reaches_the_caller_and_is_logged_once(
    app, monkeypatch, caplog
):
    def broken(*_args, **_kwargs):
        raise RuntimeError("broken capture")

    monkeypatch.setattr(publish, "capture_publish", broken)
    monkeypatch.setattr(guard, "_failures", LogOnce())  # as in a new process
    with caplog.at_level(logging.DEBUG, logger="celery_recovery.signals"):
        first = app.tasks["dispatch.add"].delay(1, 2)
        second = app.tasks["dispatch.add"].delay(3, 4)
    assert first.id != second.id  # both published
    failures = [r for r in caplog.records if "on_before_publish" in r.getMessage()]
    assert [r.levelno for r in failures] == [logging.ERROR, logging.DEBUG]
    assert failures[0].exc_info is not None and "not affected" in failures[0].getMessage()
