"""A Django shop's recovery: django-celery-results as the result backend, the sweeper
started as the README says (`celery -A djproj recovery sweep --loop`), beat's sweep
entry, the triggerer, and a killed task's ``on_failure`` run where Django is set up.

Before our processes started the app as Celery's worker does, every sweep of such a
sweeper failed on the result backend (``AppRegistryNotReady``) and a killed worker's
tasks stayed STARTED for ever.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest

from celery_recovery import JobState, TaskState
from celery_recovery.core.presets import preset_settings
from celery_recovery.sweeps.tasks import SWEEP_TASK
from tests.builders import make_zombie
from tests.django.conftest import APP, PROJECT
from tests.proxy import TcpProxy
from tests.workers import ROOT, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

#: Kill to every task done again elsewhere, with the fast settings (2 s threshold, 1 s
#: sweeps) and short re-runs, on a loaded CI machine.
KILL_BOUND = 25.0
#: Kill to the next try under the default preset when the marker watch finds the death:
#: a look (0.5 s), a sweep and a worker taking the message, on a loaded machine.
WATCH_BOUND = 3.0
DEFAULT = preset_settings("default")


def body_runs(task_id: str) -> int:
    from shop.models import BodyRun

    return BodyRun.objects.filter(task_id=task_id).count()


def last_state(store: Any, task_id: str) -> str | None:
    history = store.tries.history(task_id)
    return history[-1]["state"] if history else None


def stored_result(task_id: str, backend: str) -> dict[str, Any] | None:
    """What the project's result backend holds for ``task_id``, read as its app would."""
    if backend == "django-db":
        from django_celery_results.models import TaskResult

        row = TaskResult.objects.filter(task_id=task_id).first()
        return None if row is None else {"status": row.status, "result": json.loads(row.result)}
    from django.core.cache import cache

    # django-cache keeps the meta itself (pickled by Django's cache), not encoded.
    return cache.get(f"celery-task-meta-{task_id}")


def sweep_reports(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("zombies=")]


def assert_only_decisions(sweeper: Any) -> None:
    """The sweeper's log holds its reports and decisions: no error, no traceback.  (A
    pass prints its report after its decisions are committed: wait for the first.)"""
    wait_for(lambda: sweep_reports(sweeper.log), 10, what="the sweeper's first report")
    log = sweeper.log
    assert "Traceback" not in log and "AppRegistryNotReady" not in log, log[-3000:]
    assert "probe failed" not in log, log[-3000:]
    reports = sweep_reports(log)
    assert all(" errors=0 " in f" {line} " for line in reports), [
        line for line in reports if " errors=0 " not in f" {line} "
    ]


@pytest.mark.compat
@pytest.mark.parametrize("django_backend", ["django-db", "django-cache"])
def test_a_killed_workers_tasks_are_recovered_by_the_sweeper_the_readme_starts(
    django_orm, store, start_django_worker, start_django_process, django_client_app, django_backend
):
    # Given the sweeper started as the README says, and a worker running two tasks,
    sweeper = start_django_process("recovery", "sweep", "--loop", name="sweeper")
    doomed = start_django_worker("doomed")
    results = [
        django_client_app.send_task("shop.tasks.work", args=[f"order-{i}", 0.5, 60.0])
        for i in range(2)
    ]
    wait_for(lambda: all(body_runs(r.id) == 1 for r in results), 20, what="both bodies to start")
    start_django_worker("survivor")

    # when the worker is SIGKILLed,
    doomed.kill()
    killed = time.monotonic()

    # then both tasks run again on the survivor and succeed, in the project's backend too,
    for result in results:
        wait_for(
            lambda r=result: (stored_result(r.id, django_backend) or {}).get("status") == "SUCCESS",
            max(KILL_BOUND - (time.monotonic() - killed), 0.5),
            what=f"{result.id}'s SUCCESS in {django_backend}",
        )
    print(f"\n{django_backend}: kill to the last result: {time.monotonic() - killed:.1f}s")
    for i, result in enumerate(results):
        assert stored_result(result.id, django_backend)["result"] == f"order-{i}"
        assert body_runs(result.id) == 2  # the killed run and the one after it
        wait_for(lambda r=result: last_state(store, r.id) == TaskState.SUCCESS, 10)
    # and the sweeper's log holds decisions only: every pass could ask the backend.
    assert_only_decisions(sweeper)


