"""The demo, the project's main job, recovers a SIGKILLed worker's task with no servers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.web.helpers import console_client
from tests.workers import ROOT

pytestmark = pytest.mark.slow


def test_demo_recovers_the_killed_task_and_exits_zero():
    done = subprocess.run(
        [sys.executable, "-m", "celery_recovery.cli", "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SIGKILL worker" in done.stdout
    assert "re-published 1 task(s) as try 2" in done.stdout
    assert "1:up_for_retry -> 2:success" in done.stdout
    assert "recovered: every task completed" in done.stdout
    # And it prints how to open the console on its store, which shows that recovery
    command = next(line for line in done.stdout.splitlines() if line.strip().endswith(" web"))
    url = command.split("--database-url", 1)[1].split()[0]
    lines = done.stdout.splitlines()
    killed = next(line for line in lines if "SIGKILL worker" in line).split()[-1]
    marked = next(line.split()[0] for line in lines if line.rstrip().endswith("<- killed"))
    assert marked == killed
    with console_client(url) as client:
        rows = client.get("/api/recoveries", params={"action": "republished"}).json()["rows"]
    recovered = {r["task_id"]: r for r in rows}
    assert (recovered[killed]["try_number"], recovered[killed]["reason"]) == (1, "worker_lost")
    assert recovered[killed]["pid"] and recovered[killed]["hostname"]
    # Under load the killed worker may also have taken the next message: that one is
    # recovered too, as its reserved message (its reception recorded) or as a lost one.
    others = [(r["try_number"], r["reason"]) for r in rows if r["task_id"] != killed]
    assert set(others) <= {(1, "reserved_by_dead_worker"), (1, "message_lost")}, rows
