"""Canvas primitives survive a whole-worker SIGKILL, and every chord body runs once.

The crash matrix: each case kills a worker (``killpg``) during the header
tasks, recovers on a second worker, then kills that one during the bodies and
recovers on a third.  Every round publishes a chord, a chain, a group and a
chord nested in a chain at once, so one set of workers serves all of them.
Cases: Redis broker with the Redis result backend (native chords); Redis
broker with a database result backend (``celery.chord_unlock``), where the
dead worker's original unlock message comes back after the visibility
timeout; RabbitMQ with the database backend, which requeues it at once.
RabbitMQ with the Redis backend is not run: it adds no path the others miss.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import chain, chord, group
from kombu import Connection

from celery_recovery import TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.deliveries.canvas import claim_name
from celery_recovery.messages.republish import republish
from celery_recovery.recovery import recovery_for_app
from celery_recovery.store import Claim
from tests.apps.canvas_tasks import RUNNING_KEY
from tests.apps.lifecycle import create_app
from tests.conftest import FAST_SETTINGS, lock_settings
from tests.sweeps.helpers import restore_unacked, sweep_until
from tests.workers import wait_for

#: With Redis, a dead worker's reserved messages are published again by the
#: lost-message sweep after QUEUED_TIMEOUT (it runs here), and Redis restores the
#: originals after VISIBILITY: later, so the original unlock message comes back stale.
QUEUED_TIMEOUT = 4.0
VISIBILITY = 8.0
#: RabbitMQ requeues them at once: the lost-message sweep is only a backstop.  (Too
#: short a timeout re-publishes messages the next worker holds prefetched but has
#: not started: both copies run.)
RABBITMQ_QUEUED_TIMEOUT = 15.0
LONG = 1.5  # the phase a round kills: long on a first try only
SHORT = 0.1


# -- the claim itself, on both stores -------------------------------------------------


def test_claim_once_lets_one_holder_publish(store) -> None:
    now = utcnow()
    assert store.claims.claim_once("claim:chord-body:u1", "a", now, 30) is Claim.WON
    assert store.claims.claim_once("claim:chord-body:u1", "b", now, 30) is Claim.HELD
    assert store.claims.complete_claim("claim:chord-body:u1", "a", now)
    assert store.claims.claim_once("claim:chord-body:u1", "b", now, 30) is Claim.DONE

    # A holder that died before completing: its claim expires and is taken over.
    assert store.claims.claim_once("claim:chord-body:u2", "a", now, 1) is Claim.WON
    assert (
        store.claims.claim_once("claim:chord-body:u2", "b", now + timedelta(seconds=2), 30)
        is Claim.WON
    )
    assert not store.claims.complete_claim("claim:chord-body:u2", "a", now)  # no longer its claim

    # A publish that failed gives the claim back at once.
    assert store.claims.claim_once("claim:chord-body:u3", "a", now, 30) is Claim.WON
    store.claims.release_claim("claim:chord-body:u3", "a")
    assert store.claims.claim_once("claim:chord-body:u3", "b", now, 30) is Claim.WON

    # db clean deletes claims once done (or abandoned) before its cutoff, never other leases.
    store.checkins.mark_completed("sweep", now)
    assert store.claims.claim_once("claim:chord-body:u4", "a", now, 0.5) is Claim.WON  # then died
    cutoff = now + timedelta(seconds=1)
    assert store.retention.count_expired("claims", cutoff, now) == 2  # u1 done, u4 abandoned
    assert store.retention.delete_expired_batch("claims", cutoff, now, 10) == 2
    assert store.checkins.last_completed("sweep") == now


def test_claim_names_fit_the_leases_table_whatever_the_task_id() -> None:
    assert claim_name("52ad0d5b-f034-4327-8a76-7f63cb1e4835").endswith("7f63cb1e4835")
    long_a, long_b = claim_name("a" * 100), claim_name("b" * 100)
    assert len(long_a) <= 64 and long_a.startswith("claim:") and long_a != long_b


# -- real workers -----------------------------------------------------------------------


def _counter(broker_urls: tuple[str, str], round_name: str) -> str:
    return f"{broker_urls[1]}#{round_name}"


def _counts(broker_urls: tuple[str, str], round_name: str) -> dict[str, int] | None:
    """Completed runs per body and chain step, once no live process runs any task."""
    client = redis.Redis.from_url(broker_urls[1])
    for run in client.smembers(RUNNING_KEY):
        if Path(f"/proc/{run.decode().rsplit(':', 1)[1]}").exists():
            return None  # still running (a killed run's pid is gone)
    keys = client.keys(f"{round_name}:done:*")
    return {k.decode().rsplit(":", 1)[1]: int(client.get(k)) for k in keys}


def _final_counts(app: Any, broker: str, queue: str, broker_urls, round_name: str) -> dict:
    """Wait until nothing is left to run, then the completed runs."""

    def final() -> dict[str, int] | None:
        return _counts(broker_urls, round_name) if _settled(app, broker, queue) else None

    return sweep_until(app, final, 30, f"{round_name} settled")


def _publish_round(app: Any, counter: str, header: float, body: float) -> dict[str, Any]:
    part, step, chord_body = (app.tasks[f"canvas.{n}"] for n in ("part", "step", "body"))
    return {
        "chord": chord(
            [part.s(1, header), part.s(2, header)], chord_body.s(body, counter, "chord")
        ).apply_async(),
        "chain": chain(
            part.s(10, header), step.s(11, body, counter), step.s(12, SHORT, counter)
        ).apply_async(),
        "group": group(part.s(20, header), part.s(21, header)).apply_async(),
        "nested": chain(
            part.si(30, header),
            chord(
                [part.si(31, header), part.si(32, header)], chord_body.s(body, counter, "nested")
            ),
            step.s(33, SHORT, counter),
        ).apply_async(),
    }


def _all_ready(results: dict[str, Any]) -> bool:
    return all(r.ready() for r in results.values())


def _wait_round(app: Any, results: dict[str, Any], what: str) -> None:
    """Sweep until every canvas of the round finished; on a timeout, say what had not."""
    try:
        sweep_until(app, lambda: _all_ready(results), 60, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_unfinished(app, results)}") from None


def _unfinished(app: Any, results: dict[str, Any]) -> str:
    """The canvases not ready, and every try the store holds as queued or running."""
    lines = [f"{name}: {_state_of(r)}" for name, r in results.items() if not r.ready()]
    store = recovery_for_app(app).store
    for state in (TaskState.QUEUED, TaskState.RUNNING):
        for t in store.tries.list_tries(state=state):
            lines.append(
                f"{t['task_name']}[{t['task_id']}] try {t['try_number']} {t['state']} "
                f"job {t['job_id']}: {t['state_reason']}"
            )
    return "\n".join(lines)


def _state_of(result: Any) -> str:
    """A result's state; a group's is its members' (a GroupResult has none of its own)."""
    members = getattr(result, "results", None)
    if members is None:
        return f"{result.state} ({result.id})"
    return "group of " + ", ".join(_state_of(member) for member in members)


