"""The demo, the project's main job, recovers a SIGKILLed worker's task with no servers."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
