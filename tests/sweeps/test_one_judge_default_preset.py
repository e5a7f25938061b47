"""A death has one judge at the default preset's intervals too (see test_one_judge.py).

The parent's grace is measured from the dead pool process's last heartbeat plus
the step's own bound, so it must scale with the heartbeat interval: at the
default preset a pool process's last heartbeat may be five seconds old when it
dies, and the zombie step waits thirty.  Run on the newest Celery by the suite;
not part of the compatibility core (it waits out the thirty seconds), run by
hand on the older versions (docs/compatibility.md).
"""

from __future__ import annotations

import pytest

from celery_recovery import TaskState
from celery_recovery.core.presets import PRESETS
from tests.apps.lifecycle import log_failure_listeners
from tests.sweeps.helpers import count, ledger_lines
from tests.sweeps.test_one_judge import _run_each_until_failed, _worker_env

pytestmark = pytest.mark.slow

DEFAULT_TIMING = {
    key: PRESETS["default"][key]
    for key in ("heartbeat_interval", "zombie_threshold", "health_check_threshold")
}


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_at_the_default_presets_intervals_a_dead_pool_process_still_has_one_judge(
    make_client_app, store_url, store, start_worker, tmp_path
):
    # Both cases of test_one_judge.py at once, each ten times, under the default preset's
    # heartbeats and thresholds, with sweeps as eager as there: the parent's grace must
    # scale with the heartbeat interval, not assume the aggressive one.
    app = make_client_app(store_url, **DEFAULT_TIMING)
    heard = tmp_path / "listeners"
    log_failure_listeners(app, str(heard))
    start_worker(concurrency=4, env=_worker_env(heard, DEFAULT_TIMING))
    names = ["lifecycle.self_kill"] * 10 + ["lifecycle.poison"] * 10
    ledgers = [tmp_path / f"{name.split('.')[1]}-{i}" for i, name in enumerate(names)]
    sends = list(zip(names, ledgers, strict=True))
    results = _run_each_until_failed(app, sends, 120, DEFAULT_TIMING)

    for name, path, result in zip(names, ledgers, results, strict=True):
        lines = ledger_lines(path)
        poison = name == "lifecycle.poison"
        assert count(path, "start") == (3 if poison else 1), lines  # poison: max_retries=2
        assert count(path, "on_failure WorkerLostError") == 1, lines
        assert count(path, "on_retry") == 0, lines
        [only] = store.tries.history(result.id)
        # deaths counts the runs of a message Celery requeued (acks_late), as above.
        assert (only["state"], only["deaths"]) == (TaskState.FAILED, 3 if poison else 0), only
        assert only["recovered_at"] is None, only
        assert result.state == "FAILURE"
    # Celery requeues the poison's message: one try, three deaths, one failure.
    assert sorted(ledger_lines(heard)) == sorted(
        f"failure {r.id} try=1 WorkerLostError" for r in results
    )
