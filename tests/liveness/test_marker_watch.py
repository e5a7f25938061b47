"""The marker watch finds a death within about a second under the default preset; a pause, a
cut marker connection and a server restart are not deaths.

Everything runs with the default preset's timings (heartbeat every 5 s, sweep every
5 s, zombie threshold 30 s): without the watch a killed worker's task waits for a
late heartbeat and the next sweep, 5 to 10 s and more.  The sweeper is
``celery-recovery sweep --loop``, as a deployment without beat runs it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from celery_recovery import JobState, TaskState
from celery_recovery.beat_schedules import preset_settings
from celery_recovery.core.errors import StoreError
from celery_recovery.core.timeutils import utcnow
from celery_recovery.store import Store
from celery_recovery.sweeps.fallback import LEASE as FALLBACK_LEASE
from celery_recovery.sweeps.runner import CLEAN_SWEEP, SWEEP_COMPLETION
from tests.conftest import app_env
from tests.liveness.test_markers import admin, forget_process_markers
from tests.services import start_own_postgres
from tests.sweeps.helpers import count, ledger_lines
from tests.workers import ROOT, wait_for

pytestmark = pytest.mark.slow

DEFAULT = preset_settings("default")
DEFAULT_ENV = {f"CELERY_RECOVERY_{k.upper()}": str(v) for k, v in DEFAULT.items()}
#: Kill to the next try started elsewhere: a look (0.5 s), the lock's confirmation (1 s),
#: then a sweep and a worker taking the message, with slack for a loaded machine.  The
#: heartbeat alone needs a heartbeat interval and a sweep interval: up to 10 s.  (Measured
#: here: 0.6-0.8 s by the process marker, 1.4 s by the lock.)
WATCH_BOUND = 3.0
#: Seconds a worker is SIGSTOPped: long for a pause, within the default zombie threshold.
PAUSE = 20


@pytest.fixture
def start_sweeper(broker_urls, queue, tmp_path):
    """``celery-recovery sweep --loop`` with the default preset; stopped at teardown."""
    procs: list[subprocess.Popen] = []

    def start(store_url: str, timing: dict[str, str] = DEFAULT_ENV) -> subprocess.Popen:
        """Started, and one sweep done (its watch runs from before that sweep)."""
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            **app_env(store_url, broker_urls, queue),
            **timing,
        }
        command = [sys.executable, "-m", "celery_recovery.cli", "--app", "tests.apps.lifecycle"]
        with open(tmp_path / f"sweeper{len(procs)}.log", "ab") as log:
            procs.append(
                subprocess.Popen(
                    [*command, "sweep", "--loop"],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        store = Store(store_url)
        before = store.checkins.last_completed(SWEEP_COMPLETION)
        wait_for(
            lambda: store.checkins.last_completed(SWEEP_COMPLETION) not in (None, before),
            30,
            what="the sweeper's first sweep",
        )
        store.dispose()
        return procs[-1]

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def worker_jobs(store: Store, count_: int) -> list[dict]:
    return wait_for(
        lambda: (
            len(store.jobs.list_jobs("worker", JobState.RUNNING)) == count_
            and store.jobs.list_jobs("worker", JobState.RUNNING)
        ),
        15,
        what=f"{count_} running worker jobs",
    )


def held_locks(store: Store) -> set[int]:
    """The held marker keys; none while the store's connections are still being replaced."""
    try:
        return store.liveness.held_marker_locks()
    except StoreError:
        return set()


def started(store: Store, task_id: str, try_number: int) -> bool:
    return any(
        t["try_number"] == try_number and t["state"] in (TaskState.RUNNING, TaskState.SUCCESS)
        for t in store.tries.history(task_id)
    )


def kill_and_see_one_rerun(doomed, store: Store, result, ledger) -> None:
    """SIGKILL ``doomed``, running try 1 of ``result`` (a 60 s ``ledger_sleep``): try 2 starts
    elsewhere within :data:`WATCH_BOUND`, and the task runs exactly once more."""
    doomed.kill()
    killed = time.monotonic()
    wait_for(lambda: started(store, result.id, 2), 30, what="try 2 to start")
    recovered_after = time.monotonic() - killed

    assert result.get(timeout=30) == 60  # what the task returns: its first try's length
    assert recovered_after < WATCH_BOUND, recovered_after
    wait_for(
        lambda: (
            [(t["try_number"], t["state"]) for t in store.tries.history(result.id)]
            == [(1, TaskState.UP_FOR_RETRY), (2, TaskState.SUCCESS)]
        ),
        10,
        what="try 1 retried and try 2 succeeded, on record",
    )
    assert count(ledger, "start") == 2 and count(ledger, "done try=2") == 1, ledger_lines(ledger)