def test_beats_sweep_entry_recovers_a_killed_workers_task(
    django_orm, store, start_django_worker, start_django_process, django_client_app, tmp_path
):
    # Beat sends the sweep entry of the project's CELERY_BEAT_SCHEDULE; a worker runs it.
    beat = start_django_process(
        "beat", "-l", "INFO", "-s", str(tmp_path / "schedule"), RECOVERY_TEST_BEAT_INTERVAL="1.0"
    )
    doomed = start_django_worker("doomed", concurrency=1)
    survivor = start_django_worker("survivor", concurrency=1)
    result = django_client_app.send_task("shop.tasks.work", args=["by-beat", 0.5, 60.0])
    wait_for(lambda: body_runs(result.id) == 1, 20, what="the body to start")
    (running,) = [w for w in (doomed, survivor) if w.owns(running_node(store, result.id))]
    running.kill()
    killed = time.monotonic()

    wait_for(
        lambda: (stored_result(result.id, "django-db") or {}).get("status") == "SUCCESS",
        KILL_BOUND,
        what="the task's SUCCESS in django-db",
    )
    print(f"\nbeat's entry: kill to the result: {time.monotonic() - killed:.1f}s")
    assert body_runs(result.id) == 2
    assert "celery-recovery-sweep" in beat.log
    # Beat's sweeps kept coming: no worker had to fall back to sweeping itself.
    (alive,) = [w for w in (doomed, survivor) if w is not running]
    assert "this worker sweeps every" not in alive.log


@pytest.mark.parametrize(
    "scheduler",
    ["django_celery_beat.schedulers:DatabaseScheduler", "celery_recovery.beat:Scheduler"],
)
def test_a_sweep_entry_only_in_django_celery_beats_models_starts_the_marker_watch(
    django_orm,
    beat_models,
    store,
    start_django_worker,
    start_django_process,
    django_client_app,
    scheduler,
    tmp_path,
):
    # The default preset's timing: without the watch a death waits for a late heartbeat
    # and the next sweep (5 to 10 s).
    timing = {f"CELERY_RECOVERY_{k.upper()}": str(v) for k, v in DEFAULT.items()}
    # Given the sweep entry as a PeriodicTask only (the project's settings have none),
    every = beat_models.IntervalSchedule.objects.create(
        every=int(DEFAULT["sweep_interval"]), period="seconds"
    )
    beat_models.PeriodicTask.objects.create(
        name="celery-recovery-sweep", task=SWEEP_TASK, interval=every
    )
    # a beat on those models (django-celery-beat's scheduler, or ours reading them),
    beat = start_django_process(
        "beat",
        "-S",
        scheduler,
        "-l",
        "INFO",
        "-s",
        str(tmp_path / "schedule"),
        name="beat",
        CELERY_RECOVERY_BEAT_ENTRIES="django",
        **timing,
    )
    # and a worker running a task, with another beside it,
    doomed = start_django_worker("doomed", concurrency=1, **timing)
    result = django_client_app.send_task("shop.tasks.work", args=["watched", 0.5, 60.0])
    wait_for(lambda: body_runs(result.id) == 1, 20, what="the body to start")
    start_django_worker("survivor", concurrency=1, **timing)
    wait_for(
        lambda: len(store.jobs.list_jobs("worker", JobState.RUNNING)) == 4,
        20,
        what="both workers' jobs",
    )
    wait_for(lambda: store.jobs.list_jobs("beat", JobState.RUNNING), 20, what="beat's job")
    time.sleep(1.5)  # the watch's first looks: it judges only a marker it saw held

    # when the worker is SIGKILLed,
    doomed.kill()
    killed = time.monotonic()

    # then beat's watch finds the death and its sweep sends the task again at once.
    wait_for(
        lambda: any(t["try_number"] == 2 for t in store.tries.history(result.id)),
        30,
        what="try 2",
    )
    recovered_after = time.monotonic() - killed
    assert recovered_after < WATCH_BOUND, (recovered_after, beat.log[-3000:])
    assert "(marker watch)" in beat.log
    wait_for(
        lambda: (stored_result(result.id, "django-db") or {}).get("status") == "SUCCESS",
        20,
        what="the task's SUCCESS in django-db",
    )
    assert body_runs(result.id) == 2


