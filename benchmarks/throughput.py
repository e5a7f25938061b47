"""Throughput of plain Celery against Celery with celery-recovery, and what it costs.

The same N no-op tasks go through one prefork worker (concurrency 2, Redis
broker and result backend), in alternating rounds whose order rotates: plain,
PostgreSQL, SQLite; then PostgreSQL, SQLite, plain; ...  Each round's rate is
tasks / (last result - first publish), the publisher included (its queued
records are part of the cost).

Wall-clock rates depend on whatever else the machine runs, so each round also
reports load-independent figures: CPU per task of the worker's processes (and
of its main process alone) and of the publisher, and on PostgreSQL the
server's CPU per task (its backends' CPU in ``/proc``), rows and commits per
task and the share of updates that were HOT, the publisher's CPU while it
publishes (``publish_loop_cpu_ms_per_task``, before it waits for results),
and how often each side's threads gave up or lost a core (context switches
per task).  With ``--handlers`` it
also reports the CPU of celery-recovery's own code where it runs: each hot-path
signal handler and each side's writer threads, in microseconds per task
(``benchmarks/handler_cpu.py``).  With ``--without hooks`` or ``--without
writes`` celery-recovery's rounds run with one part switched off (see
``bench_app.py``), which splits what it adds into what being installed costs,
what recording each task costs in the processes, and what the store's writes
cost.  Prints JSON; the ratios are medians of the
rounds (with ``ratio_ci95``, a bootstrap interval of that median, once there are
three rounds or more), and so is ``added_cpu_share``: the CPU per task a round adds (worker,
publisher, PostgreSQL server) over plain Celery's own in the same cycle, as a
share of it (in rounds of 3,000 tasks and more the rate ratio is about
``1 / (1 + share)``).

With ``--baseline DIR`` (another checkout of celery-recovery, e.g. a ``git
worktree`` of the commit before a change) each store also runs with that
code, in the same rotation, on its own empty store: each variant then also
reports ``vs_baseline``, the median over the cycles of its rate over the
baseline's rate in the same cycle, with its interval.  Neighbouring rounds
share the machine's state of the moment, so this pairs out most of the drift
that makes two separate runs on a busy machine disagree by 0.05 or more.  The
two checkouts must use the same schema revision.

    python benchmarks/throughput.py --tasks 3000 --rounds 5 --stores postgres,sqlite
    python benchmarks/throughput.py --tasks 6000 --rounds 2 --handlers
    python benchmarks/throughput.py --tasks 3000 --rounds 15 --stores postgres --without writes
    python benchmarks/throughput.py --tasks 3000 --rounds 15 --stores postgres --baseline ../before

Redis databases: ``RECOVERY_BENCH_REDIS_DB`` (broker) and the next one (backend).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PG_ADMIN = os.environ.get("BENCH_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
#: Redis databases of the broker and the result backend (the next one).
_DB = int(os.environ.get("RECOVERY_BENCH_REDIS_DB", "11"))
BROKER = f"redis://127.0.0.1:6379/{_DB}"
BACKEND = f"redis://127.0.0.1:6379/{_DB + 1}"
#: Clock ticks per second of /proc CPU times.
_TICKS = os.sysconf("SC_CLK_TCK")


def create_database() -> str:
    from sqlalchemy import create_engine, text

    from celery_recovery.store.engine import create_store_engine
    from celery_recovery.store.migrate import upgrade

    name = f"celery_recovery_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    engine = create_store_engine(url, for_migrations=True)
    upgrade(engine)
    engine.dispose()
    return name


def drop_database(name: str) -> None:
    from sqlalchemy import create_engine, text

    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def create_sqlite_store(directory: str) -> str:
    from celery_recovery.store.engine import create_store_engine
    from celery_recovery.store.migrate import upgrade

    url = f"sqlite:///{directory}/bench.sqlite3"
    engine = create_store_engine(url, for_migrations=True)
    upgrade(engine)
    engine.dispose()
    return url


# -- load-independent figures ------------------------------------------------


def process_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` have used so far."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        total += int(fields[11]) + int(fields[12])
    return total / _TICKS


def context_switches(pids: list[int]) -> int:
    """Context switches (voluntary and not) of every thread of the processes ``pids``
    so far: how often they gave up or lost a core, which a busy two-core machine
    pays for in the other processes' waits."""
    total = 0
    for pid in pids:
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in threads:
            try:
                with open(f"/proc/{pid}/task/{tid}/status") as status:
                    for line in status:
                        name, _, value = line.partition(":")
                        if name.endswith("ctxt_switches"):
                            total += int(value)
            except (OSError, ValueError):
                continue  # gone meanwhile
    return total


