"""Settings are resolved the way Celery resolves its own, including Django's namespace.

Most Celery apps (every Django one) load their configuration with
``config_from_object(settings, namespace="CELERY")``; our settings are then
``CELERY_RECOVERY_*``.  A store silently different from the configured one
would lose every recovery, so a store setting that would not be read is refused.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types

import pytest
from celery import Celery

from celery_recovery import ConfigurationError, RecoverySettings, TaskState
from celery_recovery.store import Store
from tests.workers import ROOT, WorkerProcess, wait_for


def configured(namespace: str | None = "CELERY", **settings) -> Celery:
    app = Celery("namespaced-test", set_as_current=False)
    app.config_from_object(types.SimpleNamespace(**settings), namespace=namespace)
    return app


def test_namespaced_settings_are_read(tmp_path):
    store = f"sqlite:///{tmp_path / 'configured.sqlite3'}"
    app = configured(
        CELERY_BROKER_URL="redis://cache:6379/0",
        CELERY_RECOVERY_DATABASE_URL=store,
        CELERY_RECOVERY_PRESET="kubernetes",
        CELERY_RECOVERY_QUEUED_TIMEOUT=42,
    )
    s = RecoverySettings.from_app(app)
    assert s.database_url == store
    assert s.preset == "kubernetes" and s.zombie_threshold == 10  # the preset's value
    assert s.queued_timeout == 42
    assert s.redis_url == "redis://cache:6379/0", "the broker is found through the namespace"


def test_lower_case_names_are_read_under_a_namespace_too(tmp_path):
    # Celery tries the bare lower-case name after the namespaced one.
    app = configured(recovery_queued_timeout=43)
    assert RecoverySettings.from_app(app).queued_timeout == 43
    app = configured(recovery_queued_timeout=43, CELERY_RECOVERY_QUEUED_TIMEOUT=44)
    assert RecoverySettings.from_app(app).queued_timeout == 44, "namespaced first, as Celery"


def test_unprefixed_key_under_a_namespace_is_not_read_and_warned(caplog):
    app = configured(RECOVERY_QUEUED_TIMEOUT=45)
    with caplog.at_level(logging.WARNING, "celery_recovery"):
        with pytest.warns(UserWarning, match="'RECOVERY_QUEUED_TIMEOUT' is not read"):
            s = RecoverySettings.from_app(app)
        RecoverySettings.from_app(app)  # warned once per app and key
    assert s.queued_timeout == 600
    (record,) = [r for r in caplog.records if "RECOVERY_QUEUED_TIMEOUT" in r.getMessage()]
    assert "rename it to 'CELERY_RECOVERY_QUEUED_TIMEOUT'" in record.getMessage()


def test_a_store_setting_that_would_not_be_read_is_refused():
    app = configured(RECOVERY_DATABASE_URL="postgresql://u:secret@db/shop")
    with pytest.raises(ConfigurationError) as err:
        RecoverySettings.from_app(app)
    message = str(err.value)
    assert "'RECOVERY_DATABASE_URL' is not read" in message
    assert "'CELERY_RECOVERY_DATABASE_URL'" in message and "secret" not in message

    app = configured(None, CELERY_RECOVERY_DATABASE_URL="postgresql://db/shop")
    with pytest.raises(ConfigurationError, match="namespace='CELERY'"):
        RecoverySettings.from_app(app)


def test_an_unread_store_setting_equal_to_the_one_used_is_only_warned():
    app = configured(
        CELERY_RECOVERY_DATABASE_URL="postgresql://db/shop",
        RECOVERY_DATABASE_URL="postgres://db/shop",
    )
    with pytest.warns(UserWarning, match="RECOVERY_DATABASE_URL"):
        assert RecoverySettings.from_app(app).database_url == "postgresql+psycopg://db/shop"


def test_unknown_namespaced_name_gets_a_hint_in_the_apps_spelling():
    app = configured(CELERY_RECOVERY_ZOMBIE_TRESHOLD=30)
    with pytest.raises(ConfigurationError, match="did you mean 'CELERY_RECOVERY_ZOMBIE_THRESHOLD'"):
        RecoverySettings.from_app(app)


def test_bad_namespaced_value_names_the_key_as_written():
    app = configured(CELERY_RECOVERY_SWEEP_INTERVAL="often")
    with pytest.raises(ConfigurationError, match="CELERY_RECOVERY_SWEEP_INTERVAL='often'"):
        RecoverySettings.from_app(app)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_RECOVERY_")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def test_db_upgrade_migrates_the_namespaced_store(tmp_path):
    store = tmp_path / "configured.sqlite3"
    env = _clean_env(RECOVERY_TEST_NAMESPACED_STORE=f"sqlite:///{store}")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.apps.namespaced",
            "recovery",
            "db",
            "upgrade",
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert str(store) in done.stdout
    assert store.exists() and not (cwd / "celery_recovery.sqlite3").exists()


@pytest.mark.slow
def test_a_namespaced_worker_records_into_the_configured_store(
    store_url, broker_urls, queue, tmp_path
):
    env = _clean_env(
        RECOVERY_TEST_NAMESPACED_STORE=store_url,
        RECOVERY_TEST_BROKER=broker_urls[0],
        RECOVERY_TEST_BACKEND=broker_urls[1],
        RECOVERY_TEST_QUEUE=queue,
    )
    worker = WorkerProcess(
        "tests.apps.namespaced", env, tmp_path / "w.log", concurrency=1, queue=queue
    ).wait_ready()
    try:
        app = Celery(broker=broker_urls[0], backend=broker_urls[1], set_as_current=False)
        result = app.send_task("namespaced.add", (2, 3), queue=queue)
        assert result.get(timeout=15) == 5
        store = Store(store_url)
        try:
            record = wait_for(
                lambda: [
                    t for t in store.tries.history(result.id) if t["state"] == TaskState.SUCCESS
                ],
                15,
                what="the try recorded in the configured store",
            )[0]
            assert record["task_name"] == "namespaced.add"
            assert store.jobs.get_job(record["job_id"]) is not None, "and the worker's job"
        finally:
            store.dispose()
    finally:
        worker.kill()
