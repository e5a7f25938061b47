"""The ``celery-recovery`` command and its ``celery recovery`` form."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

from celery_recovery.cli import recovery
from celery_recovery.store.migrate import head_revision
from tests.services import PG_ADMIN_URL, require
from tests.workers import ROOT


def run(*args, env=None):
    return CliRunner().invoke(recovery, list(args), env=env, catch_exceptions=False)


def test_db_upgrade_then_current_on_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.sqlite3'}"
    result = run("--database-url", url, "db", "current")
    assert result.exit_code == 1 and "needs upgrade" in result.output
    result = run("--database-url", url, "db", "upgrade")
    assert result.exit_code == 0 and f"schema none -> {head_revision()}" in result.output
    result = run("--database-url", url, "db", "current")
    assert result.exit_code == 0 and "up to date" in result.output


def test_db_upgrade_on_postgres_masks_the_password():
    require("PostgreSQL", PG_ADMIN_URL, 5432)
    name = f"celery_recovery_cli_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        base = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgres@", "postgres:s3cret@")
        result = run("--database-url", f"{base}/{name}", "db", "upgrade")
        assert result.exit_code == 0, result.output
        assert "s3cret" not in result.output and "***" in result.output
        assert run("--database-url", f"{base}/{name}", "db", "current").exit_code == 0
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_unsupported_url_is_one_clear_line():
    result = run("--database-url", "mysql://root:pw@db/x", "db", "upgrade")
    assert result.exit_code == 2
    assert "recovery_database_url" in result.output and "'mysql'" in result.output
    assert "pw@" not in result.output and "Traceback" not in result.output


def test_unreachable_database_is_one_clear_line():
    result = run("--database-url", "postgresql://u:pw@127.0.0.1:1/x", "db", "upgrade")
    assert result.exit_code == 2
    assert "db upgrade failed" in result.output and "Traceback" not in result.output
    assert ":pw@" not in result.output


def test_unimportable_app_is_a_usage_error():
    result = run("--app", "no_such_module_here", "db", "current")
    assert result.exit_code == 2 and "cannot import app" in result.output


def test_celery_recovery_subcommand_uses_the_app(tmp_path):
    url = f"sqlite:///{tmp_path / 'from-app.sqlite3'}"
    env = {
        **os.environ,
        "CELERY_RECOVERY_DATABASE_URL": url,
        "RECOVERY_TEST_PLAIN": "0",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.apps.lifecycle", "recovery", "db", "upgrade"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"from-app.sqlite3: schema none -> {head_revision()}" in done.stdout


@pytest.mark.parametrize("command", [["--help"], ["db", "--help"], ["db", "upgrade", "--help"]])
def test_help_has_an_example(command):
    result = run(*command)
    assert result.exit_code == 0 and "Example" in result.output