def running_node(store: Any, task_id: str) -> str:
    def node() -> str | None:
        history = store.tries.history(task_id)
        job_id = history[-1].get("job_id") if history else None
        job = store.jobs.get_job(job_id) if job_id else None
        return job["node_name"] if job else None

    return wait_for(node, 15, what=f"{task_id}'s worker in the store")


def test_a_killed_tasks_on_failure_runs_in_the_sweeper_with_django_set_up(
    django_orm, store, start_django_worker, start_django_process, django_client_app
):
    from shop.models import FailureSeen

    # A task that must never run twice (max_retries=0) is killed with its worker:
    sweeper = start_django_process("recovery", "sweep", "--loop", name="sweeper")
    doomed = start_django_worker("doomed", concurrency=1)
    result = django_client_app.send_task("shop.tasks.once", args=["only-once", 30.0])
    wait_for(lambda: body_runs(result.id) == 1, 20, what="the body to start")
    doomed.kill()

    # the sweeper fails it, and runs the task class's on_failure, which writes through
    # Django's ORM: the sweeper imported the project's task modules and set Django up.
    seen = wait_for(
        lambda: FailureSeen.objects.filter(task_id=result.id).first(),
        KILL_BOUND,
        what="on_failure's row",
    )
    assert seen.pid == sweeper.pid
    assert "LostWorkerError" in seen.exception
    stored = wait_for(lambda: stored_result(result.id, "django-db"), 10)
    assert stored["status"] == "FAILURE"
    assert body_runs(result.id) == 1
    assert last_state(store, result.id) == TaskState.FAILED
    assert_only_decisions(sweeper)


def test_a_success_whose_store_write_was_lost_is_reconciled_from_task_result(
    django_orm, store, pg_url, start_django_worker, start_django_process, django_client_app
):
    # The worker reaches the store through a proxy that is cut while the task runs: its
    # success is in django-db's TaskResult, its store write dies with the worker.
    proxy = TcpProxy("127.0.0.1", 5432).start()
    worker = start_django_worker(
        "cut",
        concurrency=1,
        CELERY_RECOVERY_DATABASE_URL=pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}"),
    )
    result = django_client_app.send_task("shop.tasks.work", args=["done-once", 2.0])
    wait_for(lambda: last_state(store, result.id) == TaskState.RUNNING, 20, what="the claim")
    proxy.cut()
    wait_for(
        lambda: (stored_result(result.id, "django-db") or {}).get("status") == "SUCCESS",
        20,
        what="SUCCESS in TaskResult",
    )
    worker.kill()

    sweeper = start_django_process("recovery", "sweep", "--loop", name="sweeper")
    wait_for(
        lambda: last_state(store, result.id) == TaskState.SUCCESS,
        KILL_BOUND,
        what="the try to be reconciled",
    )
    (record,) = store.tries.history(result.id)
    assert "result backend reports SUCCESS" in record["state_reason"]
    assert body_runs(result.id) == 1  # reconciled, not run again
    assert_only_decisions(sweeper)