@pytest.mark.parametrize("preset", ["default", "aggressive"])
@pytest.mark.parametrize(
    "store_url, marker",
    [("sqlite", "process"), ("postgresql", "lock")],
    indirect=["store_url"],
)
def test_a_killed_worker_is_found_by_the_watch_within_a_second(
    store_url, marker, preset, store, make_client_app, start_worker, start_sweeper, tmp_path
):
    # Under the aggressive preset's 1 s sweeps and 2 s threshold the sweep's own steps
    # judge the same death at about the same moment as the watch: still one re-run.
    timing = preset_settings(preset)
    env = {f"CELERY_RECOVERY_{k.upper()}": str(v) for k, v in timing.items()}
    client_app = make_client_app(store_url, **timing)
    doomed = start_worker(name="doomed", concurrency=1, env=env)
    ledger = tmp_path / "ledger"
    result = client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 60, 0.5))
    wait_for(lambda: started(store, result.id, 1), 20, what="try 1 to run")
    if marker == "lock":
        # As a sweeper on another host sees them: the advisory lock alone.
        forget_process_markers(store, [job["id"] for job in worker_jobs(store, 2)])
    start_worker(name="survivor", concurrency=1, env=env)
    start_sweeper(store_url, env)
    worker_jobs(store, 4)
    time.sleep(1.5)  # the watch's first looks: it judges only a marker it saw held

    kill_and_see_one_rerun(doomed, store, result, ledger)


