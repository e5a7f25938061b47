"""The console over a test store, as an HTTP client or a served URL."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient

from celery_recovery.core.settings import RecoverySettings
from celery_recovery.web.app import create_app, secured


def console_client(
    store_url: str, bind: str = "127.0.0.1", show_args: bool = False, **settings: Any
) -> TestClient:
    """An HTTP client of the console (auth and headers included) over ``store_url``."""
    values = RecoverySettings.from_sources({}, {}, {"database_url": store_url, **settings})
    app = create_app(values, show_args=show_args)
    return TestClient(secured(app, values, bind), base_url="http://127.0.0.1:9809")
