"""Time limits: a try that overran its limit ends failed, for the limit, on every Celery.

At a hard limit Celery kills the pool process and stores FAILURE
(``TimeLimitExceeded``) from the worker's main process; 5.7 then calls the
task's ``on_failure`` there, 5.5 and 5.6 call nothing.  Ours is the same on
each: the try is ``failed`` with the limit as its reason, ``on_failure`` and
the failure listeners run once, and no sweep runs it again (it would hit the
limit again).
"""

from __future__ import annotations

import pytest

from celery_recovery import TaskState
from celery_recovery.recovery import recovery_for_app
from tests.apps.lifecycle import log_failure_listeners
from tests.conftest import FAST_SETTINGS
from tests.sweeps.helpers import count, ledger_lines, sweep_for, sweep_until

pytestmark = [pytest.mark.slow, pytest.mark.compat]

#: Long enough for a killed process's job to be judged dead by a sweep, and more.
JUDGED = FAST_SETTINGS["zombie_threshold"] + 2 * FAST_SETTINGS["sweep_interval"] + 1


@pytest.mark.parametrize(
    "store_url,broker", [("sqlite", "redis"), ("postgresql", "rabbitmq")], indirect=["store_url"]
)
def test_a_try_past_its_time_limit_fails_for_the_limit_and_its_callbacks_run_once(
    client_app, store, start_worker, tmp_path
):
    heard = tmp_path / "listeners"
    log_failure_listeners(client_app, str(heard))
    names = ("hard_limited", "soft_limited", "hard_limited_late")
    ledgers = {name: tmp_path / name for name in names}
    start_worker(concurrency=len(names), env={"RECOVERY_TEST_LISTENER_LOG": str(heard)})
    results = {
        name: client_app.send_task(f"lifecycle.{name}", (str(ledgers[name]),)) for name in names
    }

    sweep_until(
        client_app,
        lambda: all(count(ledgers[n], "on_failure") for n in names),
        30,
        "on_failure of each task past its limit",
    )
    # Past the time any sweep would take to judge the killed processes dead.
    sweep_for(client_app, JUDGED)

    for name in names:
        lines = ledger_lines(ledgers[name])
        assert count(ledgers[name], "start") == 1, (name, lines)  # never run again
        assert count(ledgers[name], "on_failure") == 1, (name, lines)
        assert count(ledgers[name], "on_retry") == 0, (name, lines)
        [only] = store.tries.history(results[name].id)
        assert only["state"] == TaskState.FAILED, (name, only)
        assert only["recovered_at"] is None, (name, only["state_reason"])
    for name in ("hard_limited", "hard_limited_late"):
        assert results[name].state == "FAILURE"
        assert "TimeLimitExceeded" in repr(results[name].result)
        assert count(ledgers[name], "on_failure TimeLimitExceeded") == 1, ledger_lines(
            ledgers[name]
        )
        [only] = store.tries.history(results[name].id)
        assert "hard time limit (1 s) exceeded" in only["state_reason"], only
        assert "TimeLimitExceeded" in only["error"], only
    assert results["soft_limited"].state == "FAILURE"
    assert count(ledgers["soft_limited"], "on_failure SoftTimeLimitExceeded") == 1
    [soft] = store.tries.history(results["soft_limited"].id)
    assert "soft time limit (1 s) exceeded" in soft["state_reason"], soft
    # The listeners hear of each killed try once (the soft limit killed nothing).
    assert sorted(ledger_lines(heard)) == sorted(
        f"failure {results[name].id} try=1 TimeLimitExceeded"
        for name in ("hard_limited", "hard_limited_late")
    )
    assert recovery_for_app(client_app).store.outbox.pending_callbacks() == []
