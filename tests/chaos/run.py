"""The chaos run: load, SIGKILLs, then proof that nothing was lost or done twice.

As a test: ``tests/chaos/test_chaos.py`` (marked ``slow``, small size).
Standalone, printing a JSON summary (exit status 1 when a check fails)::

    RECOVERY_TEST_REDIS_DB=7 python -m tests.chaos.run --tasks 1000 --seconds 120

It starts 3 prefork workers (concurrency 2) on one queue, beat running the
sweep with the ``aggressive`` preset and a triggerer, all on a fresh
PostgreSQL store, then publishes the tasks of :mod:`tests.chaos.tasks`
(a tenth deferring, a third of the rest ``@recoverable``, the others plain,
5% of those failing on purpose) while a killer SIGKILLs a random worker's
process group every 3-6 s and starts a replacement, and SIGKILLs and restarts
beat once and the triggerer once.  See ``docs/chaos.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from celery import Celery

from celery_recovery.recovery import recovery_for_app
from tests.chaos.tasks import MAX_RETRIES, create_chaos_app, create_ledger, ledger_dsn
from tests.workers import ROOT, WorkerProcess

FINAL_STATES = {"success", "failed", "revoked"}
READY_STATES = {"SUCCESS", "FAILURE", "REVOKED"}


@dataclass
class ChaosConfig:
    """The size of a run. Durations are seconds."""

    tasks: int = 120
    #: How long the killer runs.
    seconds: float = 45.0
    workers: int = 3
    concurrency: int = 2
    kill_every: tuple[float, float] = (3.0, 6.0)
    max_duration: float = 3.0
    #: Share of plain tasks that fail on every try (failed by the worker itself).
    failing_share: float = 0.05
    #: How long to wait for every task to finish once publishing and killing ended.
    quiesce_timeout: float = 240.0
    seed: int | None = None


@dataclass
class ChaosTarget:
    """Where a run happens: store, broker, result backend, queue, log directory."""

    store_url: str
    broker: str
    backend: str
    queue: str
    workdir: Path
    #: Acknowledge messages after the task (RabbitMQ then requeues a killed worker's).
    acks_late: bool = False

    @property
    def lock_redis(self) -> str:
        """The idempotency locks' Redis: the broker's, else the result backend's."""
        return self.broker if self.broker.startswith("redis") else self.backend


@dataclass
class Planned:
    task_id: str
    kind: str
    key: str
    published_at: float = 0.0


