"""``inspect``: each view answers its question from a real store holding live and dead jobs."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest

from celery_recovery.core.timeutils import utcnow
from celery_recovery.locks.redis_lock import IdempotencyLocks
from tests.builders import add_history, add_job, add_running, add_trigger, add_try
from tests.cli.helpers import run, run_json
from tests.services import BROKER_DB

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture
def world(store):
    """Given a live and a dead worker, a live and a dead triggerer, and tries of each kind."""
    ids = {
        "live_worker": add_job(store, "worker", heartbeat_age=1, hostname="live-host"),
        "dead_worker": add_job(store, "worker", heartbeat_age=120, hostname="dead-host"),
        "ended_worker": add_job(store, "worker", state="success", ended_age=10),
        "live_triggerer": add_job(store, "triggerer", heartbeat_age=1, hostname="trig-live"),
        "dead_triggerer": add_job(store, "triggerer", heartbeat_age=300, hostname="trig-dead"),
        "beat": add_job(store, "beat", heartbeat_age=2, hostname="beat-host"),
    }
    ids["healthy_try"] = add_try(store, "running", ids["live_worker"])
    ids["zombie_try"] = add_try(store, "running", ids["dead_worker"])
    ids["failed_try"] = add_try(store, "failed", ended_age=5, task_name="shop.refund")
    ids["served_deferred"] = add_try(store, "deferred")
    ids["orphan_deferred"] = add_try(store, "deferred")
    ids["unassigned_deferred"] = add_try(store, "deferred")
    ids["served_trigger"] = add_trigger(store, ids["served_deferred"], ids["live_triggerer"], "a")
    ids["orphan_trigger"] = add_trigger(store, ids["orphan_deferred"], ids["dead_triggerer"], "b")
    ids["unassigned_trigger"] = add_trigger(store, ids["unassigned_deferred"], None, "a")
    return ids


def test_zombies_are_the_running_tries_of_dead_workers_with_heartbeat_age(store, world):
    rows = run_json(store.url, "inspect", "zombies")
    assert [r["task_id"] for r in rows] == [world["zombie_try"]]
    assert rows[0]["worker"] == "celery@dead-host", "Celery's node name, as in inspect tasks"
    assert rows[0]["status"] == "zombie" and rows[0]["judged_in"] is None
    assert 119 < rows[0]["heartbeat_age"] < 200
    table = run(store.url, "inspect", "zombies").output
    assert world["zombie_try"] in table and "celery@dead-host" in table
    assert world["healthy_try"] not in table


def test_zombies_right_after_a_kill_name_the_silent_worker_and_when_it_is_judged(store):
    # Default settings: heartbeat 5 s, zombie threshold 30 s; the worker was killed 12 s ago.
    silent = add_job(store, "worker", heartbeat_age=12, hostname="killed-host")
    task_id = add_try(store, "running", silent)
    add_try(store, "running", add_job(store, "worker", heartbeat_age=1))
    (row,) = run_json(store.url, "inspect", "zombies")
    assert (row["task_id"], row["status"]) == (task_id, "silent")
    assert 17 < row["judged_in"] <= 18
    table = run(store.url, "inspect", "zombies").output
    assert "no zombies" not in table and "celery@killed-host" in table
    assert "1 running try has a silent worker, not yet a zombie" in table
    assert "recovery_zombie_threshold=30s, the first in 1" in table


def test_tasks_and_zombies_name_the_worker_alike(store):
    dead = add_job(store, "worker", heartbeat_age=120, hostname="pod-3")
    # A worker records Celery's request.hostname, which is the node name.
    task_id = add_try(store, "running", dead, worker_hostname="celery@pod-3")
    (zombie,) = run_json(store.url, "inspect", "zombies")
    (task,) = run_json(store.url, "inspect", "tasks")
    assert zombie["task_id"] == task["task_id"] == task_id
    assert zombie["worker"] == task["worker"] == "celery@pod-3"
    assert "celery@pod-3" in run(store.url, "inspect", "tasks").output


def test_orphans_are_triggers_without_a_live_triggerer_and_unserved_queues_flagged(store, world):
    rows = {r["trigger_id"]: r for r in run_json(store.url, "inspect", "orphans")}
    assert set(rows) == {world["orphan_trigger"], world["unassigned_trigger"]}
    # Queue a has a trigger held by the live triggerer; queue b has none.
    assert rows[world["orphan_trigger"]]["queue_without_live_triggerer"] is True
    assert rows[world["unassigned_trigger"]]["queue_without_live_triggerer"] is False
    assert rows[world["orphan_trigger"]]["triggerer_heartbeat_age"] > 299
    table = run(store.url, "inspect", "orphans").output
    assert "(unassigned)" in table
    assert "queue b: triggers waiting, no live triggerer holds any of them" in table
    assert "queue a:" not in table


def test_orphans_say_when_no_triggerer_is_live_at_all(store):
    add_trigger(store, add_try(store, "deferred"), None, "solo")
    table = run(store.url, "inspect", "orphans").output
    assert "queue solo: triggers waiting, no triggerer is live" in table


def test_deferred_shows_trigger_queue_and_whether_its_triggerer_lives(store, world):
    rows = {r["task_id"]: r for r in run_json(store.url, "inspect", "deferred")}
    assert set(rows) == {
        world["served_deferred"],
        world["orphan_deferred"],
        world["unassigned_deferred"],
    }
    served = rows[world["served_deferred"]]
    assert served["trigger_id"] == world["served_trigger"] and served["queue"] == "a"
    assert served["triggerer_id"] == world["live_triggerer"] and served["triggerer_alive"] is True
    assert rows[world["orphan_deferred"]]["triggerer_alive"] is False
    assert rows[world["unassigned_deferred"]]["triggerer_id"] is None


def test_jobs_say_which_processes_are_alive(store, world):
    rows = {r["id"]: r for r in run_json(store.url, "inspect", "jobs")}
    alive = {job_id for job_id, r in rows.items() if r["alive"]}
    assert alive == {world["live_worker"], world["live_triggerer"], world["beat"]}
    assert world["ended_worker"] not in rows  # only running jobs unless --all
    assert rows[world["dead_worker"]]["heartbeat_age"] >= 120
    assert rows[world["dead_worker"]]["latest_heartbeat"].endswith("+00:00")  # ISO 8601
    everything = run_json(store.url, "inspect", "jobs", "--all")
    assert world["ended_worker"] in {r["id"] for r in everything}
    workers = run_json(store.url, "inspect", "jobs", "--job-type", "worker")
    assert {r["job_type"] for r in workers} == {"worker"}


def test_jobs_table_is_aligned_and_coloured_only_on_a_terminal(store, world):
    plain = run(store.url, "inspect", "jobs").output.splitlines()
    assert "\x1b[" not in "\n".join(plain)
    header = plain[0]
    # Every row's ALIVE cell starts in the header's ALIVE column.
    column = header.index("ALIVE")
    assert {line[column:].split()[0] for line in plain[1:]} == {"yes", "no"}
    coloured = run(store.url, "inspect", "jobs", color=True).output
    assert "\x1b[32myes" in coloured and "\x1b[31mno" in coloured
    # The same table but for colour; heartbeat ages move on between the two runs.
    ages = re.compile(r"\b\d+\.\ds\b")
    stripped = [ages.sub("age", ANSI.sub("", line)) for line in coloured.splitlines()]
    assert stripped == [ages.sub("age", line) for line in plain]


def test_tasks_filter_by_state_and_name_with_a_limit(store, world):
    failed = run_json(store.url, "inspect", "tasks", "--state", "failed")
    assert [r["task_id"] for r in failed] == [world["failed_try"]]
    assert "args" not in failed[0]  # task arguments are not shown
    named = run_json(store.url, "inspect", "tasks", "--task-name", "shop.refund")
    assert [r["task_id"] for r in named] == [world["failed_try"]]
    assert len(run_json(store.url, "inspect", "tasks", "--limit", "2")) == 2
    result = run(store.url, "inspect", "tasks", "--state", "bogus")
    assert result.exit_code == 2 and "'bogus' is not one of" in result.output


def test_empty_views_say_so(store):
    assert "no zombies" in run(store.url, "inspect", "zombies").output
    assert run_json(store.url, "inspect", "orphans") == []


def test_locks_show_holder_token_and_lease(redis_service, monkeypatch, sqlite_url):
    url = f"{redis_service}/{BROKER_DB}"
    locks = IdempotencyLocks.from_url(url)
    locks.client.flushdb()
    held = locks.acquire("charge:7", "worker-1:123", ttl=60)
    locks.acquire("charge:8", "worker-2:456", ttl=60)
    done = locks.acquire("charge:9", "worker-3:789", ttl=60)
    locks.release("charge:9", done.value, '{"ok": true}', 60)  # finished: no longer held
    monkeypatch.setenv("CELERY_RECOVERY_REDIS_URL", url)
    rows = run_json(sqlite_url, "inspect", "locks")
    assert [r["key"] for r in rows] == ["charge:7", "charge:8"]
    assert rows[0]["holder"] == "worker-1:123" and rows[0]["token"] == held.token
    assert 50 < rows[0]["ttl"] <= 60 and rows[0]["expires_at"]
    table = run(sqlite_url, "inspect", "locks").output
    assert "charge:7" in table and "worker-2:456" in table


def test_locks_with_unreachable_redis_is_one_line(monkeypatch, sqlite_url):
    monkeypatch.setenv("CELERY_RECOVERY_REDIS_URL", "redis://:secret@127.0.0.1:1/0")
    result = run(sqlite_url, "inspect", "locks")
    assert result.exit_code == 2
    assert "cannot read locks" in result.output and "secret" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_inspect_on_unreachable_database_is_one_line():
    result = run("postgresql://u:pw@127.0.0.1:1/x", "inspect", "jobs")
    assert result.exit_code == 2 and "unavailable" in result.output
    assert ":pw@" not in result.output and len(result.output.strip().splitlines()) == 1


def test_json_is_a_list_of_objects_for_every_view(store, world):
    for view in ("zombies", "orphans", "deferred", "jobs", "tasks"):
        output = run(store.url, "inspect", view, "--json").output
        rows = json.loads(output)
        assert isinstance(rows, list) and all(isinstance(r, dict) for r in rows), view


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_inspect_zombies_right_after_a_real_kill(store, start_worker, client_app, monkeypatch):
    from tests.conftest import FAST_SETTINGS
    from tests.workers import wait_for

    for name, value in FAST_SETTINGS.items():
        monkeypatch.setenv(f"CELERY_RECOVERY_{name.upper()}", str(value))
    worker = start_worker(concurrency=1)
    result = client_app.send_task("lifecycle.sleep_for", (30,))
    wait_for(
        lambda: (
            store.tries.history(result.id)[0]["state"] == "running"
            if store.tries.history(result.id)
            else 0
        )
    )
    worker.kill()

    def says_silent():
        out = run(store.url, "inspect", "zombies").output
        return out if "silent worker, not yet a zombie" in out else None

    out = wait_for(says_silent, 5, interval=0.1, what="the killed worker's try to show as silent")
    assert result.id in out and "no zombies" not in out
    rows = wait_for(
        lambda: [r for r in run_json(store.url, "inspect", "zombies") if r["status"] == "zombie"],
        10,
        interval=0.2,
        what="the silent try to become a zombie at the threshold",
    )
    assert rows[0]["task_id"] == result.id and worker.owns(rows[0]["worker"])


def test_overdue_lists_running_tries_far_past_their_task_usual_duration(store):
    # Given a task whose runs take 100 s: one try running for 400 s, one for 200 s
    now = utcnow()
    add_history(store, "shop.import", now, [100.0] * 20)
    late = add_running(store, "shop.import", now - timedelta(seconds=400))
    add_running(store, "shop.import", now - timedelta(seconds=200))

    [row] = run_json(store.url, "inspect", "overdue")

    assert (row["task_id"], row["task_name"], row["worker"]) == (
        late,
        "shop.import",
        "celery@host-a",
    )
    assert (row["bound"], row["usual"], row["runs"]) == (300.0, 100.0, 20)
    assert row["age"] >= 400
    table = ANSI.sub("", run(store.url, "inspect", "overdue").output)
    assert "OVERDUE AFTER" in table.splitlines()[0]
    assert late in table and "300.0s" in table
    # ... and `inspect tasks` marks it
    tries = {r["task_id"]: r["overdue"] for r in run_json(store.url, "inspect", "tasks")}
    assert tries.pop(late) is True and set(tries.values()) == {False}
    lines = ANSI.sub("", run(store.url, "inspect", "tasks").output).splitlines()
    assert [line for line in lines if " overdue " in line] == [
        line for line in lines if line.startswith(late)
    ]


def test_overdue_is_empty_for_a_task_with_too_little_history(store):
    now = utcnow()
    add_history(store, "shop.import", now, [1.0] * 5)
    add_running(store, "shop.import", now - timedelta(hours=5))

    assert run_json(store.url, "inspect", "overdue") == []
    assert "no overdue tries" in run(store.url, "inspect", "overdue").output
