"""The HA beat: takeover time over many SIGKILLs, and the cost of one tick with many entries.

``takeover``: two ``celery beat -S celery_recovery.beat:Scheduler`` processes
run a 1 s entry on a fresh PostgreSQL store; the leader is SIGKILLed, and two
times are taken from the kill: until the standby holds the lease (polled every
5 ms) and until its first run is in the broker queue.  The killed beat is
started again, and the next kill waits until it is a live standby.  With
``--marker lock`` the beats' process markers are cleared once they run, so the
standby judges the leader by its advisory lock alone, as from another host.

``tick``: one scheduler in this process with N interval entries (none due):
the first tick (taking the lead, registering N rows, reading them back) and the
mean of the following ticks; then one tick in which 100 of them are due (each
claimed, published, and recorded sent).

    python benchmarks/beat.py takeover --kills 30
    python benchmarks/beat.py takeover --kills 5 --preset default
    python benchmarks/beat.py takeover --kills 20 --preset default --marker lock
    python benchmarks/beat.py tick --entries 10000
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

from benchmarks.throughput import BROKER, PG_ADMIN, create_database, drop_database  # noqa: E402

BACKEND = BROKER.rsplit("/", 1)[0] + "/" + str(int(BROKER.rsplit("/", 1)[1]) + 1)
#: The tests' fast timings (lease 1 s), or the presets' (``--preset``).
FAST = {"heartbeat_interval": "0.5", "zombie_threshold": "2", "health_check_threshold": "2",
        "sweep_interval": "1"}  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 3)


def _beat(url: str, queue: str, preset: str | None, log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RECOVERY_TEST_BROKER": BROKER,
        "RECOVERY_TEST_BACKEND": BACKEND,
        "RECOVERY_TEST_QUEUE": queue,
        "RECOVERY_TEST_PLAIN": "0",
        "CELERY_RECOVERY_DATABASE_URL": url,
        "RECOVERY_TEST_BEAT_SCHEDULE": json.dumps(
            {"every-second": {"task": "lifecycle.noop", "every": 1.0}}
        ),
    }
    if preset:
        env["CELERY_RECOVERY_PRESET"] = preset
    else:
        env.update({f"CELERY_RECOVERY_{k.upper()}": v for k, v in FAST.items()})
    command = [sys.executable, "-m", "celery", "-A", "tests.apps.beat_app", "beat", "-l", "INFO"]
    with open(log, "ab") as out:
        return subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def _until(condition, timeout: float, poll: float = 0.005, what: str = ""):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(poll)
    raise SystemExit(f"timed out after {timeout}s waiting for {what}")


def _forget_process_markers(store) -> None:  # type: ignore[no-untyped-def]
    """Leave the beats' advisory locks as their only markers, as a standby on another host
    sees them."""
    from sqlalchemy import update

    from celery_recovery.store.schema import jobs

    with store.transaction() as conn:
        conn.execute(update(jobs).where(jobs.c.job_type == "beat").values(process_marker=None))


def takeover(kills: int, preset: str | None, marker: str = "auto") -> dict:
    import redis

    from celery_recovery.core.timeutils import utcnow
    from celery_recovery.store import Store

    database = create_database()
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{database}"
    queue = f"bench-beat-{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(BROKER)
    store = Store(url)
    logs = Path(f"/tmp/{queue}")
    logs.mkdir()
    beats = [_beat(url, queue, preset, logs / f"b{i}.log") for i in range(2)]
    to_lease: list[float] = []
    to_run: list[float] = []
    threshold = 2.0 if not preset else 30.0

    def holder_pid() -> int | None:
        lease = store.leases.lease("beat-leader")
        if not lease or not lease["holder"] or lease["expires_at"] < utcnow():
            return None
        return int(lease["holder"].split(":", 1)[1].split("@", 1)[0])

    def live_beats() -> set[int]:
        from celery_recovery import JobType

        return {j["pid"] for j in store.jobs.live_jobs(utcnow(), threshold, JobType.BEAT)}

    try:
        for _ in range(kills):
            pids = {b.pid for b in beats}
            _until(
                lambda p=pids: p <= live_beats() and holder_pid() in p, 60, 0.05, "two live beats"
            )
            if marker == "lock":
                _forget_process_markers(store)
            leader = next(b for b in beats if b.pid == holder_pid())
            standby = next(b for b in beats if b is not leader)
            _until(lambda: client.llen(queue) > 0, 30, 0.05, "a first run")
            before = client.llen(queue)
            os.killpg(leader.pid, signal.SIGKILL)
            killed = time.monotonic()
            leader.wait()
            _until(lambda s=standby.pid: holder_pid() == s, 60, what="the standby to lead")
            to_lease.append(time.monotonic() - killed)
            _until(lambda b=before: client.llen(queue) > b, 60, what="the standby's run")
            to_run.append(time.monotonic() - killed)
            beats = [standby, _beat(url, queue, preset, logs / f"b{len(to_run) + 1}.log")]
    finally:
        for beat in beats:
            if beat.poll() is None:
                os.killpg(beat.pid, signal.SIGKILL)
                beat.wait()
        client.delete(queue)
        store.dispose()
        drop_database(database)
    return {
        "timings": preset or "tests (heartbeat 0.5 s, lease 1 s)",
        "marker": "the advisory lock alone" if marker == "lock" else "process marker and lock",
        "kills": kills,
        "to_lease_p50_seconds": percentile(to_lease, 0.5),
        "to_lease_p99_seconds": percentile(to_lease, 0.99),
        "to_lease_max_seconds": round(max(to_lease), 3),
        "to_first_run_p50_seconds": percentile(to_run, 0.5),
        "to_first_run_p99_seconds": percentile(to_run, 0.99),
        "to_first_run_max_seconds": round(max(to_run), 3),
    }


def tick(entries: int) -> dict:
    import redis

    from celery_recovery.core.timeutils import utcnow
    from tests.apps.lifecycle import create_app

    database = create_database()
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{database}"
    queue = f"bench-beat-{uuid.uuid4().hex[:6]}"
    app = create_app(BROKER, BACKEND, queue, {"database_url": url})
    app.conf.beat_schedule = {
        f"entry-{i}": {"task": "lifecycle.noop", "schedule": 3600.0} for i in range(entries)
    }
    from celery_recovery.beat import Scheduler
    from celery_recovery.recovery import recovery_for_app

    try:
        scheduler = Scheduler(app=app)
        started = time.perf_counter()
        scheduler.tick()
        first = time.perf_counter() - started
        quiet = []
        for _ in range(20):
            started = time.perf_counter()
            scheduler.tick()
            quiet.append(time.perf_counter() - started)
        # Make 100 entries due: their last run an hour ago.
        store = recovery_for_app(app).store
        from sqlalchemy import update

        from celery_recovery.store.schema import beat_entries

        names = [f"entry-{i}" for i in range(100)]
        with store.transaction() as conn:
            conn.execute(
                update(beat_entries)
                .where(beat_entries.c.name.in_(names))
                .values(last_run_at=utcnow() - timedelta(hours=1, seconds=1))
            )
        scheduler.ledger.load(scheduler.schedule, gained=False)  # see the rows changed
        scheduler.leadership.refresh(force=True)
        started = time.perf_counter()
        scheduler.tick()
        due = time.perf_counter() - started
        sent = redis.Redis.from_url(BROKER).llen(queue)
        scheduler.close()
    finally:
        recovery_for_app(app).close()
        redis.Redis.from_url(BROKER).delete(queue)
        drop_database(database)
    return {
        "entries": entries,
        "first_tick_seconds": round(first, 3),
        "quiet_tick_mean_ms": round(statistics.mean(quiet) * 1000, 2),
        "tick_with_100_due_seconds": round(due, 3),
        "runs_sent": sent,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("takeover")
    t.add_argument("--kills", type=int, default=30)
    t.add_argument("--preset", choices=["default", "kubernetes", "aggressive"])
    t.add_argument(
        "--marker",
        choices=["auto", "lock"],
        default="auto",
        help="lock: the standby sees the leader's advisory lock alone (as from another host)",
    )
    k = sub.add_parser("tick")
    k.add_argument("--entries", type=int, default=10000)
    args = parser.parse_args()
    result = (
        takeover(args.kills, args.preset, args.marker)
        if args.what == "takeover"
        else tick(args.entries)
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
