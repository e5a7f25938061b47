"""Where the test services are, and what to do when one is missing.

Locally a missing service skips its tests with the reason; in CI
(``CI=true``) it fails them, so a broken CI machine cannot pass by skipping.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

import pytest

REDIS_URL = os.environ.get("RECOVERY_TEST_REDIS", "redis://127.0.0.1:6379")
#: The tests' broker database; the result backend uses the next one.  Two test
#: sessions on one Redis need different numbers (each flushes its own at start).
BROKER_DB = int(os.environ.get("RECOVERY_TEST_REDIS_DB", "9"))
BACKEND_DB = BROKER_DB + 1
RABBITMQ_URL = os.environ.get("RECOVERY_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")
PG_ADMIN_URL = os.environ.get(
    "RECOVERY_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def answering(url: str, default_port: int) -> bool:
    parsed = urlparse(url.replace("+psycopg", ""))
    try:
        with socket.create_connection((parsed.hostname, parsed.port or default_port), timeout=1):
            return True
    except OSError:
        return False


def require(name: str, url: str, default_port: int) -> None:
    if answering(url, default_port):
        return
    message = f"{name} is not answering at {url}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: service tests must not be skipped)", pytrace=False)
    pytest.skip(f"{message}; start it to run this test")
