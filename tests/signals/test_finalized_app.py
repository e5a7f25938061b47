"""An app finalized before its worker starts runs its tasks as it does without Recovery,
and every task's try is claimed once as it starts, also for tasks registered later.

``Recovery(app)`` wraps every task's ``__call__`` (to run a resumed try's
method, see ``celery_recovery.deliveries.deferral``).  When the app's tasks are finalized
at import, that happens before the worker installs Celery's own ``__call__``,
which runs the body on the request the worker pushed; a wrapper that held the
method found at wrapping time pushed a copy of every request (a second entry
on the stack and about 16 us per task).

Every task class also gets the ``before_start`` that claims the try: tasks
registered on the app after it was finalized get it when the worker starts,
and a task class whose parent class is a task too claims once.
"""

from __future__ import annotations

import os

import pytest
from celery import Celery

from celery_recovery import TaskState
from celery_recovery.store import Store
from tests.conftest import app_env
from tests.workers import ROOT, WorkerProcess, wait_for


def _run_once(plain: bool, store_url, broker_urls, queue, tmp_path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **app_env(store_url, broker_urls, queue, plain)}
    name = "plain" if plain else "recovery"
    worker = WorkerProcess(
        "tests.apps.finalized", env, tmp_path / f"{name}.log", concurrency=1, queue=queue
    ).wait_ready()
    try:
        client = Celery(broker=broker_urls[0], backend=broker_urls[1], set_as_current=False)
        result = client.send_task("finalized.requests", queue=queue)
        seen = result.get(timeout=20)
        assert seen["id"] == result.id and seen["retries"] == 0
        return seen
    finally:
        worker.kill()


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_task_of_an_app_finalized_at_import_runs_on_the_workers_own_request(
    store_url, broker_urls, queue, tmp_path
):
    plain = _run_once(True, store_url, broker_urls, queue, tmp_path)
    with_recovery = _run_once(False, store_url, broker_urls, queue, tmp_path)
    assert plain["stack"] == 1
    assert with_recovery == {**plain, "id": with_recovery["id"]}, (
        "the body runs on the request the worker pushed, not on a copy pushed over it"
    )


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_tasks_registered_after_the_app_was_finalized_are_claimed_once_as_they_start(
    store_url, broker_urls, queue, tmp_path
):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **app_env(store_url, broker_urls, queue)}
    worker = WorkerProcess(
        "tests.apps.finalized", env, tmp_path / "worker.log", concurrency=1, queue=queue
    ).wait_ready()
    store = Store(store_url)
    try:
        client = Celery(broker=broker_urls[0], backend=broker_urls[1], set_as_current=False)
        for name in ("finalized.late", "finalized.parent", "finalized.child"):
            result = client.send_task(name, queue=queue)
            # The task's own before_start ran once (a hooked parent class claims nothing).
            assert result.get(timeout=20) == 1, name
            (record,) = wait_for(
                lambda r=result: [t for t in store.tries.history(r.id) if t["ended_at"]],
                15,
                what=f"the try of {name} to be recorded",
            )
            assert record["state"] == TaskState.SUCCESS, (name, record)
            assert record["task_name"] == name
            # Claimed by the worker as it started, not only finished.
            assert record["started_at"] is not None and record["job_id"] is not None, record
            assert record["worker_pid"] is not None, record
    finally:
        worker.kill()
        store.dispose()
