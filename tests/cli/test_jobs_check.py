"""``jobs check``: 0 for a fresh heartbeat, 1 for none, 2 when it cannot tell; one line each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.builders import add_job
from tests.cli.helpers import run
from tests.conftest import FAST_SETTINGS
from tests.workers import ROOT, wait_for


def one_line(result) -> str:
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def test_live_worker_passes(store):
    add_job(store, "worker", heartbeat_age=1, hostname="live-host")
    add_job(store, "worker", heartbeat_age=600, hostname="dead-host")
    result = run(store.url, "jobs", "check", "--job-type", "worker")
    assert result.exit_code == 0
    assert one_line(result).startswith("OK: worker job") and "live-host" in result.output


def test_stale_heartbeat_on_the_host_fails_and_says_how_old(store):
    add_job(store, "worker", heartbeat_age=1, hostname="live-host")
    add_job(store, "worker", heartbeat_age=600, hostname="dead-host")
    result = run(store.url, "jobs", "check", "--job-type", "worker", "--hostname", "dead-host")
    assert result.exit_code == 1
    line = one_line(result)
    assert line.startswith("FAIL: freshest worker heartbeat on dead-host is 6")
    assert "threshold 30s" in line


def test_hostname_matches_the_celery_node_name_too(store):
    add_job(store, "worker", heartbeat_age=1, hostname="pod-1")
    result = run(store.url, "jobs", "check", "--job-type", "worker", "--hostname", "celery@pod-1")
    assert result.exit_code == 0


def test_ended_or_missing_job_fails(store):
    add_job(store, "beat", state="success", ended_age=5)
    result = run(store.url, "jobs", "check", "--job-type", "beat")
    assert result.exit_code == 1 and one_line(result) == "FAIL: no running beat job"


def test_threshold_defaults_per_job_type_and_can_be_given(store):
    add_job(store, "triggerer", heartbeat_age=20)
    assert run(store.url, "jobs", "check", "--job-type", "triggerer").exit_code == 0
    tight = run(store.url, "jobs", "check", "--job-type", "triggerer", "--threshold", "10")
    assert tight.exit_code == 1 and "threshold 10s" in tight.output


def test_local_means_this_machine(store):
    import socket

    add_job(store, "worker", heartbeat_age=1, hostname=socket.gethostname())
    assert run(store.url, "jobs", "check", "--job-type", "worker", "--local").exit_code == 0
    add_job(store, "beat", heartbeat_age=1, hostname="elsewhere")
    assert run(store.url, "jobs", "check", "--job-type", "beat", "--local").exit_code == 1


@pytest.mark.parametrize(
    "args",
    [
        ["--job-type", "cron"],
        [],
        ["--job-type", "worker", "--threshold", "-1"],
        ["--job-type", "worker", "--local", "--hostname", "h"],
    ],
)
def test_bad_options_exit_2_without_traceback(sqlite_url, args):
    result = run(sqlite_url, "jobs", "check", *args)
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_unreachable_database_exits_2_with_one_line():
    result = run("postgresql://u:pw@127.0.0.1:1/x", "jobs", "check", "--job-type", "worker")
    assert result.exit_code == 2
    assert "unavailable" in one_line(result) and ":pw@" not in result.output


def probe(url: str, *args: str) -> subprocess.CompletedProcess:
    """The probe as Kubernetes runs it: the console script in a fresh process."""
    script = os.path.join(os.path.dirname(sys.executable), "celery-recovery")
    return subprocess.run(
        [script, "--database-url", url, "jobs", "check", "--job-type", "worker", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
# Store-independent behaviour: one store keeps the suite's time for the cases that differ.
@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_probe_passes_while_a_real_worker_runs_and_fails_within_threshold_after_sigkill(
    start_worker, store_url
):
    worker = start_worker(store_url, pool="prefork", concurrency=1)
    threshold = FAST_SETTINGS["zombie_threshold"]
    wait_for(lambda: probe(store_url, "--threshold", str(threshold)).returncode == 0, 20)
    ok = probe(store_url, "--threshold", str(threshold))
    assert ok.stdout.startswith("OK: worker job") and ok.stderr == ""

    os.killpg(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait(10)
    killed_at = time.monotonic()
    failed = wait_for(
        lambda: (p := probe(store_url, "--threshold", str(threshold))).returncode == 1 and p,
        threshold + 10,
        interval=0.2,
    )
    # The heartbeat was at most one interval old at the kill; add one probe's run time.
    assert time.monotonic() - killed_at < threshold + FAST_SETTINGS["heartbeat_interval"] + 3
    assert failed.stdout.startswith("FAIL: freshest worker heartbeat")
    assert len(failed.stdout.strip().splitlines()) == 1 and failed.stderr == ""


def test_probe_exits_2_on_unreachable_database_as_a_subprocess():
    done = probe("postgresql://u:pw@127.0.0.1:1/x")
    assert done.returncode == 2
    assert "unavailable" in done.stderr and "Traceback" not in done.stderr + done.stdout
    assert len(done.stderr.strip().splitlines()) == 1


def test_probe_exits_2_on_unimportable_app():
    script = os.path.join(os.path.dirname(sys.executable), "celery-recovery")
    done = subprocess.run(
        [script, "--app", "no_such_module_anywhere", "jobs", "check", "--job-type", "worker"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "cannot import app" in done.stderr
    assert "Traceback" not in done.stderr
