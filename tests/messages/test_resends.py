"""Which publishes are marked as maybe sent again, and what the backend tells of a copy.

Pure logic beside the real test (tests/sweeps/test_resends.py, which kills a worker
between a chain step's next step and its own result)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

from celery import Celery
from celery._state import _task_stack

from celery_recovery.messages.backend_probe import finished_state
from celery_recovery.messages.headers import RESENT_HEADER
from celery_recovery.messages.resends import MAX_HOPS, is_resent, resent_hops


def _app(backend: str | None = None) -> Celery:
    app = Celery("resends", set_as_current=False, broker="memory://", backend=backend)

    @app.task(shared=False, name="resends.step")
    def step():
        return None

    return app


@contextmanager
def _running(app: Celery, **request: object) -> Iterator[None]:
    """As a worker runs ``resends.step`` with this request."""
    task = app.tasks["resends.step"]
    task.push_request(id="running-step", called_directly=False, **request)
    _task_stack.push(task)
    try:
        yield
    finally:
        _task_stack.pop()
        task.pop_request()


def test_a_publish_is_marked_only_from_a_run_that_may_repeat_an_earlier_one() -> None:
    app = _app()
    # Not inside a task (a web process, beat): nothing to repeat.
    assert resent_hops(app, "child") is None
    with _running(app, retries=0, delivery_info={"redelivered": False}):
        assert resent_hops(app, "child") is None
    # The sweep's next try, or Celery's own retry.
    with _running(app, retries=1, delivery_info={}):
        assert resent_hops(app, "child") == 1
        assert resent_hops(app, "running-step") is None  # its own retry: try numbers tell
    # The broker's redelivery of an acks_late message whose worker died.
    with _running(app, retries=0, delivery_info={"redelivered": True}):
        assert resent_hops(app, "child") == 1


def test_a_mark_is_handed_on_for_a_bounded_number_of_generations() -> None:
    app = _app()
    with _running(app, retries=0, delivery_info={}, **{RESENT_HEADER: 1}):
        assert resent_hops(app, "chord-body") == 2
    with _running(app, retries=0, delivery_info={}, **{RESENT_HEADER: MAX_HOPS - 1}):
        assert resent_hops(app, "child") == MAX_HOPS
    with _running(app, retries=0, delivery_info={}, **{RESENT_HEADER: MAX_HOPS}):
        assert resent_hops(app, "child") is None


def test_only_a_delivery_carrying_a_mark_counts_as_resent() -> None:
    assert is_resent(SimpleNamespace(**{RESENT_HEADER: 1}))
    assert not is_resent(SimpleNamespace())
    assert not is_resent(SimpleNamespace(**{RESENT_HEADER: 0}))
    assert not is_resent(SimpleNamespace(**{RESENT_HEADER: "1"}))  # not a stamp of ours


def test_the_backend_tells_a_finished_task_and_nothing_else() -> None:
    app = _app("cache+memory://")
    app.backend.mark_as_done("ran", "value")
    app.backend.mark_as_started("runs")
    assert finished_state(app, "ran") == "SUCCESS"
    assert finished_state(app, "runs") is None
    assert finished_state(app, "never-seen") is None
    # Results disabled: the backend cannot tell, so the delivery runs.
    assert finished_state(_app(), "ran") is None