def _check_round(results: dict[str, Any], counts: dict[str, int]) -> None:
    assert results["chord"].get(timeout=5) == [1, 2]
    assert results["chain"].get(timeout=5) == 12
    assert sorted(x for x, _pid in results["group"].get(timeout=5)) == [20, 21]
    assert results["nested"].get(timeout=5) == 33
    assert counts == {"chord": 1, "nested": 1, "step11": 1, "step12": 1, "step33": 1}


def _settled(app: Any, broker: str, queue: str) -> bool:
    """Nothing left to deliver: no try queued or running, nothing held by the broker."""
    store = recovery_for_app(app).store
    if any(store.tries.list_tries(state=s, limit=1) for s in (TaskState.QUEUED, TaskState.RUNNING)):
        return False
    if broker == "redis":
        restore_unacked(app, VISIBILITY)
        client = redis.Redis.from_url(app.conf.broker_url)
        return client.llen(queue) == 0 and client.hlen("unacked") == 0
    with Connection(app.conf.broker_url) as conn:
        return conn.default_channel.queue_declare(queue, passive=True).message_count == 0


def _running(app: Any, names: tuple[str, ...], at_least: int) -> bool:
    store = recovery_for_app(app).store
    running = store.tries.list_tries(state=TaskState.RUNNING)
    return sum(1 for t in running if t["task_name"] in names) >= at_least


