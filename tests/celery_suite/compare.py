"""Run Celery's own integration suite without and with ``Recovery(app)``, and compare.

Every test that passes without Recovery must pass with it.  Standalone, printing
a JSON summary (exit status 1 when a test passes without and fails with, 2 when a
run executed no test)::

    RECOVERY_TEST_REDIS_DB=13 python -m tests.celery_suite.compare --timeout 3000

The suite comes from the sdist of the installed Celery version, fetched from
PyPI with ``pip download`` into a cache directory outside the repository
(``--cache``, default ``~/.cache/celery-recovery``).  Both runs use one Redis
database (``--redis-db``, default 15, flushed before each run) as Celery's
broker and result backend, and the store is a fresh SQLite file (or a fresh
PostgreSQL database with ``--store postgresql``).  See ``docs/compatibility.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from typing import Any

import redis

from tests.services import PG_ADMIN_URL, create_pg_database
from tests.workers import ROOT

#: Celery's integration test modules compared by default.
DEFAULT_MODULES = (
    "test_tasks.py",
    "test_canvas.py",
    "test_redis_backend.py",
    "test_worker.py",
    "test_inspect.py",
)
REDIS_HOST = "127.0.0.1"
#: Celery's own pytest settings that matter here (its classes are named ``test_*``).
PYTEST_INI = "[pytest]\naddopts = -p no:cacheprovider\npython_classes = test_*\n"
PASSED = "passed"


def fetch_suite(cache: Path) -> Path:
    """Celery's ``t/`` test package for the installed version, fetched once into ``cache``."""
    celery_version = version("celery")
    suite = cache / f"celery-{celery_version}-suite"
    if (suite / "t" / "integration" / "conftest.py").exists():
        return suite
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as download:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"celery=={celery_version}",
                "-d",
                download,
            ],
            check=True,
        )
        (sdist,) = Path(download).glob("celery-*.tar.gz")
        with tarfile.open(sdist) as archive:
            archive.extractall(download, filter="data")
        staging = Path(download) / "suite"
        staging.mkdir()
        # Only the tests: the sdist's own ``celery`` package must not shadow the installed one.
        shutil.move(str(Path(download) / f"celery-{celery_version}" / "t"), staging / "t")
        (staging / "pytest.ini").write_text(PYTEST_INI)
        shutil.rmtree(suite, ignore_errors=True)
        staging.rename(suite)
    return suite