@pytest.mark.parametrize(
    "store_url, marker, preset",
    [
        ("sqlite", "process", "default"),
        ("postgresql", "lock", "default"),
        ("postgresql", "lock", "aggressive"),
    ],
    indirect=["store_url"],
)
def test_a_workers_fallback_watches_the_markers_while_it_sweeps(
    store_url, marker, preset, store, make_client_app, start_worker, tmp_path
):
    # No beat and no sweeper: the workers' fallback sweeps, and its watch finds the death.
    timing = preset_settings(preset)
    env = {f"CELERY_RECOVERY_{k.upper()}": str(v) for k, v in timing.items()}
    client_app = make_client_app(store_url, **timing)
    # The fallback's lease is held for the test until the survivor runs, then handed to
    # it: the doomed worker, started first, would otherwise be the first to ask for it.
    placeholder = "the test"
    token = store.leases.acquire_lease(FALLBACK_LEASE, placeholder, utcnow(), ttl=120)
    assert token is not None
    doomed = start_worker(name="doomed", concurrency=1, env=env)
    ledger = tmp_path / "ledger"
    result = client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 60, 0.5))
    wait_for(lambda: started(store, result.id, 1), 20, what="try 1 to run")
    survivor = start_worker(name="survivor", concurrency=1, env=env)
    jobs = worker_jobs(store, 4)
    if marker == "lock":
        forget_process_markers(store, [job["id"] for job in jobs])
    # To the survivor's pool process, which sweeps for a prefork worker.
    (pool,) = [
        j for j in jobs if j["node_name"].startswith(f"{survivor.node}@") and j["parent_pid"]
    ]
    holder = f"{pool['node_name']}:{pool['pid']}"
    assert store.leases.take_over_lease(
        FALLBACK_LEASE, holder, placeholder, token, utcnow(), ttl=120
    )
    wait_for(
        lambda: store.checkins.last_completed(CLEAN_SWEEP) is not None,
        4 * timing["sweep_interval"] + 10,
        what="the survivor's fallback to sweep",
    )
    assert store.leases.lease(FALLBACK_LEASE)["holder"] == holder
    time.sleep(1.5)  # the watch's first looks: it judges only a marker it saw held

    kill_and_see_one_rerun(doomed, store, result, ledger)
    assert "(marker watch)" in survivor.log


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_20s_sigstop_under_the_default_preset_runs_the_task_once(
    store_url, store, make_client_app, start_worker, start_sweeper, tmp_path
):
    client_app = make_client_app(store_url, **DEFAULT)
    workers = [start_worker(name=f"w{i}", concurrency=1, env=DEFAULT_ENV) for i in range(2)]
    start_sweeper(store_url)
    time.sleep(1.5)  # the watch has seen every marker
    ledger = tmp_path / "ledger"
    # Running through the whole pause, and past it.
    result = client_app.send_task("lifecycle.ledger_sleep", (str(ledger), PAUSE + 4))
    wait_for(lambda: started(store, result.id, 1), 20, what="try 1 to run")
    running = next(t for t in store.tries.history(result.id) if t["try_number"] == 1)
    node = store.jobs.get_job(running["job_id"])["node_name"]
    paused = next(w for w in workers if node.startswith(f"{w.node}@"))

    # Its whole process group: the main process and the pool process running the task.
    os.killpg(paused.proc.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + PAUSE
        while time.monotonic() < deadline:
            assert store.jobs.get_job(running["job_id"])["state"] == JobState.RUNNING
            assert not ledger_lines(ledger)[1:], "the task ran again, or ended, while paused"
            time.sleep(0.5)
    finally:
        os.killpg(paused.proc.pid, signal.SIGCONT)

    assert result.get(timeout=30) == PAUSE + 4
    wait_for(
        lambda: (
            [(t["try_number"], t["state"]) for t in store.tries.history(result.id)]
            == [(1, TaskState.SUCCESS)]
        ),
        10,
        what="the one try succeeded, on record",
    )
    assert count(ledger, "start") == 1, ledger_lines(ledger)
    assert {j["state"] for j in store.jobs.list_jobs("worker")} == {JobState.RUNNING}


def test_a_postgresql_restart_declares_no_live_worker_dead(
    make_client_app, start_worker, start_sweeper, tmp_path
):
    url, restart, stop = start_own_postgres()
    store = Store(url)
    try:
        client_app = make_client_app(url, **DEFAULT)
        start_worker(store_url=url, name="w1", concurrency=1, env=DEFAULT_ENV)
        start_worker(store_url=url, name="w2", concurrency=1, env=DEFAULT_ENV)
        ledger = tmp_path / "ledger"
        results = [
            client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 8)) for _ in range(2)
        ]
        wait_for(lambda: all(started(store, r.id, 1) for r in results), 20, what="both to run")
        jobs = worker_jobs(store, 4)
        # Only the locks can speak (a sweeper on another host): a restart drops them all.
        forget_process_markers(store, [job["id"] for job in jobs])
        keys = {job["marker_lock"] for job in jobs}
        assert None not in keys and len(keys) == 2, jobs
        start_sweeper(url)
        time.sleep(2)  # the watch has seen every lock held

        restart()
        wait_for(
            lambda: keys <= held_locks(store),
            15,
            what="every marker lock taken again after the restart",
        )
        assert [r.get(timeout=30) for r in results] == [8, 8]
        time.sleep(2)  # a watch that misjudged would have failed a job by now
        assert {j["state"] for j in store.jobs.list_jobs("worker")} == {JobState.RUNNING}
        for r in results:
            assert [t["try_number"] for t in store.tries.history(r.id)] == [1]
        assert count(ledger, "start") == 2, ledger_lines(ledger)
    finally:
        store.dispose()
        stop()


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_cut_marker_connections_are_not_deaths_for_the_watch(
    store_url, store, make_client_app, start_worker, start_sweeper, tmp_path
):
    make_client_app(store_url, **DEFAULT)
    worker = start_worker(name="cut", concurrency=2, env=DEFAULT_ENV)
    jobs = worker_jobs(store, 3)
    forget_process_markers(store, [job["id"] for job in jobs])
    start_sweeper(store_url)
    time.sleep(1.5)
    label = f"celery-recovery marker worker {worker.node}@%"
    with admin() as conn:
        # Cut again and again for 5 s: each time the lock is back well within a second.
        deadline, cuts = time.monotonic() + 5, 0
        while time.monotonic() < deadline:
            cuts += len(
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name LIKE %s",
                    (label,),
                ).fetchall()
            )
            time.sleep(0.4)
    assert cuts >= 5, cuts
    time.sleep(2)
    assert {j["state"] for j in store.jobs.list_jobs("worker")} == {JobState.RUNNING}
