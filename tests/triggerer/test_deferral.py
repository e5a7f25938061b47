"""Deferring on a real worker; resuming and completing through a real triggerer."""

from __future__ import annotations

from celery_recovery import DEFERRED_STATE, TaskState
from tests.sweeps.helpers import ledger_lines
from tests.workers import wait_for


def _state(store, task_id: str) -> str | None:
    tries = store.tries(task_id)
    return tries[-1]["state"] if tries else None


def test_trigger_event_resumes_the_task_in_its_method(
    client_app, store, start_worker, start_triggerer, tmp_path
):
    ledger = tmp_path / "ledger"
    start_worker(concurrency=1)
    result = client_app.tasks["lifecycle.wait"].delay(str(ledger), 1.5)
    wait_for(lambda: _state(store, result.id) == TaskState.DEFERRED, 20, what="deferred")
    assert result.state == DEFERRED_STATE
    [trigger] = store.list_triggers(result.id)
    assert trigger["classpath"] == "tests.apps.triggers.Sleep"
    assert trigger["method_name"] == "resumed" and trigger["triggerer_id"] is None
    start_triggerer()
    value = result.get(timeout=30)
    assert value["event"]["queue"] == "default"
    assert value["try"] == 1
    lines = ledger_lines(ledger)
    assert [line.split()[0] for line in lines] == ["start", "resumed"], lines
    # The worker writes the outcome a moment after the result (write-behind).
    wait_for(lambda: _state(store, result.id) == TaskState.SUCCESS, 10, what="success")
    assert len(store.tries(result.id)) == 1  # resumed as the same try
    assert store.list_triggers(result.id) == []
