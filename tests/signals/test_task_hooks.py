"""The try is claimed by the task class's ``before_start``, once per delivery.

Tasks run through Celery's own tracer in this process, as a pool process runs
them (without a broker), with the store on SQLite; the worker-process side
(tasks registered after the app was finalized) is in tests/signals/test_finalized_app.py.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.app.trace import trace_task
from celery.exceptions import Ignore

from celery_recovery import Recovery, TaskState
from celery_recovery.deliveries.deferral import resume_header
from celery_recovery.messages.headers import RESUME_HEADER
from celery_recovery.signals import tasks as task_hooks


@pytest.fixture
def app(sqlite_url):
    app = Celery("hooks", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.recovery_database_url = sqlite_url
    recovery = Recovery(app)
    recovery.store.ensure_ready()
    yield app
    recovery.close()


def _run(app: Celery, name: str) -> tuple[str, Any]:
    task = app.tasks[name]
    task_id = str(uuid.uuid4())
    request = {
        "id": task_id,
        "task": name,
        "retries": 0,
        "hostname": "hooks@test",
        "delivery_info": {"exchange": "", "routing_key": "celery", "redelivered": False},
    }
    return task_id, trace_task(task, task_id, (), {}, request, app=app).retval


def test_a_task_class_whose_parent_is_a_task_claims_its_try_once(app, monkeypatch):
    starts: list[str] = []

    class Parent(app.Task):
        name = "hooks.parent"

        def before_start(self, task_id, args, kwargs):
            starts.append(self.name)
            super().before_start(task_id, args, kwargs)

        def run(self):
            return "ran"

    class Child(Parent):
        name = "hooks.child"

    # register_task finalizes the app first: these are hooked as a worker starts.
    app.register_task(Parent())
    app.register_task(Child())
    task_hooks.on_worker_init(sender=SimpleNamespace(app=app))
    claims: list[str] = []
    start_try = task_hooks.start_try

    def counted(task: Any, task_id: str, *rest: Any) -> bool:
        claims.append(task_id)
        return start_try(task, task_id, *rest)

    monkeypatch.setattr(task_hooks, "start_try", counted)
    recovery = Recovery(app)
    for name in ("hooks.child", "hooks.parent"):
        starts.clear()
        claims.clear()
        task_id, retval = _run(app, name)
        assert retval == "ran"
        assert claims == [task_id], f"{name}: one claim per delivery"
        assert starts == [name], f"{name}: the task's own before_start runs once"
        assert recovery.flush()
        (record,) = recovery.store.tries.history(task_id)
        assert record["state"] == TaskState.SUCCESS and record["started_at"] is not None


def test_the_same_delivery_run_again_in_the_same_thread_is_claimed_again(app, monkeypatch):
    # A message requeued with Reject(requeue=True) can come back to the process that
    # rejected it: same id, same retries.  Its first run left nothing behind.
    @app.task(name="hooks.noop", shared=False)
    def noop():
        return "ran"

    app.finalize()
    claims: list[str] = []
    start_try = task_hooks.start_try
    monkeypatch.setattr(
        task_hooks,
        "start_try",
        lambda task, task_id, *rest: claims.append(task_id) or start_try(task, task_id, *rest),
    )
    task = app.tasks["hooks.noop"]
    request = {"id": "same-id", "task": "hooks.noop", "retries": 0, "hostname": "hooks@test"}
    for _ in range(2):
        assert trace_task(task, "same-id", (), {}, request, app=app).retval == "ran"
    assert claims == ["same-id", "same-id"]


def test_only_a_resumed_delivery_runs_its_resume_method(app):
    # The task class's before_start tells __call__ which delivery is a resume; what a
    # resumed delivery that never reached its body left must not resume the next call.
    calls: list[tuple[str, Any]] = []
    refuse = {"next": False}

    class Resumable(app.Task):
        name = "hooks.resumable"

        def before_start(self, task_id, args, kwargs):
            if refuse["next"]:
                raise Ignore()

        def run(self, x=0):
            calls.append(("body", x))
            return "body"

        def on_event(self, event):
            calls.append(("resumed", event))
            return "resumed"

    app.register_task(Resumable())

    @app.task(name="hooks.caller", shared=False)
    def caller():
        return app.tasks["hooks.resumable"](7)  # a direct call inside another delivery

    task_hooks.on_worker_init(sender=SimpleNamespace(app=app))
    resume = {RESUME_HEADER: resume_header("on_event", {}, {"n": 1})}

    assert _trace(app, "hooks.resumable", resume) == "resumed"
    refuse["next"] = True
    _trace(app, "hooks.resumable", resume)  # its own before_start refuses it: no body
    refuse["next"] = False
    assert _trace(app, "hooks.resumable", {}) == "body"
    assert _trace(app, "hooks.caller", {}) == "body"
    assert calls == [("resumed", {"n": 1}), ("body", 0), ("body", 7)]


def _trace(app: Celery, name: str, headers: dict[str, Any]) -> Any:
    task_id = str(uuid.uuid4())
    request = {"id": task_id, "task": name, "retries": 0, "hostname": "hooks@test", **headers}
    return trace_task(app.tasks[name], task_id, (), {}, request, app=app).retval