class Cluster:
    """The worker, beat and triggerer subprocesses, each in its own session."""

    def __init__(self, target: ChaosTarget, config: ChaosConfig) -> None:
        self.target = target
        self.config = config
        self.env = {
            "RECOVERY_TEST_BROKER": target.broker,
            "RECOVERY_TEST_BACKEND": target.backend,
            "RECOVERY_TEST_QUEUE": target.queue,
            "CELERY_RECOVERY_DATABASE_URL": target.store_url,
            "CELERY_RECOVERY_PRESET": "aggressive",
            "CELERY_RECOVERY_REDIS_URL": target.lock_redis,
            "RECOVERY_TEST_ACKS_LATE": "1" if target.acks_late else "0",
            "CHAOS_LEDGER_DSN": ledger_dsn(target.store_url),
        }
        self.workers: list[WorkerProcess] = []
        self.started = 0
        self.beat: subprocess.Popen[bytes] | None = None
        self.triggerer: subprocess.Popen[bytes] | None = None
        self._others: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []

    def start_worker(self, wait: bool = False) -> WorkerProcess:
        self.started += 1
        name = f"w{self.started}"
        worker = WorkerProcess(
            "tests.chaos.app",
            self.env,
            self.target.workdir / f"{name}.log",
            concurrency=self.config.concurrency,
            name=name,
            queue=self.target.queue,
        )
        self.workers.append(worker)
        return worker.wait_ready(60) if wait else worker

    def _spawn(self, log_name: str, args: list[str], extra: dict[str, str]) -> subprocess.Popen:
        log = open(self.target.workdir / log_name, "wb")  # noqa: SIM115 - closed in stop_all()
        self._logs.append(log)
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.chaos.app", *args],
            cwd=ROOT,
            env={**os.environ, **self.env, **extra, "PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._others.append(proc)
        return proc

    def start_beat(self) -> None:
        n = sum(1 for p in self.target.workdir.glob("beat-*.log"))
        schedule = str(self.target.workdir / f"beat-schedule-{n}")
        self.beat = self._spawn(
            f"beat-{n}.log", ["beat", "-l", "INFO", "-s", schedule], {"CHAOS_BEAT": "1"}
        )

    def start_triggerer(self) -> None:
        n = sum(1 for p in self.target.workdir.glob("triggerer-*.log"))
        self.triggerer = self._spawn(f"triggerer-{n}.log", ["recovery", "triggerer"], {})

    def live_workers(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.proc.poll() is None]

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.kill()
        for proc in self._others:
            self.kill(proc)
        for log in self._logs:
            log.close()


class Killer(threading.Thread):
    """SIGKILLs a random worker every few seconds (starting a replacement), and beat and
    the triggerer once each, for ``config.seconds``."""

    def __init__(self, cluster: Cluster, config: ChaosConfig, rng: random.Random) -> None:
        super().__init__(name="chaos-killer", daemon=True)
        self.cluster, self.config, self.rng = cluster, config, rng
        self.stop = threading.Event()
        #: Worker node name (``w3``) -> when its process group was killed (epoch seconds).
        self.killed_at: dict[str, float] = {}
        #: Worker main process id -> when its process group was killed (epoch seconds).
        self.killed_pids: dict[int, float] = {}
        self.kills: Counter[str] = Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by run_chaos, never lost in a thread
            self.error = exc

    def _run(self) -> None:
        start = time.monotonic()
        beat_due, triggerer_due = self.config.seconds / 3, self.config.seconds * 2 / 3
        while not self.stop.wait(self.rng.uniform(*self.config.kill_every)):
            elapsed = time.monotonic() - start
            if elapsed > self.config.seconds:
                return
            victim = self.rng.choice(self.cluster.live_workers())
            self.killed_at[victim.node] = self.killed_pids[victim.proc.pid] = time.time()
            victim.kill()
            self.kills["workers"] += 1
            self.cluster.start_worker()
            if beat_due is not None and elapsed >= beat_due and self.cluster.beat:
                self.cluster.kill(self.cluster.beat)
                self.kills["beat"] += 1
                self.cluster.start_beat()
                beat_due = None
            if triggerer_due is not None and elapsed >= triggerer_due and self.cluster.triggerer:
                self.cluster.kill(self.cluster.triggerer)
                self.kills["triggerer"] += 1
                self.cluster.start_triggerer()
                triggerer_due = None


def plan(config: ChaosConfig, rng: random.Random, run_id: str) -> list[tuple[Planned, dict]]:
    """The tasks to publish: (what they are, their kwargs)."""
    planned = []
    for i in range(config.tasks):
        key = f"{run_id}-{i}"
        seconds = round(rng.uniform(0, config.max_duration), 3)
        if i % 10 == 0:
            work = round(seconds * rng.random(), 3)
            kind, kwargs = "deferring", {"key": key, "seconds": work, "wait": seconds - work}
        elif i % 3 == 0:
            kind, kwargs = "idempotent", {"key": key, "seconds": seconds}
        else:
            fail = rng.random() < config.failing_share
            kind, kwargs = "plain", {"key": key, "seconds": seconds, "fail": fail}
        planned.append((Planned(str(uuid.uuid4()), kind, key), kwargs))
    rng.shuffle(planned)
    return planned


def publish(app: Celery, planned: list[tuple[Planned, dict]], slots: int) -> None:
    """Publish every task, keeping at most ``2 * slots`` recently published ones unstarted,
    so that no message waits in the queue as long as ``recovery_queued_timeout`` (which
    would make the lost-message sweep publish it again: correct, but not this test)."""
    unstarted: list[Planned] = []
    for item, kwargs in planned:
        while True:
            now = time.monotonic()
            unstarted = [
                p
                for p in unstarted
                if now - p.published_at < 15 and app.AsyncResult(p.task_id).state == "PENDING"
            ]
            if len(unstarted) < 2 * slots:
                break
            time.sleep(0.1)
        app.send_task(f"chaos.{item.kind}", kwargs=kwargs, task_id=item.task_id)
        item.published_at = time.monotonic()
        unstarted.append(item)


@contextmanager
def _connect(store_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(ledger_dsn(store_url), autocommit=True) as conn:
        yield conn


def _unfinished(app: Celery, store_url: str, ids: list[str], done: set[str]) -> list[str]:
    """Tasks not yet final: not ready in the backend, or their store's last try not final,
    or a failure callback still waiting in the outbox."""
    with _connect(store_url) as conn:
        last = dict(
            conn.execute(
                "SELECT DISTINCT ON (task_id) task_id, state FROM task_records"
                " WHERE task_id = ANY(%s) ORDER BY task_id, try_number DESC",
                (ids,),
            ).fetchall()
        )
        outbox = {r[0] for r in conn.execute("SELECT task_id FROM callbacks").fetchall()}
    left = []
    for task_id in ids:
        if task_id not in done and app.AsyncResult(task_id).state in READY_STATES:
            done.add(task_id)
        if task_id not in done or last.get(task_id) not in FINAL_STATES or task_id in outbox:
            left.append(task_id)
    return left


def wait_quiescent(app: Celery, target: ChaosTarget, ids: list[str], timeout: float) -> list[str]:
    """Poll until every task is final; the ones still unfinished at the deadline."""
    deadline = time.monotonic() + timeout
    done: set[str] = set()
    while True:
        left = _unfinished(app, target.store_url, ids, done)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


def _log_problems(workdir: Path) -> list[str]:
    """Sweep failures and errors in every log: 'sweep failed on' lines, ERROR lines of
    celery-recovery, and tracebacks whose innermost frame is in celery_recovery (a task's
    own exception passes through the package's ``__call__`` wrapper: not a problem)."""
    problems = []
    for path in sorted(workdir.glob("*.log")):
        lines = path.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if "sweep failed on" in line or ("ERROR" in line and "celery-recovery:" in line):
                problems.append(f"{path.name}: {line.strip()[:300]}")
            elif line.startswith("Traceback (most recent call last):"):
                frames = []
                for frame in lines[i + 1 :]:
                    if not frame.startswith(" "):
                        break
                    if frame.lstrip().startswith('File "'):
                        frames.append(frame)
                if frames and "/celery_recovery/" in frames[-1]:
                    problems.append(f"{path.name}: traceback in {frames[-1].strip()[:300]}")
    return problems


def _as_epoch(moment: datetime | None) -> float | None:
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _killed_after(killed: dict[int, float], pid: int, ppid: int, at: datetime) -> bool:
    """Whether the process that ran a callback at ``at`` (or its worker) was killed later."""
    when = killed.get(pid, killed.get(ppid))
    moment = _as_epoch(at)
    return when is not None and moment is not None and when >= moment


def check(
    target: ChaosTarget, planned: list[Planned], left: list[str], killer: Killer
) -> dict[str, Any]:
    """Compare the store, the result backend and the ledgers; the summary with violations."""
    ids = [p.task_id for p in planned]
    kind_of = {p.task_id: p.kind for p in planned}
    with _connect(target.store_url) as conn:
        tries = conn.execute(
            "SELECT task_id, try_number, state, recovered_at, started_at, queued_at, ended_at,"
            " job_id, state_reason FROM task_records WHERE task_id = ANY(%s)"
            " ORDER BY task_id, try_number",
            (ids,),
        ).fetchall()
        nodes = dict(conn.execute("SELECT id, node_name FROM jobs").fetchall())
        runs = conn.execute("SELECT task_id, try_number, phase FROM chaos_runs").fetchall()
        effects = dict(conn.execute("SELECT key, try_number FROM chaos_effects").fetchall())
        callbacks = conn.execute(
            "SELECT task_id, try_number, kind, source, pid, ppid, at FROM chaos_callbacks"
            " ORDER BY at"
        ).fetchall()

    by_task: dict[str, list[tuple]] = defaultdict(list)
    for row in tries:
        by_task[row[0]].append(row)
    violations: list[str] = []

    # 0 lost: every task is ready in the backend and its last try is final in the store.
    if left:
        violations.append(f"{len(left)} tasks never finished: {left[:10]}")

    # Side effects: exactly once per idempotent key that succeeded, never twice.
    runs_of: Counter[tuple[str, str]] = Counter((r[0], r[2]) for r in runs)
    duplicates = sum(n for (_, phase), n in runs_of.items() if phase == "duplicate")
    final_state = {t: rows[-1][2] for t, rows in by_task.items()}
    for p in planned:
        succeeded = final_state.get(p.task_id) == "success"
        if p.kind == "idempotent" and succeeded and p.key not in effects:
            violations.append(f"idempotent {p.task_id} succeeded without its side effect")
    if duplicates:
        dup_tasks = sorted({r[0] for r in runs if r[2] == "duplicate"})
        violations.append(f"{duplicates} duplicate side effects: {dup_tasks[:10]}")

    # Non-idempotent tasks ran at most max_retries + 1 times.
    over_budget = [
        t
        for t in ids
        if kind_of[t] != "idempotent"
        and max(runs_of[(t, "run")], runs_of[(t, "resume")]) > MAX_RETRIES + 1
    ]
    if over_budget:
        violations.append(f"{len(over_budget)} tasks ran over max_retries + 1: {over_budget[:10]}")

    # Every failed try's failure callback ran exactly once; every retried try's on_retry too.
    # Once more is the documented exception: a sweep's process killed after running the
    # callbacks and before deleting their row (sweeps/callbacks.py); a copy counts only
    # when no later copy follows it or its process was not killed afterwards.
    copies: dict[tuple[str, int | None, str], list[tuple]] = defaultdict(list)
    for c in callbacks:
        copies[(c[0], c[1], c[2])].append(c)
    seen: Counter[tuple[str, int | None, str]] = Counter()
    cut_short = 0
    for key, made in copies.items():
        for earlier in made[:-1]:
            if _killed_after(killer.killed_pids, earlier[4], earlier[5], earlier[6]):
                cut_short += 1
            else:
                seen[key] += 1
        seen[key] += 1
    expected = {
        (row[0], row[1], "failure" if row[2] == "failed" else "retry")
        for row in tries
        if row[2] in ("failed", "up_for_retry")
    }
    wrong = {k: seen.get(k, 0) for k in expected if seen.get(k, 0) != 1}
    wrong.update({k: n for k, n in seen.items() if k not in expected})
    failure_wrong = {k: n for k, n in wrong.items() if k[2] == "failure"}
    retry_wrong = {k: n for k, n in wrong.items() if k[2] == "retry"}
    if failure_wrong:
        violations.append(
            f"{len(failure_wrong)} failed tries whose callback ran != once:"
            f" {sorted(failure_wrong.items(), key=str)[:10]}"
        )
    if retry_wrong:
        violations.append(
            f"{len(retry_wrong)} retried tries whose on_retry ran != once:"
            f" {sorted(retry_wrong.items(), key=str)[:10]}"
        )

    # No sweep raised.
    log_problems = _log_problems(target.workdir)
    if log_problems:
        violations.append(f"{len(log_problems)} sweep errors in the logs: {log_problems[:5]}")

    # Recovery: tries a sweep reset, reconciled or adopted, and how long until their task ended.
    recovered = [row for row in tries if row[3] is not None]
    recovery_times = []
    for row in recovered:
        task_rows = by_task[row[0]]
        end = _as_epoch(task_rows[-1][6])
        node = (nodes.get(row[7]) or "").split("@")[0]
        start = killer.killed_at.get(node) or _as_epoch(row[4] or row[5])
        if end is not None and start is not None:
            recovery_times.append(end - start)
    states = Counter(final_state.get(t, "missing") for t in ids)
    return {
        "tasks": len(ids),
        "by_kind": dict(Counter(kind_of.values())),
        "final_states": dict(states),
        "kills": dict(killer.kills),
        "recoveries": len(recovered),
        "recovered_tasks": len({row[0] for row in recovered}),
        "recovery_reasons": dict(Counter(_reason(row[8]) for row in recovered)),
        "tries": len(tries),
        "callbacks": dict(Counter(f"{c[2]}/{c[3]}" for c in callbacks)),
        "duplicates": duplicates,
        "lost": len(left),
        "over_retry_budget": len(over_budget),
        "callbacks_not_once": len(failure_wrong),
        "retry_callbacks_not_once": len(retry_wrong),
        "callbacks_repeated_after_a_kill": cut_short,
        "sweep_errors": len(log_problems),
        "max_recovery_seconds": round(max(recovery_times), 1) if recovery_times else None,
        "median_recovery_seconds": (
            round(statistics.median(recovery_times), 1) if recovery_times else None
        ),
        "idempotent_effects": sum(1 for p in planned if p.key in effects),
        "violations": violations,
    }


def _reason(reason: str | None) -> str:
    """A stored state reason without its ids and numbers, to group by."""
    return re.sub(r"[0-9a-f-]{8,}|\d+(\.\d+)?", "#", reason or "")[:80]


def run_chaos(config: ChaosConfig, target: ChaosTarget) -> dict[str, Any]:
    """Run the chaos scenario against a migrated, empty store; its summary."""
    seed = config.seed if config.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    target.workdir.mkdir(parents=True, exist_ok=True)
    create_ledger(ledger_dsn(target.store_url))
    run_id = uuid.uuid4().hex[:8]
    planned = plan(config, rng, run_id)
    app = create_chaos_app(
        target.broker,
        target.backend,
        target.queue,
        {"database_url": target.store_url, "preset": "aggressive", "redis_url": target.lock_redis},
        acks_late=target.acks_late,
    )
    cluster = Cluster(target, config)
    killer = Killer(cluster, config, rng)
    began = time.monotonic()
    try:
        cluster.start_beat()
        cluster.start_triggerer()
        for _ in range(config.workers):
            cluster.start_worker()
        for worker in cluster.workers:
            worker.wait_ready(60)
        killer.start()
        publish(app, planned, config.workers * config.concurrency)
        killer.join(config.seconds + 30)
        left = wait_quiescent(app, target, [p.task_id for p, _ in planned], config.quiesce_timeout)
    finally:
        killer.stop.set()
        cluster.stop_all()
        installed = recovery_for_app(app)
        if installed is not None:
            installed.close()
        app.close()
    if killer.error is not None:
        raise RuntimeError("the killer failed") from killer.error
    summary = check(target, [p for p, _ in planned], left, killer)
    summary["seed"] = seed
    summary["seconds_killing"] = config.seconds
    summary["elapsed_seconds"] = round(time.monotonic() - began, 1)
    return summary


def main(argv: list[str] | None = None) -> int:
    from tests.services import BACKEND_DB, BROKER_DB, RABBITMQ_URL, REDIS_URL, create_pg_database

    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=120.0, help="how long the killer runs")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--quiesce-timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--workdir", type=Path, default=None, help="logs (default: a new dir)")
    parser.add_argument("--keep-db", action="store_true", help="keep the store for inspection")
    parser.add_argument(
        "--broker",
        choices=["redis", "rabbitmq"],
        default="redis",
        help="RabbitMQ (RECOVERY_TEST_RABBITMQ) with a Redis result backend, or Redis for both",
    )
    parser.add_argument("--acks-late", action="store_true", help="task_acks_late on every task")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path("/tmp") / f"chaos-{uuid.uuid4().hex[:8]}"
    url, drop = create_pg_database("celery_recovery_chaos")
    try:
        summary = run_chaos(
            ChaosConfig(
                tasks=args.tasks,
                seconds=args.seconds,
                workers=args.workers,
                quiesce_timeout=args.quiesce_timeout,
                seed=args.seed,
            ),
            ChaosTarget(
                url,
                RABBITMQ_URL if args.broker == "rabbitmq" else f"{REDIS_URL}/{BROKER_DB}",
                f"{REDIS_URL}/{BACKEND_DB}",
                f"chaos-{uuid.uuid4().hex[:8]}",
                workdir,
                acks_late=args.acks_late,
            ),
        )
    finally:
        if args.keep_db:
            print(f"store kept: {url}", file=sys.stderr)
        else:
            drop()
    summary["logs"] = str(workdir)
    print(json.dumps(summary, indent=2, default=str))
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