@pytest.fixture
def canvas_env(
    request: pytest.FixtureRequest, broker_urls: tuple[str, str], queue: str, tmp_path: Path
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The client app (it runs the sweeps) and how to start the workers."""
    backend, store_kind = request.param
    store_url = request.getfixturevalue("pg_url" if store_kind == "postgresql" else "sqlite_url")
    result_backend = (
        broker_urls[1] if backend == "redis" else f"db+sqlite:///{tmp_path / 'results.sqlite3'}"
    )
    on_redis = broker_urls[0].startswith("redis")
    visibility = VISIBILITY if on_redis else None
    queued_timeout = QUEUED_TIMEOUT if on_redis else RABBITMQ_QUEUED_TIMEOUT
    recovery = {
        "database_url": store_url,
        **lock_settings(broker_urls),
        **FAST_SETTINGS,
        "queued_timeout": queued_timeout,
    }
    app = create_app(broker_urls[0], result_backend, queue, recovery, visibility_timeout=visibility)
    app.backend.get_task_meta("create-the-result-tables-once")
    env = {
        "CELERY_RECOVERY_QUEUED_TIMEOUT": str(queued_timeout),
        "RECOVERY_TEST_BACKEND": result_backend,
        "RECOVERY_TEST_RUNNING": broker_urls[1],
        **({"RECOVERY_TEST_VISIBILITY": str(visibility)} if visibility else {}),
    }
    yield app, {"store_url": store_url, "env": env, "concurrency": 4}
    recovery_for_app(app).close()
    app.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("broker", "canvas_env"),
    [
        pytest.param(
            "redis",
            ("redis", "postgresql"),
            id="redis-broker-redis-backend",
            marks=pytest.mark.compat,
        ),
        pytest.param("redis", ("database", "postgresql"), id="redis-broker-db-backend"),
        pytest.param("rabbitmq", ("database", "sqlite"), id="rabbitmq-db-backend"),
    ],
    indirect=["canvas_env"],
)
def test_canvas_survives_worker_kills(
    broker: str, canvas_env: tuple[Any, dict[str, Any]], broker_urls, queue, start_worker
) -> None:
    app, options = canvas_env
    victim = start_worker(name="w1", **options)

    # Round 1: the worker dies while the header tasks (and first chain steps) run.
    counter = _counter(broker_urls, "header")
    results = _publish_round(app, counter, header=LONG, body=SHORT)
    # Every pool process busy with a long task: none has just started one whose
    # running claim is still in the worker's write buffer.
    wait_for(lambda: _running(app, ("canvas.part",), 4), 20, what="header tasks running")
    victim.kill()
    victim = start_worker(name="w2", **options)
    _wait_round(app, results, "every canvas of round 1 finished")
    _check_round(results, _final_counts(app, broker, queue, broker_urls, "header"))

    # Round 2: the next worker dies while the chord bodies and later chain steps run.
    counter = _counter(broker_urls, "body")
    results = _publish_round(app, counter, header=SHORT, body=LONG)
    long_ones = ("canvas.body", "canvas.step")  # both bodies and the chain's step 11
    wait_for(lambda: _running(app, long_ones, 3), 20, what="chord bodies running")
    victim.kill()
    start_worker(name="w3", **options)
    _wait_round(app, results, "every canvas of round 2 finished")
    _check_round(results, _final_counts(app, broker, queue, broker_urls, "body"))


@pytest.mark.parametrize("broker", ["redis"])
@pytest.mark.parametrize("canvas_env", [("database", "sqlite")], indirect=True)
def test_two_copies_of_one_chord_unlock_publish_the_body_once(
    broker: str, canvas_env: tuple[Any, dict[str, Any]], broker_urls, queue, start_worker
) -> None:
    """Two live copies of the same unlock try (a stale redelivery racing the try a
    sweep sent, neither yet superseded) both see the header ready: one body."""
    app, options = canvas_env
    start_worker(name="w1", **{**options, "concurrency": 2})
    part, chord_body = app.tasks["canvas.part"], app.tasks["canvas.body"]
    counter = _counter(broker_urls, "twice")
    body_id = uuid.uuid4().hex
    result = chord(
        [part.s(1, 1.0), part.s(2, 1.0)], chord_body.s(SHORT, counter, "chord")
    ).apply_async(task_id=body_id)
    store = recovery_for_app(app).store
    unlock = wait_for(
        lambda: next(iter(store.tries.list_tries(task_name="celery.chord_unlock", limit=1)), None),
        10,
        what="the unlock task recorded",
    )
    republish(app, unlock, unlock["try_number"])  # the same try, a second time
    assert result.get(timeout=30) == [1, 2]
    assert _final_counts(app, broker, queue, broker_urls, "twice") == {"chord": 1}