def group_pids(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` (a worker and its pool)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            pids.append(int(entry))
    return pids


def _query(store_url: str, sql: str) -> list[Any]:
    """Rows of one statement, on a connection of its own (statistics are not cached)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(store_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql)))
    finally:
        engine.dispose()


def server_pids(store_url: str) -> list[int]:
    """The PostgreSQL backends connected to the store's database (not this query's)."""
    rows = _query(
        store_url,
        "SELECT pid FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    return [int(row[0]) for row in rows]


def table_counters(store_url: str) -> dict[str, int]:
    """Rows written, HOT updates and commits in the store's database so far."""
    (row,) = _query(
        store_url,
        "SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0), "
        "coalesce(sum(n_tup_del), 0), "
        "coalesce(sum(n_tup_upd) FILTER (WHERE relname = 'task_records'), 0), "
        "coalesce(sum(n_tup_hot_upd) FILTER (WHERE relname = 'task_records'), 0), "
        "(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) "
        "FROM pg_stat_user_tables",
    )
    keys = ("inserted", "updated", "deleted", "task_updates", "task_hot_updates", "commits")
    return {key: int(value) for key, value in zip(keys, row, strict=True)}


def wait_for_backends_to_leave(store_url: str, timeout: float = 30.0) -> None:
    """Backends flush their table statistics when they exit: wait for that."""
    deadline = time.monotonic() + timeout
    while server_pids(store_url) and time.monotonic() < deadline:
        time.sleep(0.1)


# -- one round -----------------------------------------------------------------


#: Marks a variant that runs the ``--baseline`` checkout's code: ``postgres@baseline``.
BASELINE = "@baseline"


def round_env(store: str, store_url: str | None, queue: str, root: Path = ROOT) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": f"{root / 'benchmarks'}{os.pathsep}{root}",
        "BENCH_PLAIN": "1" if store == "plain" else "0",
        "BENCH_QUEUE": queue,
        "BENCH_BROKER": BROKER,
        "BENCH_BACKEND": BACKEND,
        "C_FORCE_ROOT": "1",
    }
    env.pop("CELERY_RECOVERY_DATABASE_URL", None)
    if store_url is not None:
        env["CELERY_RECOVERY_DATABASE_URL"] = store_url
    return env


def run_round(
    store: str, tasks: int, store_url: str | None, handlers: bool = False, root: Path = ROOT
) -> dict[str, Any]:
    """One round of ``store`` (plain, postgres or sqlite) with the code of the checkout
    at ``root``."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    env = round_env(store, store_url, queue, root)
    spent = tempfile.TemporaryDirectory(prefix="bench-handlers-") if handlers else None
    if spent is not None and store != "plain":
        env["BENCH_HANDLER_CPU"] = spent.name
    postgres = store == "postgres"
    before = table_counters(store_url) if postgres and store_url else None
    log = open(f"/tmp/bench-worker-{queue}.log", "w")  # noqa: SIM115
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench_app",
            "worker",
            "-P",
            "prefork",
            "-c",
            "2",
            "-Q",
            queue,
            "-l",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
        ],
        cwd=root / "benchmarks",
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    env["BENCH_WORKER_PGID"] = str(worker.pid)
    env["BENCH_STORE"] = store
    try:
        out = subprocess.run(
            [sys.executable, str(root / "benchmarks" / "throughput.py"), "--publish", str(tasks)],
            cwd=root / "benchmarks",
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        ).stdout
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
        log.close()
    result["store"] = store
    if spent is not None:
        if store != "plain":
            from handler_cpu import per_task  # beside this script

            result["handler_cpu_us_per_task"] = per_task(spent.name, tasks)
        spent.cleanup()
    if before is not None and store_url is not None:
        wait_for_backends_to_leave(store_url)
        after = table_counters(store_url)
        delta = {key: after[key] - before[key] for key in after}
        result["rows_per_task"] = round(
            (delta["inserted"] + delta["updated"] + delta["deleted"]) / tasks, 3
        )
        result["commits_per_task"] = round(delta["commits"] / tasks, 4)
        result["hot_ratio"] = round(delta["task_hot_updates"] / max(delta["task_updates"], 1), 3)
    return result


def _finished(store_url: str) -> int:
    """Tries the store holds as finished (what the round's records reached)."""
    return int(_query(store_url, "SELECT count(*) FROM task_records WHERE state = 'success'")[0][0])


def _wait_finished(store_url: str, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while _finished(store_url) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"the store did not record {count} finished tries")
        time.sleep(0.05)


def publish(tasks: int) -> None:
    """Publisher side of one round (run in its own process, with the round's app)."""
    import bench_app
    from celery.result import ResultSet

    store = os.environ["BENCH_STORE"]
    store_url = os.environ.get("CELERY_RECOVERY_DATABASE_URL")
    # With hooks or writes switched off the store never holds the round's records.
    recorded = not os.environ.get("BENCH_WITHOUT")
    worker_pgid = int(os.environ["BENCH_WORKER_PGID"])
    # Wait until the worker answers so its start-up is not timed.
    deadline = time.monotonic() + 60
    while not bench_app.app.control.ping(timeout=0.5):
        if time.monotonic() > deadline:
            raise SystemExit("the benchmark worker did not start")
    bench_app.noop.delay(-1).get(timeout=30)
    done_before = 0
    if store_url is not None:
        bench_app.recovery.runtime.writer.flush()
        if recorded:
            done_before = _finished(store_url)
            _wait_finished(store_url, done_before)
    workers = group_pids(worker_pgid)
    servers = server_pids(store_url) if store == "postgres" and store_url else []
    cpu = {
        "worker": process_cpu(workers),
        "worker_main": process_cpu([worker_pgid]),
        "server": process_cpu(servers),
        "publisher": time.process_time(),
    }
    # The worker's main process, its pool processes, this publisher.
    sides = {
        "worker_main": [worker_pgid],
        "pool": [pid for pid in workers if pid != worker_pgid],
        "publisher": [os.getpid()],
    }
    switches = {who: context_switches(pids) for who, pids in sides.items()}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    results = ResultSet([bench_app.noop.delay(i) for i in range(tasks)])
    published_cpu = time.process_time() - cpu["publisher"]
    published_s = time.perf_counter() - start
    results.join_native(timeout=600)
    elapsed = time.perf_counter() - start
    publisher_cpu = time.process_time() - cpu["publisher"]
    if store_url is not None:
        # The records are part of the work: count their CPU until they are all written.
        bench_app.recovery.runtime.writer.flush()
        publisher_cpu = time.process_time() - cpu["publisher"]
        if recorded:
            _wait_finished(store_url, done_before + tasks)
    worker_cpu = process_cpu(workers) - cpu["worker"]
    main_cpu = process_cpu([worker_pgid]) - cpu["worker_main"]
    server_cpu = 0.0
    if servers:
        # Backends opened during the round count from zero.
        now_servers = server_pids(store_url) if store_url else []
        server_cpu = process_cpu(now_servers) - cpu["server"]
    per_task = 1000 / tasks
    switched = {who: context_switches(pids) - switches[who] for who, pids in sides.items()}
    print(
        json.dumps(
            {
                "rate": tasks / elapsed,
                "seconds": elapsed,
                "load_1min": round(load, 2),
                "worker_cpu_ms_per_task": round(worker_cpu * per_task, 3),
                "worker_main_cpu_ms_per_task": round(main_cpu * per_task, 3),
                "publisher_cpu_ms_per_task": round(publisher_cpu * per_task, 3),
                "server_cpu_ms_per_task": round(server_cpu * per_task, 3),
                "publish_loop_cpu_ms_per_task": round(published_cpu * per_task, 3),
                "publish_loop_s": round(published_s, 3),
                **{
                    f"{who}_switches_per_task": round(count / tasks, 2)
                    for who, count in switched.items()
                },
            }
        )
    )


def added_cpu_share(run: dict[str, Any], plain: dict[str, Any]) -> float:
    """The CPU per task a round adds (worker, publisher and, on PostgreSQL, the server)
    as a share of plain Celery's own (worker and publisher) in the same cycle.

    In rounds long enough to keep the two cores busy (3,000 tasks here; not 500,
    which end before the worker's pace settles) the rate ratio is about
    ``1 / (1 + share)``: what is added is what slows the worker down.
    """
    base = plain["worker_cpu_ms_per_task"] + plain["publisher_cpu_ms_per_task"]
    spent = run["worker_cpu_ms_per_task"] + run["publisher_cpu_ms_per_task"]
    return (spent + run.get("server_cpu_ms_per_task", 0.0) - base) / base


def median_interval(values: list[float], resamples: int = 2000) -> list[float] | None:
    """A 95 % bootstrap interval of the median of ``values`` (the rounds' ratios): how
    far the median could move between runs of the same code on the same machine,
    which says whether a target above or below it is met or only touched."""
    if len(values) < 3:
        return None
    draw = random.Random(0)  # the same rounds give the same interval
    medians = sorted(
        statistics.median(draw.choices(values, k=len(values))) for _ in range(resamples)
    )
    return [round(medians[int(0.025 * resamples)], 3), round(medians[int(0.975 * resamples)], 3)]


def _baseline_root(parser: argparse.ArgumentParser, path: Path | None) -> Path | None:
    """The ``--baseline`` checkout's root, refused unless it holds this benchmark."""
    if path is None:
        return None
    root = path.resolve()
    if (
        not (root / "benchmarks" / "throughput.py").is_file()
        or not (root / "celery_recovery" / "__init__.py").is_file()
    ):
        parser.error(
            f"--baseline {path}: not a checkout of celery-recovery "
            "(it needs celery_recovery/ and benchmarks/throughput.py)"
        )
    return root


def _median(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rounds if key in r]
    return round(statistics.median(values), 3) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each kind")
    parser.add_argument(
        "--stores", default="postgres,sqlite", help="stores to compare with plain Celery"
    )
    parser.add_argument(
        "--acks-late", action="store_true", help="an acks_late task (claimed synchronously)"
    )
    parser.add_argument(
        "--handlers",
        action="store_true",
        help="also the CPU per task of each handler and writer thread, in place",
    )
    parser.add_argument(
        "--without",
        choices=("hooks", "writes"),
        help="switch one part off in celery-recovery's rounds, to tell what it costs: "
        "hooks (installed, but no task recorded) or writes (recorded, never sent to the store)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of celery-recovery whose code also runs each store, "
        "in the same rotation (its rounds are named <store>@baseline)",
    )
    parser.add_argument("--publish", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.acks_late:
        os.environ["BENCH_ACKS_LATE"] = "1"
    if args.without:
        os.environ["BENCH_WITHOUT"] = args.without
    if args.publish is not None:
        publish(args.publish)
        return
    stores = [s for s in args.stores.split(",") if s]
    baseline = _baseline_root(parser, args.baseline)
    codes = [""] if baseline is None else ["", BASELINE]
    databases: list[str] = []
    scratch = tempfile.TemporaryDirectory(prefix="bench-sqlite-")
    urls: dict[str, str | None] = {"plain": None}
    for code in codes:
        # Each code on its own empty store: neither finds the other's rows.
        if "postgres" in stores:
            databases.append(create_database())
            urls["postgres" + code] = PG_ADMIN.rsplit("/", 1)[0] + f"/{databases[-1]}"
        if "sqlite" in stores:
            directory = Path(scratch.name) / (code.lstrip("@") or "this")
            directory.mkdir()
            urls["sqlite" + code] = create_sqlite_store(str(directory))
    rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in urls}
    kinds = list(urls)
    try:
        for index in range(args.rounds):
            # Rotated, so that no variant always runs first or last in a cycle (a machine
            # whose speed drifts would otherwise favour one).
            order = kinds[index % len(kinds) :] + kinds[: index % len(kinds)]
            for kind in order:
                store, _, code = kind.partition("@")
                root = baseline if code and baseline is not None else ROOT
                rounds[kind].append(run_round(store, args.tasks, urls[kind], args.handlers, root))
    finally:
        for name in databases:
            drop_database(name)
        scratch.cleanup()
    plain_rate = statistics.median(r["rate"] for r in rounds["plain"])
    report: dict[str, Any] = {
        "tasks": args.tasks,
        "rounds": args.rounds,
        "acks_late": args.acks_late,
        "without": args.without,
        "baseline": None if baseline is None else str(baseline),
    }
    for kind, runs in rounds.items():
        rates = [r["rate"] for r in runs]
        summary: dict[str, Any] = {
            "tasks_per_s": round(statistics.median(rates), 1),
            "rounds_tasks_per_s": [round(r, 1) for r in rates],
            "load_1min": [r["load_1min"] for r in runs],
        }
        if kind != "plain":
            # Ratio of each round to the plain round of the same cycle, then the median.
            ratios = [r / p["rate"] for r, p in zip(rates, rounds["plain"], strict=True)]
            summary["ratio"] = round(statistics.median(ratios), 3)
            summary["rounds_ratio"] = [round(r, 3) for r in ratios]
            summary["ratio_ci95"] = median_interval(ratios)
            summary["ratio_of_medians"] = round(statistics.median(rates) / plain_rate, 3)
            if baseline is not None and not kind.endswith(BASELINE):
                # Paired by cycle: this code's round against the baseline's, same store.
                paired = [r["rate"] for r in rounds[kind + BASELINE]]
                against = [r / b for r, b in zip(rates, paired, strict=True)]
                summary["vs_baseline"] = round(statistics.median(against), 3)
                summary["rounds_vs_baseline"] = [round(r, 3) for r in against]
                summary["vs_baseline_ci95"] = median_interval(against)
            summary["added_cpu_share"] = round(
                statistics.median(
                    added_cpu_share(r, p) for r, p in zip(runs, rounds["plain"], strict=True)
                ),
                3,
            )
        for key in (
            "worker_cpu_ms_per_task",
            "worker_main_cpu_ms_per_task",
            "publisher_cpu_ms_per_task",
            "server_cpu_ms_per_task",
            "rows_per_task",
            "commits_per_task",
            "hot_ratio",
            "worker_main_switches_per_task",
            "pool_switches_per_task",
            "publisher_switches_per_task",
            "publish_loop_cpu_ms_per_task",
            "publish_loop_s",
        ):
            value = _median(runs, key)
            on_postgres = kind.partition("@")[0] == "postgres"
            if value is not None and (on_postgres or key.split("_")[0] != "server"):
                summary[key] = value
        spent = [r["handler_cpu_us_per_task"] for r in runs if "handler_cpu_us_per_task" in r]
        if spent:
            summary["handler_cpu_us_per_task"] = {
                key: round(statistics.median(r.get(key, 0.0) for r in spent), 1)
                for key in sorted({key for r in spent for key in r})
            }
        report[kind] = summary
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
