"""``celery-recovery doctor`` and ``celery -A proj recovery doctor`` as a user runs them:
exit 0, 1 or 2, a table for people and ``--json`` for scripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.workers import ROOT

APP = "tests.doctor.app"


def doctor(
    broker: str,
    backend: str,
    store_url: str,
    *args: str,
    celery: bool = False,
    **more_env: str,
) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        **more_env,
        "PYTHONPATH": str(ROOT),
        "DOCTOR_TEST_BROKER": broker,
        "DOCTOR_TEST_BACKEND": backend,
        "CELERY_RECOVERY_DATABASE_URL": store_url,
    }
    command = (
        [sys.executable, "-m", "celery", "-A", APP, "recovery", "doctor", *args]
        if celery
        else [sys.executable, "-m", "celery_recovery.cli", "--app", APP, "doctor", *args]
    )
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.mark.parametrize("celery", [False, True], ids=["celery-recovery", "celery recovery"])
def test_exit_0_1_2_and_json(good_redis, bad_redis, closed_port, sqlite_url, celery):
    good = doctor(f"{good_redis.url}/0", f"{good_redis.url}/1", sqlite_url, celery=celery)
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.strip().endswith("0 finding(s) (0 error(s)), 0 cannot tell")

    bad = doctor(f"{bad_redis.url}/0", f"{bad_redis.url}/1", sqlite_url, "--json", celery=celery)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    report = json.loads(bad.stdout)
    assert report["exit_status"] == 1
    assert [f["id"] for f in report["findings"]] == ["redis-eviction", "redis-not-persistent"]
    assert set(report["findings"][0]) == {"id", "severity", "subject", "problem", "fix"}
    assert report["findings"][0]["severity"] == "error"

    down = doctor(f"redis://127.0.0.1:{closed_port}/0", "", sqlite_url, "--json", celery=celery)
    assert down.returncode == 1  # no result backend is a finding whatever the broker says
    assert [u["check"] for u in json.loads(down.stdout)["cannot_tell"]] == ["redis"]
    unknown = doctor(
        f"redis://127.0.0.1:{closed_port}/0", f"{good_redis.url}/1", sqlite_url, celery=celery
    )
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    assert "CANNOT TELL (redis): redis 127.0.0.1:" in unknown.stdout


def test_the_table_names_each_finding_its_problem_and_fix(bad_redis, sqlite_url):
    result = doctor(f"{bad_redis.url}/0", f"{bad_redis.url}/1", sqlite_url)
    lines = result.stdout.splitlines()
    assert (
        lines[0]
        == f"ERROR redis-eviction: redis 127.0.0.1:{bad_redis.port} (broker, result backend)"
    )
    assert lines[1].startswith("    maxmemory-policy is allkeys-lru with maxmemory 67108864 bytes")
    assert lines[2].startswith(f"    fix: redis-cli -h 127.0.0.1 -p {bad_redis.port} CONFIG SET")
    assert "read:" in lines
    assert lines[-1] == "2 finding(s) (1 error(s)), 0 cannot tell"


def test_without_an_app_it_cannot_tell(sqlite_url):
    result = subprocess.run(
        [sys.executable, "-m", "celery_recovery.cli", "--database-url", sqlite_url, "doctor"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "CELERY_APP"},
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "Error: doctor needs the app: pass --app (or use `celery -A proj recovery doctor`)"
    )


def test_thresholds_a_worker_would_refuse_are_named_before_deploying(good_redis, sqlite_url):
    bad = {"CELERY_RECOVERY_ZOMBIE_THRESHOLD": "5", "CELERY_RECOVERY_SWEEP_INTERVAL": "6"}
    urls = (f"{good_redis.url}/0", f"{good_redis.url}/1", sqlite_url)
    result = doctor(*urls, "--json", **bad)
    assert result.returncode == 1, result.stdout + result.stderr
    refused = [f for f in json.loads(result.stdout)["findings"] if f["id"] == "settings-refused"]
    assert [f["subject"] for f in refused] == [
        "recovery_zombie_threshold",
        "recovery_sweep_interval",
    ]

    # An app that installs Recovery at import cannot even be loaded: one line, exit 2.
    installed = doctor(*urls, DOCTOR_TEST_INSTALL="1", **bad)
    assert installed.returncode == 2
    assert "Traceback" not in installed.stderr
    assert "recovery_zombie_threshold=5s is shorter than 3 heartbeat intervals" in installed.stderr
