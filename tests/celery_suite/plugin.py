"""A pytest plugin that runs Celery's own integration suite with ``Recovery(app)`` installed.

Loaded with ``-p tests.celery_suite.plugin`` by :mod:`tests.celery_suite.compare`;
Celery's files are not changed.  Environment:

- ``CELERY_SUITE_STORE``: the store URL; empty runs the suite without Recovery
  (the plugin then only records outcomes, so both runs are measured alike).
- ``CELERY_SUITE_REDIS_DB``: the Redis database Celery's test tasks use for their
  own keys (``t.integration.tasks.get_redis_connection`` always uses 0).
- ``CELERY_SUITE_REPORT``: where the JSON report of this run is written.

Recovery is installed on the session app, the one the in-process worker runs,
as soon as Celery's ``celery_session_app`` fixture has built it (before the
worker starts).  Tests publish through a function-scoped app of the same
configuration; the publish signals record those messages for the one
installation, as they would for any publisher in a Recovery process.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

STORE_URL = os.environ.get("CELERY_SUITE_STORE", "")
REPORT_PATH = os.environ.get("CELERY_SUITE_REPORT", "")
REDIS_DB = int(os.environ.get("CELERY_SUITE_REDIS_DB", "0"))

_outcomes: dict[str, str] = {}
_durations: dict[str, float] = {}
_installed: list[Any] = []


def _redis_db_for_test_tasks() -> None:
    """Point the test tasks' own Redis keys at our database instead of database 0."""
    try:
        from t.integration import tasks
    except ImportError:  # not Celery's suite: nothing to point
        return
    from redis import StrictRedis

    def get_redis_connection() -> StrictRedis:
        host = os.environ.get("REDIS_HOST", "localhost")
        port = int(os.environ.get("REDIS_PORT", 6379))
        return StrictRedis(host=host, port=port, db=REDIS_DB, socket_timeout=None)

    tasks.get_redis_connection = get_redis_connection


_redis_db_for_test_tasks()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Any:
    value = yield
    if fixturedef.argname == "celery_session_app" and STORE_URL and not _installed:
        from celery_recovery import Recovery

        _installed.append(Recovery(value, database_url=STORE_URL))
    return value


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    if report.when == "call" or report.outcome != "passed":
        previous = _outcomes.get(report.nodeid)
        if previous in (None, "passed"):  # a failed teardown after a pass is a failure
            _outcomes[report.nodeid] = (
                "error" if report.when != "call" and report.failed else (report.outcome)
            )


def pytest_runtest_logfinish() -> None:
    # After every test, so that a run stopped by the comparison's timeout still reports.
    _write_report(None)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _write_report(_after_the_run(_installed[0]) if _installed else None)


def _write_report(recovery: dict[str, Any] | None) -> None:
    if not REPORT_PATH:
        return
    report = {"outcomes": _outcomes, "durations": _durations, "recovery": recovery}
    with open(REPORT_PATH + ".part", "w") as out:
        json.dump(report, out, indent=1, default=str)
    os.replace(REPORT_PATH + ".part", REPORT_PATH)


def _after_the_run(recovery: Any) -> dict[str, Any]:
    """The store after the run, and what a sweep past the queued timeout would re-publish."""
    from celery_recovery.core.timeutils import utcnow

    store = recovery.store
    recovery.flush()
    tries = store.tries.list_tries(limit=100000)
    states = Counter(str(t["state"]) for t in tries)
    later = utcnow() + timedelta(seconds=recovery.settings.queued_timeout + 1)
    report = recovery.sweep(now=later)
    republished = [
        f"{t['task_name']}[{t['task_id']}] try {t['try_number']}"
        for t in store.tries.list_tries(limit=100000)
        if t["try_number"] > 1 and str(t["state"]) == "queued" and t["queued_at"] >= later
    ]
    return {
        "tries": len(tries),
        "states": dict(states),
        "sweep_after_queued_timeout": {
            "lost_messages": report.lost_messages,
            "republished": report.lost_republished,
            # What it did with a try left running when the session's worker stopped.
            "zombies": report.zombies,
            "zombies_republished": report.republished,
            "reconciled": report.reconciled,
            "adopted": report.adopted,
            "errors": report.errors,
            "tasks": republished,
        },
    }
