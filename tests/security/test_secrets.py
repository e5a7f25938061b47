"""Claim: passwords never appear in logs, CLI output or exceptions
(docs/security.md, "Passwords").

Every URL here carries the password ``s3cret`` and points at a port where
nothing listens (or a server that is then cut off), so every command and
code path takes its error branch, the one most likely to print a URL whole.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
from celery import Celery
from click.testing import CliRunner

from celery_recovery import Recovery
from celery_recovery.cli import recovery as cli
from celery_recovery.core.errors import ConfigurationError, RecoveryError, StoreUnavailableError
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.core.urls import mask_secrets, mask_url
from tests.proxy import TcpProxy
from tests.security.secret_app import BROKER_URL, DATABASE_URL, SECRET
from tests.workers import ROOT, wait_for

APP = "tests.security.secret_app:app"
BAD_PORT_REDIS = f"redis://u:{SECRET}@127.0.0.1:x/0"

#: Every command that reads the store or Redis, as the operator would type it.
COMMANDS: list[list[str]] = [
    ["db", "upgrade"],
    ["db", "current"],
    ["db", "clean", "--before", "1d", "--yes"],
    ["db", "clean", "--before", "1d", "--dry-run"],
    ["inspect", "zombies"],
    ["inspect", "orphans", "--json"],
    ["inspect", "deferred"],
    ["inspect", "jobs", "--all"],
    ["inspect", "tasks", "--state", "failed"],
    ["inspect", "locks"],
    ["jobs", "check", "--job-type", "worker"],
    ["jobs", "check", "--job-type", "beat", "--local"],
]
#: Commands that need the app (they publish or run triggers).
APP_COMMANDS: list[list[str]] = [["sweep"], ["sweep", "--json"]]


def without_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text, text


def invoke(args: list[str], env: dict[str, str] | None = None):
    result = CliRunner().invoke(cli, args, env=env)
    assert not isinstance(result.exception, RecoveryError), "".join(
        traceback.format_exception(result.exception)
    )
    return result


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize(
    "how", ["--database-url", "environment", "--app"], ids=["option", "env", "app"]
)
def test_cli_commands_with_an_unreachable_store_never_print_its_password(command, how, caplog):
    caplog.set_level(logging.DEBUG)
    env = {"CELERY_RECOVERY_REDIS_URL": f"redis://u:{SECRET}@127.0.0.1:1/0"}
    prefix = {"--database-url": ["--database-url", DATABASE_URL], "--app": ["--app", APP]}
    if how == "environment":
        env["CELERY_RECOVERY_DATABASE_URL"] = DATABASE_URL
    result = invoke([*prefix.get(how, []), *command], env=env)
    assert result.exit_code == 2, result.output
    without_secret(result.output, result.stderr, caplog.text)
    assert "***" in result.stderr  # the URL is named, masked, so the operator knows which


@pytest.mark.parametrize("command", APP_COMMANDS, ids=" ".join)
def test_a_sweep_with_an_unreachable_store_logs_no_password(command, caplog):
    caplog.set_level(logging.DEBUG)
    result = invoke(["--app", APP, *command])
    assert result.exit_code == 1  # a single pass that hit errors fails
    # Every step failed on the store, and said so without the password.
    errors = re.search(r'errors(?:=|": )(\d+)', result.output)
    assert errors is not None and int(errors.group(1)) >= 4, result.output
    without_secret(result.output, result.stderr, caplog.text)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("recovery_redis_url", BAD_PORT_REDIS),
        ("recovery_redis_url", f"http://u:{SECRET}@h/0"),
        ("recovery_database_url", f"postgresql://u:{SECRET}@127.0.0.1:notaport/db"),
        ("recovery_database_url", f"mysql://u:{SECRET}@127.0.0.1/db"),
        ("recovery_database_url", f"u:{SECRET}@127.0.0.1/db"),
        ("recovery_database_url", f"sqlite://u:{SECRET}@/:memory:"),
    ],
)
def test_bad_urls_are_refused_by_setting_name_with_the_password_masked(setting, value):
    with pytest.raises(ConfigurationError) as refused:
        RecoverySettings.from_sources(conf={setting: value}, environ={})
    assert setting in str(refused.value)
    without_secret(str(refused.value), repr(refused.value))
    # The CLI turns the same mistake into one line on stderr, exit status 2.
    key = "CELERY_RECOVERY_" + setting.removeprefix("recovery_").upper()
    result = invoke(["inspect", "locks"], env={key: value})
    assert result.exit_code == 2 and "Traceback" not in result.output
    without_secret(result.output, result.stderr)


def test_store_errors_and_reprs_mask_the_password_down_the_whole_chain():
    app = Celery("masked", broker=BROKER_URL, set_as_current=False)
    installed = Recovery(app, database_url=DATABASE_URL)
    try:
        without_secret(repr(installed), repr(installed.store), repr(installed.settings))
        without_secret(str(installed.settings), installed.settings.masked_database_url)
        with pytest.raises(StoreUnavailableError) as down:
            installed.store.ensure_ready()
        without_secret(str(down.value), *traceback.format_exception(down.value))
    finally:
        installed.close()
        app.close()


@pytest.mark.parametrize(
    "url",
    [
        DATABASE_URL,
        BROKER_URL,
        f"rediss://:{SECRET}@host:6380/0",
        f"postgresql://u:p@{SECRET}@host/db",  # an unencoded @ in the password
        f"u:{SECRET}@host",
    ],
)
def test_mask_url_and_mask_secrets_hide_every_password_form(url):
    without_secret(mask_url(url), mask_secrets(f"failed on {url}: refused"))
    assert "***" in mask_url(url)


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "celery_recovery.cli", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_the_installed_command_never_prints_the_password_on_stdout_or_stderr():
    """The same commands as real processes: what an operator's terminal and logs see."""
    env = {"CELERY_RECOVERY_REDIS_URL": f"redis://u:{SECRET}@127.0.0.1:1/0"}
    runs = [run_cli(["--database-url", DATABASE_URL, *c], env) for c in COMMANDS]
    runs += [run_cli(["--app", APP, *c], env) for c in APP_COMMANDS]
    runs.append(run_cli(["inspect", "locks"], {"CELERY_RECOVERY_REDIS_URL": BAD_PORT_REDIS}))
    for proc in runs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode in (0, 1, 2), (proc.args, out, err)
        without_secret(out, err)
        if proc.args[-1] != "--json" and proc.args[-1] != "sweep":
            assert "Traceback" not in err, err


