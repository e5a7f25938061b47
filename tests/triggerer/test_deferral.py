"""Deferring on a real worker; resuming and completing through a real triggerer."""

from __future__ import annotations

import re

import pytest

from celery_recovery import DEFERRED_STATE, TaskState
from tests.sweeps.helpers import ledger_lines
from tests.workers import wait_for

#: Every store on the tests' Redis backend, and rpc:// (whose results go to the caller's
#: own queue: the triggerer must send them there) on one store.
BACKENDS = pytest.mark.parametrize(
    "store_url,result_backend",
    [("sqlite", "redis"), ("postgresql", "redis"), ("postgresql", "rpc")],
    indirect=["store_url"],
)


def _state(store, task_id: str) -> str | None:
    tries = store.tries.history(task_id)
    return tries[-1]["state"] if tries else None


@BACKENDS
def test_trigger_event_resumes_the_task_in_its_method(
    client_app, store, start_worker, start_triggerer, tmp_path
):
    ledger = tmp_path / "ledger"
    start_worker(concurrency=1)
    result = client_app.tasks["lifecycle.wait"].delay(str(ledger), 1.5)
    wait_for(lambda: _state(store, result.id) == TaskState.DEFERRED, 20, what="deferred")
    assert result.state == DEFERRED_STATE
    [trigger] = store.triggers.list_triggers(result.id)
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
    assert len(store.tries.history(result.id)) == 1  # resumed as the same try
    assert store.triggers.list_triggers(result.id) == []


def test_a_lost_resume_message_is_published_again_and_resumes(
    make_client_app, store_url, store, start_worker, start_triggerer, broker_urls, queue, tmp_path
):
    """Found by the chaos run: a resume prefetched by a worker that was then SIGKILLed
    left its try queued forever (the backend said DEFERRED, not PENDING)."""
    import redis

    from tests.sweeps.helpers import sweep_until

    client = make_client_app(store_url, queued_timeout=2)
    ledger = tmp_path / "ledger"
    worker = start_worker(concurrency=1)
    result = client.tasks["lifecycle.wait"].delay(str(ledger), 0.5)
    wait_for(lambda: _state(store, result.id) == TaskState.DEFERRED, 20, what="deferred")
    worker.stop()
    # Given a resume the triggerer published, whose message is then lost
    start_triggerer()
    broker = redis.Redis.from_url(broker_urls[0])
    wait_for(lambda: broker.llen(queue) == 1, 20, what="the resume message")
    assert _state(store, result.id) == TaskState.QUEUED and broker.delete(queue) == 1
    assert result.state == DEFERRED_STATE
    start_worker(concurrency=1)
    # When the sweep runs, Then the try is published again, resumes in its method once
    sweep_until(client, result.ready, 30, "the lost resume to be re-sent and run")
    assert result.get(timeout=5)["event"]["queue"] == "default"
    # (on_retry: the sweep retried the try whose message was lost)
    assert sorted(line.split()[0] for line in ledger_lines(ledger)) == [
        "on_retry",
        "resumed",
        "start",
    ]
    tries = store.tries.history(result.id)
    assert "message lost" in tries[0]["state_reason"]