def run_suite(
    suite: Path,
    modules: list[str],
    store_url: str,
    redis_db: int,
    timeout: float,
    selection: list[str],
) -> dict[str, Any]:
    """One pytest run of Celery's suite; returns the plugin's report (outcomes, store)."""
    redis.Redis(host=REDIS_HOST, db=redis_db).flushdb()
    url = f"redis://{REDIS_HOST}:6379/{redis_db}"
    with tempfile.TemporaryDirectory() as scratch:
        report_path = Path(scratch) / "report.json"
        env = {
            **os.environ,
            "TEST_BROKER": url,
            "TEST_BACKEND": url,
            "CELERY_SUITE_STORE": store_url,
            "CELERY_SUITE_REDIS_DB": str(redis_db),
            "CELERY_SUITE_REPORT": str(report_path),
            "PYTHONPATH": os.pathsep.join([str(suite), str(ROOT)]),
            "C_FORCE_ROOT": "1",
        }
        targets = selection or [f"t/integration/{m}" for m in modules]
        command = [
            sys.executable,
            "-m",
            "pytest",
            *targets,
            "-p",
            "celery.contrib.pytest",
            "-p",
            "tests.celery_suite.plugin",
            "-q",
            "--timeout=120",
            "-W",
            "ignore",
        ]
        started = time.monotonic()
        log = Path(scratch) / "pytest.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                command,
                cwd=suite,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                proc.wait(timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
                timed_out = True
        result: dict[str, Any] = {"outcomes": {}, "recovery": None}
        if report_path.exists():
            result = json.loads(report_path.read_text())
        result["seconds"] = round(time.monotonic() - started, 1)
        result["timed_out"] = timed_out
        result["log_tail"] = log.read_text(errors="replace")[-3000:]
    redis.Redis(host=REDIS_HOST, db=redis_db).flushdb()
    return result


def counts(outcomes: dict[str, str]) -> dict[str, int]:
    found: dict[str, int] = {"run": len(outcomes)}
    for outcome in outcomes.values():
        found[outcome] = found.get(outcome, 0) + 1
    return found


def differences(without: dict[str, str], with_: dict[str, str]) -> list[dict[str, str]]:
    """Tests whose outcome differs; ``regression`` marks one that passes only without."""
    found = []
    for nodeid in sorted(set(without) | set(with_)):
        before, after = without.get(nodeid, "not run"), with_.get(nodeid, "not run")
        if before != after:
            found.append(
                {
                    "test": nodeid,
                    "without": before,
                    "with": after,
                    "regression": before == PASSED and after in ("failed", "error"),
                }
            )
    return found


def make_store(kind: str, scratch: Path) -> tuple[str, Any]:
    if kind == "sqlite":
        return f"sqlite:///{scratch / 'recovery.sqlite3'}", lambda: None
    if not PG_ADMIN_URL:
        raise SystemExit("--store postgresql needs RECOVERY_TEST_POSTGRES")
    return create_pg_database("celery_suite")


def _one_run(
    name: str,
    suite: Path,
    modules: list[str],
    store: str,
    scratch: str,
    redis_db: int,
    timeout: float,
    selection: list[str],
) -> dict[str, Any]:
    store_url, drop = make_store(store, Path(scratch)) if name == "with" else ("", None)
    try:
        return run_suite(suite, modules, store_url, redis_db, timeout, selection)
    finally:
        if drop is not None:
            drop()


def compare(
    modules: list[str],
    selection: list[str],
    store: str,
    redis_db: int,
    timeout: float,
    cache: Path,
    confirm: bool = True,
    parallel_db: int | None = None,
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    suite = fetch_suite(cache)
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        if parallel_db is None:
            for name in ("without", "with"):
                left = (deadline - time.monotonic()) / (2 if name == "without" else 1)
                runs[name] = _one_run(
                    name, suite, modules, store, scratch, redis_db, left, selection
                )
        else:
            # Both at once, each on its own Redis database: the suite mostly waits.
            left = deadline - time.monotonic()
            with ThreadPoolExecutor(2) as pool:
                futures = {
                    name: pool.submit(
                        _one_run, name, suite, modules, store, scratch, db, left, selection
                    )
                    for name, db in (("without", parallel_db), ("with", redis_db))
                }
                runs = {name: future.result() for name, future in futures.items()}
        diffs = differences(runs["without"]["outcomes"], runs["with"]["outcomes"])
        regressions = [d["test"] for d in diffs if d["regression"]]
        if confirm and regressions and deadline - time.monotonic() > 60:
            # A flaky test (the suite's own) must fail again, in both orders, to count.
            again: dict[str, dict[str, str]] = {}
            for name in ("without", "with"):
                left = (deadline - time.monotonic()) / (2 if name == "without" else 1)
                again[name] = _one_run(
                    name, suite, modules, store, scratch, redis_db, left, regressions
                )["outcomes"]
            for diff in diffs:
                if diff["regression"]:
                    diff["rerun_without"] = again["without"].get(diff["test"], "not run")
                    diff["rerun_with"] = again["with"].get(diff["test"], "not run")
                    diff["regression"] = (
                        diff["rerun_without"] == PASSED and diff["rerun_with"] != PASSED
                    )
    return {
        "celery": version("celery"),
        "modules": modules,
        "selection": selection,
        "store": store,
        "without": {
            **counts(runs["without"]["outcomes"]),
            "seconds": runs["without"]["seconds"],
            "timed_out": runs["without"]["timed_out"],
        },
        "with": {
            **counts(runs["with"]["outcomes"]),
            "seconds": runs["with"]["seconds"],
            "timed_out": runs["with"]["timed_out"],
            "store_after_run": runs["with"]["recovery"],
        },
        "slowest_without": _slowest(runs["without"]),
        "failed_in_both": sorted(
            test
            for test, outcome in runs["without"]["outcomes"].items()
            if outcome in ("failed", "error")
            and runs["with"]["outcomes"].get(test) in ("failed", "error")
        ),
        "differences": diffs,
        "regressions": [d["test"] for d in diffs if d["regression"]],
        "log_tails": {
            name: run["log_tail"]
            for name, run in runs.items()
            if run["timed_out"] or not run["outcomes"]
        },
    }


def _slowest(run: dict[str, Any], count: int = 10) -> dict[str, float]:
    durations = run.get("durations") or {}
    top = sorted(durations.items(), key=lambda item: -item[1])[:count]
    return {test: round(seconds, 1) for test, seconds in top}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", nargs="*", default=list(DEFAULT_MODULES))
    parser.add_argument("--select", nargs="*", default=[], help="node ids (t/integration/...)")
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--redis-db", type=int, default=15)
    parser.add_argument("--timeout", type=float, default=3000.0, help="whole comparison, seconds")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "celery-recovery")
    parser.add_argument(
        "--parallel-db",
        type=int,
        default=None,
        help="run both at once, the run without Recovery on this Redis database",
    )
    parser.add_argument("--no-confirm", action="store_true", help="do not re-run regressions")
    args = parser.parse_args(argv)
    result = compare(
        args.modules,
        args.select,
        args.store,
        args.redis_db,
        args.timeout,
        args.cache,
        confirm=not args.no_confirm,
        parallel_db=args.parallel_db,
    )
    print(json.dumps(result, indent=2, default=str))
    return exit_status(result)


def exit_status(result: dict[str, Any]) -> int:
    """0: no regression; 1: a test passes only without Recovery; 2: nothing to compare (a
    run executed no test, e.g. the suite failed to collect, or timed out)."""
    empty = [name for name in ("without", "with") if not result[name].get("run")]
    if empty:
        print(
            f"compare: the run{'s' if len(empty) > 1 else ''} {' and '.join(empty)} Recovery "
            "executed no test (see log_tails): nothing was compared",
            file=sys.stderr,
        )
        return 2
    return 1 if result["regressions"] else 0


if __name__ == "__main__":
    sys.exit(main())
