"""Tasks and queues left alone: ``recovery_exclude_tasks`` and ``recovery_exclude_queues``.

Trivial high-rate tasks can opt out: they record nothing, published or run, and
are never recovered.  The other tasks of the same app and worker are unchanged.
"""

from __future__ import annotations

import pytest

from celery_recovery import TaskState
from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.exclusions import Exclusions
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.recovery import recovery_for_app
from tests.conftest import FAST_SETTINGS
from tests.sweeps.helpers import count, ledger_lines, sweep_for
from tests.workers import flush_publisher, wait_for

EXCLUDED_TASKS = "lifecycle.ad?,lifecycle.ledger_sleep_o*"


def _env(**settings: str) -> dict[str, str]:
    return {f"CELERY_RECOVERY_{name.upper()}": value for name, value in settings.items()}


@pytest.mark.slow
def test_an_excluded_task_records_nothing_and_the_others_are_recorded(
    make_client_app, store_url, store, start_worker
):
    app = make_client_app(store_url, exclude_tasks=EXCLUDED_TASKS.split(","))
    start_worker(env=_env(exclude_tasks=EXCLUDED_TASKS))
    excluded = app.send_task("lifecycle.add", (1, 2))
    kept = app.send_task("lifecycle.noop")
    failed = app.send_task("lifecycle.boom")
    assert excluded.get(timeout=20) == 3
    assert kept.get(timeout=20) is None
    with pytest.raises(ValueError):
        failed.get(timeout=20)
    flush_publisher(app)
    wait_for(
        lambda: [t["state"] for t in store.tries.history(failed.id)] == [TaskState.FAILED],
        10,
        what="the recorded tasks' outcomes",
    )
    assert [t["state"] for t in store.tries.history(kept.id)] == [TaskState.SUCCESS]
    assert store.tries.history(excluded.id) == []


@pytest.mark.slow
def test_an_excluded_task_whose_worker_is_killed_is_not_recovered(
    make_client_app, store_url, store, start_worker, tmp_path
):
    # The price of opting out: the killed task is gone, as with plain Celery.
    app = make_client_app(store_url, exclude_tasks=EXCLUDED_TASKS.split(","))
    worker = start_worker(env=_env(exclude_tasks=EXCLUDED_TASKS))
    excluded_ledger, kept_ledger = tmp_path / "excluded", tmp_path / "kept"
    excluded = app.send_task("lifecycle.ledger_sleep_once", (str(excluded_ledger), 30))
    kept = app.send_task("lifecycle.ledger_sleep", (str(kept_ledger), 30, 0))
    wait_for(lambda: count(excluded_ledger, "start") and count(kept_ledger, "start"), 20)
    # The kept task's running claim is committed (its writer's 20 ms), so a sweep knows it.
    wait_for(lambda: [t["state"] for t in store.tries.history(kept.id)] == [TaskState.RUNNING], 10)
    worker.kill()
    start_worker(name="survivor", env=_env(exclude_tasks=EXCLUDED_TASKS))

    assert kept.get(timeout=30) == 30  # recovered as try 2, which sleeps 0 s
    sweep_for(app, FAST_SETTINGS["zombie_threshold"] + 2)
    assert count(excluded_ledger, "start") == 1, ledger_lines(excluded_ledger)  # gone
    assert store.tries.history(excluded.id) == []


@pytest.mark.slow
def test_a_task_in_an_excluded_queue_records_nothing(
    make_client_app, store_url, store, start_worker, queue
):
    pattern = queue[: len("test-")] + "*"
    app = make_client_app(store_url, exclude_queues=[pattern])
    start_worker(env=_env(exclude_queues=pattern))
    done = app.send_task("lifecycle.add", (2, 3))
    failed = app.send_task("lifecycle.boom")
    assert done.get(timeout=20) == 5
    with pytest.raises(ValueError):
        failed.get(timeout=20)
    flush_publisher(app)
    assert recovery_for_app(app).flush(timeout=5)
    assert store.tries.history(done.id) == [] and store.tries.history(failed.id) == []
    assert store.tries.list_tries() == []


def test_patterns_match_names_and_queues_as_globs():
    exclusions = Exclusions(["metrics.*", "cache.refresh"], ["bulk-?", "low"])
    assert exclusions.message("metrics.count")
    assert exclusions.message("cache.refresh")
    assert not exclusions.message("cache.refresh_all")
    assert exclusions.message("shop.charge", ["bulk-1"])
    assert not exclusions.message("shop.charge", ["bulk-10", None, "orders"])
    assert not Exclusions()
    assert not Exclusions().message("anything", ["any"])


@pytest.mark.parametrize(
    "value,expected",
    [("a.*, b.c", ("a.*", "b.c")), (["x"], ("x",)), (None, ()), ("", ())],
)
def test_exclusion_settings_take_a_list_or_a_comma_separated_string(value, expected):
    settings = RecoverySettings.from_sources(environ={}, overrides={"exclude_tasks": value})
    assert settings.exclude_tasks == expected


@pytest.mark.parametrize("value", [42, ["ok", ""], [None]])
def test_a_bad_exclusion_setting_is_refused_with_its_name(value):
    with pytest.raises(ConfigurationError, match="recovery_exclude_queues"):
        RecoverySettings.from_sources(environ={}, overrides={"exclude_queues": value})