@BACKENDS
def test_task_success_event_completes_the_task_with_no_worker(
    client_app, store, start_worker, start_triggerer
):
    worker = start_worker(concurrency=1)
    result = client_app.tasks["lifecycle.nap"].delay(1.5)
    wait_for(lambda: _state(store, result.id) == TaskState.DEFERRED, 20, what="deferred")
    worker.stop()  # no worker at all from here on
    start_triggerer()
    assert result.get(timeout=30) == {"slept": 1.5}
    # The result backend is written first, then the record (so a crash between is redone).
    wait_for(lambda: _state(store, result.id) == TaskState.SUCCESS, 10, what="success")
    [record] = store.tries.history(result.id)
    assert record["state_reason"] == "completed by its trigger"
    assert store.triggers.list_triggers(result.id) == []


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_failing_triggers_fail_their_task_and_its_callbacks_run(
    client_app, store, start_worker, start_triggerer, tmp_path
):
    from celery_recovery import TriggerFailedError, TriggerTimeoutError
    from tests.sweeps.helpers import sweep_until

    start_worker(concurrency=2)
    start_triggerer()
    cases = {
        "Explodes": (TriggerFailedError, "the trigger exploded"),
        "Missing": (TriggerFailedError, "cannot import trigger module 'tests.apps.no_such_module'"),
        "Never": (TriggerTimeoutError, "timed out"),
    }
    results = {
        kind: client_app.tasks["lifecycle.wait_on"].delay(
            str(tmp_path / kind), kind, timeout=2.0 if kind == "Never" else None
        )
        for kind in cases
    }
    for kind, (exc_type, text) in cases.items():
        result = results[kind]
        with pytest.raises(Exception) as raised:
            result.get(timeout=30)
        assert type(raised.value).__name__ == exc_type.__name__, kind
        wait_for(lambda r=result: _state(store, r.id) == TaskState.FAILED, 10, what=kind)
        [record] = store.tries.history(result.id)
        assert text in record["error"], (kind, record["error"])
    # The failure callbacks come from the outbox, delivered by the sweep.
    sweep_until(
        client_app,
        lambda: all(
            ledger_lines(tmp_path / kind)[-1:] and "on_failure" in ledger_lines(tmp_path / kind)[-1]
            for kind in cases
        ),
        20,
        "the on_failure callbacks",
    )
    for kind, (exc_type, _) in cases.items():
        failures = [x for x in ledger_lines(tmp_path / kind) if x.startswith("on_failure")]
        assert len(failures) == 1 and exc_type.__name__ in failures[0], (kind, failures)
    # And the recovery audit log says each was failed for good by its trigger, and why
    from tests.web.helpers import console_client

    with console_client(store.url) as console:
        for kind in cases:
            params = {"task_id": results[kind].id, "action": "failed"}
            [row] = console.get("/api/recoveries", params=params).json()["rows"]
            reason = "trigger_timeout" if kind == "Never" else "trigger_failed"
            assert (row["try_number"], row["reason"]) == (1, reason), (kind, row)


def test_bad_trigger_arguments_fail_at_defer_time_and_store_nothing(
    client_app, store, start_worker, tmp_path
):
    start_worker(concurrency=1)
    result = client_app.tasks["lifecycle.wait_on"].delay(str(tmp_path / "l"), "NotJson")
    with pytest.raises(Exception, match="must be JSON"):
        result.get(timeout=20)
    assert store.triggers.list_triggers(result.id) == []
    wait_for(lambda: _state(store, result.id) == TaskState.FAILED, 10, what="failed")


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_trigger_that_blocks_the_loop_is_reported(
    client_app, store, start_worker, start_triggerer, tmp_path
):
    from tests.services import free_port
    from tests.telemetry.scrape import scrape, value

    start_worker(concurrency=1)
    port = free_port()
    triggerer = start_triggerer("--metrics-port", str(port))
    result = client_app.tasks["lifecycle.wait"].delay(str(tmp_path / "l"), 0.5, block=0.8)
    result.get(timeout=30)
    [trigger_name] = set(
        re.findall(r"(trigger \d+ \(tests\.apps\.triggers\.Sleep\))", triggerer.log)
    )
    assert f"{trigger_name} of task {result.id} has blocked the triggerer's event loop" in (
        triggerer.log
    )
    # On a busy machine the triggerer's own start may be reported too: read the trigger's line.
    total = wait_for(
        lambda: re.search(
            re.escape(trigger_name) + r" of task \S+ blocked the event loop for (\d+\.\d+)s in all",
            triggerer.log,
        ),
        10,
        what="the total blocked time",
    )
    assert 0.7 <= float(total.group(1)) < 3
    # The triggerer's metrics say the same.
    samples = wait_for(
        lambda: (
            (m := scrape(port))
            and value(m, "celery_recovery_trigger_events_total", kind="resumed") == 1
            and m
        ),
        10,
        what="the triggerer's metrics",
    )
    # Each report is logged before it is counted, so the log read after the scrape bounds it.
    reports = len(re.findall(r"blocked the event loop for \d+\.\d+s in all", triggerer.log))
    assert 1 <= value(samples, "celery_recovery_triggerer_blocked_loop_warnings_total") <= reports
    job_id = triggerer.job_id(store)
    assert value(samples, "celery_recovery_triggers_running", triggerer=job_id) == 0
