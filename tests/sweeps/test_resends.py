"""A step run again after its worker died sends the rest of its chain again: the copies of
what already ran are dropped."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import chain, chord

from celery_recovery import TaskState
from celery_recovery.recovery import recovery_for_app
from tests.apps.lifecycle import create_app
from tests.conftest import FAST_SETTINGS, forget_result_subscriptions, lock_settings
from tests.sweeps.helpers import ledger_lines, sweep_until
from tests.workers import wait_for

pytestmark = pytest.mark.slow

ZOMBIE = FAST_SETTINGS["zombie_threshold"]
SWEEP = FAST_SETTINGS["sweep_interval"]


@pytest.fixture
def results_on(
    request: pytest.FixtureRequest, store_url: str, broker_urls, queue: str, tmp_path: Path
) -> Iterator[tuple[Any, dict[str, str]]]:
    """The client app on the parametrized result backend, and the workers' environment."""
    if request.param == "redis":
        backend = broker_urls[1]
    else:
        backend = f"db+sqlite:///{tmp_path / 'results.sqlite3'}"
    recovery = {"database_url": store_url, **lock_settings(broker_urls), **FAST_SETTINGS}
    app = create_app(broker_urls[0], backend, queue, recovery)
    # Create the result tables before two workers race to.
    app.backend.get_task_meta("create-the-result-tables-once")
    yield app, {"RECOVERY_TEST_BACKEND": backend}
    recovery_for_app(app).close()
    forget_result_subscriptions(app)
    app.close()


def _runs(ledger: Path) -> Counter[str]:
    return Counter(line.split()[0] for line in ledger_lines(ledger))


def _first_step(app, ledger: Path) -> Any:
    step = app.signature("lifecycle.dies_after_next_step", (str(ledger),))
    return step.set(task_id=f"first-{uuid.uuid4().hex}")


def _kill_after_the_chain_then_recover(app, env, start_worker, canvas, dropped: str) -> Any:
    """Run ``canvas`` on a worker its first step kills once the chain ran; recover it on
    another worker until the copy of ``dropped`` is dropped and the first step ran again."""
    doomed = start_worker(name="doomed", concurrency=2, env=env)
    result = canvas.apply_async()
    wait_for(lambda: doomed.proc.poll() is not None, 40, what="the first step to end its worker")
    assert result.ready(), "the chain had not finished when its first step died"
    survivor = start_worker(name="survivor", concurrency=1, env=env)
    first = app.AsyncResult(canvas.tasks[0].id)
    copy_dropped = f"dropping stale delivery of {dropped}"

    def recovered() -> bool:
        return copy_dropped in survivor.log and first.ready()

    sweep_until(app, recovered, ZOMBIE + SWEEP + 25, "the copy dropped, the step run again")
    return result


@pytest.mark.parametrize(
    "store_url,broker,results_on",
    [("sqlite", "redis", "redis"), ("postgresql", "rabbitmq", "redis")],
    indirect=["store_url", "results_on"],
)
def test_a_chain_step_run_again_does_not_run_its_next_step_again(
    results_on, store, start_worker, tmp_path
):
    """Celery publishes a chain's next step before it stores the step's result.  The
    step's worker dies in between, after the next step ran: the sweep rightly runs the
    step again (its outcome is unknown), and that run publishes the next step again,
    under the same id.  The copy is dropped; the next step ran once."""
    app, env = results_on
    ledger = tmp_path / "ledger"
    canvas = chain(_first_step(app, ledger), app.signature("lifecycle.next_step"))
    result = _kill_after_the_chain_then_recover(
        app, env, start_worker, canvas, "lifecycle.next_step"
    )
    assert _runs(ledger) == {"first": 2, "next": 1}, ledger_lines(ledger)
    assert [(t["try_number"], t["state"]) for t in store.tries.history(result.id)] == [
        (1, TaskState.SUCCESS)
    ]
    assert [(t["try_number"], t["state"]) for t in store.tries.history(canvas.tasks[0].id)] == [
        (1, TaskState.UP_FOR_RETRY),
        (2, TaskState.SUCCESS),
    ]
    assert result.get(timeout=5) == str(ledger)


@pytest.mark.parametrize(
    "store_url,broker,results_on",
    [("postgresql", "redis", "database"), ("sqlite", "rabbitmq", "database")],
    indirect=["store_url", "results_on"],
)
def test_a_chain_step_run_again_does_not_run_the_chord_after_it_again(
    results_on, store, start_worker, tmp_path
):
    """The same with a chord after the step, on a result backend without native chords:
    the step's new run applies the chord again, whose new unlock task publishes the body
    again.  The header parts' and the body's copies are dropped; each ran once, and so did
    the step after the chord."""
    app, env = results_on
    ledger = tmp_path / "ledger"
    part = app.signature("lifecycle.next_step", kwargs={"tag": "part"})
    canvas = chain(
        _first_step(app, ledger),
        chord([part, part.clone()], app.signature("lifecycle.gather", (str(ledger),))),
        app.signature("lifecycle.next_step"),
    )
    result = _kill_after_the_chain_then_recover(app, env, start_worker, canvas, "lifecycle.gather")
    assert _runs(ledger) == {"first": 2, "part": 2, "gather": 1, "next": 1}, ledger_lines(ledger)
    assert result.get(timeout=5) == str(ledger)


@pytest.mark.parametrize(
    "store_url,broker,results_on",
    [("sqlite", "redis", "redis")],
    indirect=["store_url", "results_on"],
)
def test_a_child_a_retry_sends_again_under_its_id_runs_once(results_on, start_worker, tmp_path):
    """A task's own retry publishes again the child its first try sent under a set id
    (``task_id=f"email-{order_id}"``): the child ran already, so the copy is dropped."""
    app, env = results_on
    ledger = tmp_path / "ledger"
    worker = start_worker(concurrency=2, env=env)
    child_id = f"child-{uuid.uuid4().hex}"
    result = app.send_task("lifecycle.sends_then_retries", (str(ledger), child_id))
    assert result.get(timeout=30) == "done"
    wait_for(
        lambda: "dropping stale delivery of lifecycle.next_step" in worker.log,
        20,
        what="the child's copy to be dropped",
    )
    assert _runs(ledger) == {"parent": 2, "child": 1}, ledger_lines(ledger)
    assert app.AsyncResult(child_id).get(timeout=5) == str(ledger)
