"""Celery's own integration tests pass with ``Recovery(app)`` installed (a subset, for CI).

The whole comparison is ``python -m tests.celery_suite.compare`` (docs/compatibility.md).
This runs the tests closest to what Recovery touches (publishing, retries, rejects,
revokes, expiry, stamps, canvas ids) with and without Recovery, and fails when one
passes without it and not with it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.celery_suite.compare import compare, exit_status
from tests.services import BACKEND_DB, BROKER_DB, REDIS_URL, require

pytestmark = pytest.mark.slow

#: Redis databases Celery's suite uses as broker and result backend, one per run (each
#: flushed by its run): by default the session's own two, which no other test uses
#: while this one runs.
SUITE_REDIS_DB = int(os.environ.get("RECOVERY_TEST_CELERY_SUITE_DB", str(BROKER_DB)))
SUITE_PARALLEL_DB = int(os.environ.get("RECOVERY_TEST_CELERY_SUITE_PARALLEL_DB", str(BACKEND_DB)))

CI_SELECTION = [
    f"t/integration/{test}"
    for test in (
        "test_tasks.py::test_tasks::test_basic_task",
        "test_tasks.py::test_tasks::test_reject_with_requeue_redelivers_and_succeeds",
        "test_tasks.py::test_tasks::test_reject_without_requeue_stores_failure",
        "test_tasks.py::test_tasks::test_revoked_by_headers_simple_canvas",
        "test_tasks.py::test_tasks::test_revoke_by_stamped_headers_no_match",
        "test_tasks.py::test_tasks::test_task_retried_once_with_expires",
        "test_tasks.py::test_tasks::test_task_retried_headers",
        "test_tasks.py::test_tasks::test_fail",
        "test_canvas.py::test_chain::test_simple_chain",
        "test_canvas.py::test_chain::test_group_results_in_chain",
        "test_canvas.py::test_group::test_parent_ids",
        "test_canvas.py::test_chord::test_parent_ids",
        "test_inspect.py::test_Inspect::test_ping",
    )
]


def test_celery_integration_subset_passes_with_recovery_installed():
    require("Redis", REDIS_URL, 6379)
    cache = Path(os.environ.get("RECOVERY_TEST_CACHE", Path.home() / ".cache" / "celery-recovery"))

    # Both runs at once, each on its own database: the suite mostly waits on its worker.
    result = compare(
        [],
        CI_SELECTION,
        "sqlite",
        SUITE_REDIS_DB,
        timeout=140,
        cache=cache,
        parallel_db=SUITE_PARALLEL_DB,
    )

    assert not result["without"]["timed_out"] and not result["with"]["timed_out"], result
    assert result["without"].get("passed", 0) >= len(CI_SELECTION) - 2, result
    assert result["regressions"] == [], result
    after = result["with"]["store_after_run"]
    # Nothing the suite revoked, expired or finished is published again later.
    assert after["sweep_after_queued_timeout"]["republished"] == 0, after


@pytest.mark.parametrize(
    "without,with_,regressions,status",
    [
        ({"run": 0}, {"run": 0}, [], 2),  # the suite did not collect (e.g. a missing plugin)
        ({"run": 12, "passed": 12}, {"run": 0}, [], 2),
        ({"run": 12, "passed": 12}, {"run": 12, "passed": 11}, ["t/x"], 1),
        ({"run": 12, "passed": 12}, {"run": 12, "passed": 12}, [], 0),
    ],
)
def test_the_comparison_fails_when_a_run_executed_no_test(without, with_, regressions, status):
    result = {"without": without, "with": with_, "regressions": regressions}
    assert exit_status(result) == status
