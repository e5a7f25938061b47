"""Every operator command explains itself with an example, and runs as ``celery recovery``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from celery_recovery.cli import recovery
from tests.builders import add_job
from tests.workers import ROOT

CELERY_RECOVERY = [sys.executable, "-m", "celery", "-A", "tests.apps.lifecycle", "recovery"]
COMMANDS = [
    ["inspect"],
    ["inspect", "zombies"],
    ["inspect", "orphans"],
    ["inspect", "deferred"],
    ["inspect", "jobs"],
    ["inspect", "tasks"],
    ["inspect", "locks"],
    ["jobs"],
    ["jobs", "check"],
    ["db", "clean"],
    ["web"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_says_what_it_does_with_an_example(command):
    result = CliRunner().invoke(recovery, [*command, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output and "celery-recovery" in result.output


def test_inspect_jobs_through_celery_with_the_apps_store(store):
    live = add_job(store, "worker", heartbeat_age=1)
    dead = add_job(store, "worker", heartbeat_age=900)
    env = {
        **os.environ,
        "CELERY_RECOVERY_DATABASE_URL": store.url,
        "RECOVERY_TEST_PLAIN": "0",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [*CELERY_RECOVERY, "inspect", "jobs", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    alive = {row["id"]: row["alive"] for row in json.loads(done.stdout)}
    assert alive == {live: True, dead: False}


def test_python_dash_m_runs_the_operator_commands_too():
    done = subprocess.run(
        [sys.executable, "-m", "celery_recovery.cli", "jobs", "check", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "--job-type" in done.stdout, done.stderr
