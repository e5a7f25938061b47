"""Built-in triggers and safe loading of stored triggers."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from celery_recovery import (
    DateTimeTrigger,
    DeferralError,
    TaskResultTrigger,
    TaskState,
    TimeDeltaTrigger,
)
from celery_recovery.core.timeutils import utcnow
from celery_recovery.triggers.loading import TriggerLoadError, load_trigger, serialize_trigger
from tests.apps.triggers import NotJson
from tests.workers import wait_for

PREFIXES = ("celery_recovery", "tests")


def test_a_time_delta_is_fixed_when_the_trigger_is_made():
    trigger = TimeDeltaTrigger(timedelta(seconds=30), end_from_trigger=True, result=[1])
    classpath, kwargs = serialize_trigger(trigger, PREFIXES)
    assert classpath == "celery_recovery.triggers.temporal.DateTimeTrigger"
    rebuilt = load_trigger(classpath, kwargs, PREFIXES)
    assert rebuilt.moment == trigger.moment
    assert 29 < (rebuilt.moment - utcnow()).total_seconds() <= 30
    assert rebuilt.end_from_trigger and rebuilt.result == [1]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: DateTimeTrigger(datetime(2030, 1, 1)), "aware datetime"),
        (lambda: DateTimeTrigger("not a date"), "ISO 8601"),
        (lambda: TimeDeltaTrigger("soon"), "seconds or a timedelta"),
        (lambda: TaskResultTrigger(""), "task id"),
        (lambda: TaskResultTrigger("x", poll=0), "positive"),
    ],
)
def test_bad_trigger_arguments_are_refused_with_the_argument_named(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_non_json_kwargs_are_refused_before_anything_is_stored():
    with pytest.raises(DeferralError, match="NotJson kwargs must be JSON"):
        serialize_trigger(NotJson(), PREFIXES)


@pytest.mark.parametrize(
    ("classpath", "message"),
    [
        ("os.system", "outside the allowed modules"),
        ("subprocess.Popen", "outside the allowed modules"),
        ("celery_recovery_evil.T", "outside the allowed modules"),
        ("tests.apps.no_such_module.T", "cannot import"),
        ("celery_recovery.recovery.Recovery", "not a BaseTrigger subclass"),
        ("nodots", "is not 'module.Class'"),
    ],
)
def test_a_stored_class_path_is_imported_only_from_allowed_modules(classpath, message):
    with pytest.raises(TriggerLoadError, match=message):
        load_trigger(classpath, {}, PREFIXES)


def test_kwargs_that_do_not_fit_the_class_are_a_load_error():
    with pytest.raises(TriggerLoadError, match="cannot rebuild"):
        load_trigger("celery_recovery.triggers.temporal.DateTimeTrigger", {"when": 1}, PREFIXES)


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_task_result_trigger_waits_for_another_task_without_a_worker_slot(
    client_app, store, start_worker, start_triggerer, tmp_path
):
    start_worker(concurrency=1)  # one slot: the followers must not hold it while waiting
    start_triggerer()
    other = client_app.tasks["lifecycle.sleep_for"].apply_async((1.5,), countdown=1)
    resumed = client_app.tasks["lifecycle.follow"].delay(str(tmp_path / "l"), other.id)
    ended = client_app.tasks["lifecycle.follow"].delay(str(tmp_path / "l"), other.id, end=True)
    for follower in (resumed, ended):
        wait_for(
            lambda f=follower: (
                [t["state"] for t in store.tries.history(f.id)] == [TaskState.DEFERRED]
            ),
            20,
            what="a deferred follower",
        )
    assert other.get(timeout=20) == 1.5
    assert resumed.get(timeout=20)["event"] == {
        "task_id": other.id,
        "state": "SUCCESS",
        "result": 1.5,
    }
    assert ended.get(timeout=20) == 1.5


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_hostile_trigger_row_is_never_imported_and_fails_its_task(
    client_app, store, start_worker, start_triggerer, tmp_path
):
    """Someone with write access to the store points a deferred task at os.system."""
    start_worker(concurrency=1)
    result = client_app.tasks["lifecycle.wait"].delay(str(tmp_path / "l"), 3600)
    wait_for(lambda: store.triggers.list_triggers(result.id), 20, what="the trigger row")
    marker = tmp_path / "pwned"
    with store.transaction() as conn:
        conn.exec_driver_sql(
            "UPDATE triggers SET classpath = %(c)s, kwargs = %(k)s WHERE task_id = %(t)s",
            {"c": "os.system", "k": f'{{"command": "touch {marker}"}}', "t": result.id},
        )
    start_triggerer()
    with pytest.raises(Exception, match="outside the allowed modules"):
        result.get(timeout=30)
    assert not marker.exists()
    wait_for(
        lambda: store.tries.history(result.id)[0]["state"] == TaskState.FAILED, 10, what="failed"
    )