def test_the_triggerer_with_its_store_down_logs_no_password(tmp_path: Path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery_recovery.cli", "--app", APP, "triggerer"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=open(tmp_path / "triggerer.log", "wb"),  # noqa: SIM115 - closed with the process
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        log = tmp_path / "triggerer.log"
        wait_for(lambda: "metadata store failed" in log.read_text(), 30, what="store warning")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    without_secret(log.read_text())
    assert "u:***@127.0.0.1:1/db" in log.read_text()


@pytest.mark.slow
def test_worker_warnings_while_the_store_is_down_mask_the_password(
    pg_url, make_client_app, start_worker
):
    """The write-behind and health warnings of a worker whose store goes away."""
    proxy = TcpProxy("127.0.0.1", 5432).start()
    # Local connections are trusted: the password is sent and ignored.
    url = pg_url.replace("postgres@127.0.0.1:5432", f"postgres:{SECRET}@127.0.0.1:{proxy.port}")
    assert SECRET in url
    worker = start_worker(store_url=url, concurrency=1)
    client = make_client_app(pg_url)
    assert client.send_task("lifecycle.add", (1, 1)).get(timeout=30) == 2
    proxy.cut()
    results = [client.send_task("lifecycle.add", (i, 1)) for i in range(5)]
    assert [r.get(timeout=30) for r in results] == [i + 1 for i in range(5)]
    wait_for(lambda: "failed while" in worker.log, 30, what="the store-down warning")
    without_secret(worker.log)
    assert f"postgres:***@127.0.0.1:{proxy.port}" in worker.log
