"""The console in a real browser while a real worker is SIGKILLed mid-task.

It also takes the screenshots in docs/console/ (shown in docs/console.md) when run with
RECOVERY_TEST_SCREENSHOTS=docs.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import pytest
import redis
from selenium.webdriver.common.by import By

from celery_recovery.locks.redis_lock import IdempotencyLocks
from celery_recovery.web.app import REFRESH_SECONDS
from tests.builders import add_trigger, add_try
from tests.conftest import FAST_SETTINGS, app_env
from tests.services import BROKER_DB
from tests.sweeps.helpers import running_try, sweep_until, try_started
from tests.web.browser import browser, console_errors, require_browser, served_console
from tests.workers import ROOT, wait_for

pytestmark = pytest.mark.slow

#: Where the screenshots go: docs/console/ when asked to refresh the documentation's
#: (RECOVERY_TEST_SCREENSHOTS=docs), else a temporary folder, so a run leaves the tree clean.
DOC_SCREENSHOTS = ROOT / "docs" / "console"
PAGES = ("overview", "recoveries", "task", "jobs", "deferred", "callbacks", "locks")


def text_of(driver, css: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, css).text


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_killed_workers_task_is_told_in_the_console(
    client_app, store, store_url, start_worker, redis_service, broker_urls, queue, tmp_path
):
    require_browser()
    # Given a worker running a task, and a second one to take over
    doomed = start_worker(name="doomed", concurrency=1)
    result = client_app.send_task("lifecycle.ledger_sleep", (str(tmp_path / "ledger"), 4, 0.1))
    first = running_try(store, result.id)
    dead = store.jobs.get_job(first["job_id"])
    start_worker(name="survivor", concurrency=1)
    # When it is SIGKILLed and the sweep recovers its task
    doomed.kill()
    threshold = FAST_SETTINGS["zombie_threshold"] + FAST_SETTINGS["sweep_interval"]
    # (recovery speed is test_zombies's to check; here only the console is, so wait generously)
    sweep_until(client_app, lambda: try_started(store, result.id, 2), threshold + 45, "try 2")
    assert result.get(timeout=30) == 4
    wait_for(
        lambda: store.tries.history(result.id)[-1]["state"] == "success", 10, what="try 2 success"
    )
    # (a waiting deferred task and a held lock, so that every page has something to show)
    add_trigger(store, add_try(store, "deferred", task_name="lifecycle.wait_for_payment"), None)
    locks_url = f"{redis_service}/{BROKER_DB}"
    key = f"charge:order-{uuid.uuid4().hex[:6]}"
    lock = IdempotencyLocks.lock_key(key)
    redis.Redis.from_url(locks_url).set(lock, "survivor@host:4711|3", px=120_000)

    env = app_env(store_url, broker_urls, queue)
    with served_console(tmp_path / "console.log", env) as url, browser() as driver:
        # Then Recoveries names the try and the process that died (host and pid)
        driver.get(f"{url}/recoveries?action=republished")
        row = text_of(driver, "#recoveries tbody tr")
        assert result.id in row and "try 1" in row and "worker_lost" in row
        assert f"{dead['hostname']} pid {dead['pid']}" in row
        shots = {"recoveries": _shot(driver, "recoveries")}
        # And the task page tells try 1 up_for_retry, then try 2 success
        driver.get(f"{url}/tasks?q={result.id}")  # the search goes straight to the task
        timeline = text_of(driver, "#timeline")
        assert timeline == "try 1 up_for_retry → try 2 success", timeline
        assert f"{dead['hostname']} pid {dead['pid']}" in text_of(driver, "#try-1")
        shots["task"] = _shot(driver, "task")
        # And every other page renders from the same store
        for page in ("overview", "jobs", "deferred", "callbacks", "locks"):
            driver.get(f"{url}/" if page == "overview" else f"{url}/{page}")
            assert "celery-recovery" in driver.title
            shots[page] = _shot(driver, page)
            if page == "locks":
                assert key in text_of(driver, "main")
        # And nothing was blocked or broken (the CSP allows the console's own files only)
        assert console_errors(driver) == []
        # And auto-refresh, once ticked, reloads the page and stays on
        driver.get(f"{url}/")
        driver.execute_script("window.notReloaded = true")
        driver.find_element(By.ID, "auto-refresh").click()
        reload = REFRESH_SECONDS + 10
        wait_for(lambda: driver.execute_script("return !window.notReloaded"), reload, what="reload")
        assert driver.find_element(By.ID, "auto-refresh").is_selected()
    redis.Redis.from_url(locks_url).delete(lock)
    assert set(shots) == set(PAGES)


def _shot(driver, name: str) -> Path:
    folder = (
        DOC_SCREENSHOTS
        if os.environ.get("RECOVERY_TEST_SCREENSHOTS") == "docs"
        else Path(tempfile.gettempdir()) / "celery-recovery-console-shots"
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
