"""The worker main process's ``task_received`` handler, on a real store.

The real-worker behaviour (a killed worker's prefetched and ETA messages run
once elsewhere) is tests/sweeps/test_reserved.py; this pins what the handler
leaves in the process: a received request is not kept alive by the writer's
buffer (each one holds its message, headers and body, and a buffer holding
them all makes every garbage-collector pass longer), and only the messages
still waiting when the batch is written become reservation rows.
"""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import pytest
from celery import Celery

from celery_recovery import JobType, Recovery
from celery_recovery.signals.reservations import on_received
from tests.sweeps.helpers import reserved_ids


class Received:
    """What the handler reads of Celery's worker ``Request`` (which supports weak references)."""

    def __init__(self, task_id: str) -> None:
        self.id = task_id
        self.request_dict: dict = {"retries": 0}
        self.time_start: float | None = None


@pytest.fixture
def worker_main(store_url):
    app = Celery("received", broker="memory://", set_as_current=False)
    app.conf.recovery_database_url = store_url
    recovery = Recovery(app)
    recovery.runtime.start_job(JobType.WORKER, node_name="main@host")
    yield SimpleNamespace(app=app, recovery=recovery)
    recovery.close()


def test_a_received_request_is_not_kept_alive_by_the_buffer(worker_main):
    request = Received("gone")
    alive = weakref.ref(request)
    on_received(sender=worker_main, request=request)
    assert "recovery_reserved_at" in request.request_dict, "stamped for the pool process"
    del request
    gc.collect()
    assert alive() is None, "only Celery holds a request it has not let go of"
    assert worker_main.recovery.flush()
    assert reserved_ids(worker_main.recovery.store) == set(), (
        "a request Celery let go of is not held"
    )


def test_only_requests_still_waiting_when_the_batch_is_written_are_reserved(worker_main):
    waiting, started = Received("waiting"), Received("started")
    on_received(sender=worker_main, request=waiting)
    on_received(sender=worker_main, request=started)
    started.time_start = 1.0  # a pool process took it: its claim covers it
    assert worker_main.recovery.flush()
    assert reserved_ids(worker_main.recovery.store) == {"waiting"}