def test_a_try_task_result_says_a_live_worker_started_is_adopted(
    django_orm, store, django_env, django_client_app
):
    from django_celery_results.backends import DatabaseBackend

    from tests.builders import live_job

    # A try recorded on a dead worker, which TaskResult says a live worker started:
    task_id = f"adopt-{uuid.uuid4().hex}"
    make_zombie(store, task_id, task_name="shop.tasks.work", args=("adopted",))
    live_job(store)
    backend = DatabaseBackend(app=django_client_app)
    backend.store_result(task_id, {"hostname": "w@alive", "pid": 777}, "STARTED")

    # one pass of the project's sweeper (started as a worker is) adopts it, reading django-db.
    swept = subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "recovery", "sweep"],
        cwd=PROJECT,
        env={**os.environ, **django_env, "PYTHONPATH": f"{PROJECT}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert re.search(r"\badopted=1\b", swept.stdout), swept.stdout
    (adopted,) = store.tries.history(task_id)
    assert adopted["job_id"] == "livejob" and adopted["adopted_until"] is not None


def test_the_triggerers_task_success_event_is_stored_in_django_db(
    django_orm, store, start_django_worker, start_django_process, django_client_app
):
    # The trigger class is the project's own (shop.triggers): the triggerer may import it
    # only once it has imported the app's task modules, as a worker does.
    triggerer = start_django_process("recovery", "triggerer", name="triggerer")
    start_django_worker("worker", concurrency=1)
    result = django_client_app.send_task("shop.tasks.wait_for_ready", args=[1.0])

    stored = wait_for(
        lambda: (
            (stored_result(result.id, "django-db") or {}).get("status") == "SUCCESS"
            and stored_result(result.id, "django-db")
        ),
        30,
        what="the trigger's success in TaskResult",
    )
    assert stored["result"]["pid"] == triggerer.pid
    wait_for(lambda: last_state(store, result.id) == TaskState.SUCCESS, 10)
    assert "AppRegistryNotReady" not in triggerer.log and "Traceback" not in triggerer.log


def test_a_sweeper_failing_every_pass_is_noticed_and_the_workers_sweep_instead(
    django_orm, store, store_url, start_django_worker, start_django_process, django_client_app
):
    from click.testing import CliRunner

    from celery_recovery.cli import recovery
    from tests.web.helpers import console_client

    # A sweeper that runs, but whose every probe of the result backend fails (its
    # Django database is wrong), and a worker running a task, killed:
    sweeper = start_django_process(
        "recovery", "sweep", "--loop", name="sweeper", RECOVERY_TEST_DJANGO_DB="no_such_database"
    )
    doomed = start_django_worker("doomed", concurrency=1)
    result = django_client_app.send_task("shop.tasks.work", args=["noticed", 0.5, 60.0])
    wait_for(lambda: body_runs(result.id) == 1, 20, what="the body to start")
    doomed.kill()

    # `jobs check --sweeps` fails, naming the step and the error,
    check_sweeps = ["--database-url", store_url, "jobs", "check", "--sweeps", "--threshold", "3"]

    def check() -> Any:
        run = CliRunner().invoke(recovery, check_sweeps)
        return run if run.exit_code == 1 else None

    failed = wait_for(check, 20, interval=0.5, what="jobs check --sweeps to fail")
    assert "sweeps run" in failed.output and "zombies" in failed.output, failed.output
    assert "no_such_database" in failed.output, failed.output
    # the console says the sweeps fail,
    with console_client(store_url) as client:
        last = client.get("/api/overview").json()["last_sweep"]
    assert last["report"]["failing_steps"] == ["zombies"]
    assert last["clean_age"] is None or last["age"] < last["clean_age"], last
    assert "failing_steps='zombies'" in sweeper.log

    # and a worker started now sweeps in its stead (its fallback), which recovers the task.
    survivor = start_django_worker("survivor", concurrency=1)
    wait_for(
        lambda: (stored_result(result.id, "django-db") or {}).get("status") == "SUCCESS",
        KILL_BOUND,
        what="the task's SUCCESS after the fallback's sweep",
    )
    assert "no sweep has finished cleanly" in survivor.log
    assert body_runs(result.id) == 2
    ok = CliRunner().invoke(recovery, check_sweeps)
    assert ok.exit_code == 0 and ok.output.startswith("OK: a sweep finished cleanly"), ok.output
