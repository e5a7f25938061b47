"""A real headless browser for the console: Debian's chromium and its driver, never a download."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.services import free_port, in_ci
from tests.workers import ROOT, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def require_browser() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if not missing:
        return
    message = f"{', '.join(missing)} missing (apt-get install -y chromium chromium-driver)"
    if in_ci():
        pytest.fail(f"{message}; CI=true: browser tests must not be skipped", pytrace=False)
    pytest.skip(message)


@contextmanager
def browser(width: int = 1280, height: int = 900) -> Iterator[object]:
    """Headless chromium driven through selenium, pointed at the system binaries."""
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
        "--hide-scrollbars",
    ):
        options.add_argument(flag)
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not fetch anything
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


#: ``celery -A <the tests' app> recovery``: the console with the app's settings.
CELERY_RECOVERY = [sys.executable, "-m", "celery", "-A", "tests.apps.lifecycle", "recovery"]


@contextmanager
def served_console(log: Path, env: dict[str, str], *options: str) -> Iterator[str]:
    """``celery -A app recovery web`` as a real process on a free port; its base URL."""
    import urllib.request

    port = free_port()
    command = [*CELERY_RECOVERY, "web", "--port", str(port), *options]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/api/jobs", timeout=2) as response:
                return response.status == 200
        except OSError:
            assert proc.poll() is None, log.read_text()
            return False

    try:
        wait_for(up, 20, interval=0.2, what="the console to serve")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def console_errors(driver: object) -> list[str]:
    """The browser console's errors since the last call (a CSP violation is one)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
