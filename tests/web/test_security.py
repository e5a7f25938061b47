"""Who may open the console, what it refuses, and what it never shows."""

from __future__ import annotations

import base64

import pytest
from sqlalchemy.engine import make_url

from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.store import Store
from celery_recovery.web.app import create_app, secured
from tests.builders import add_try
from tests.cli.helpers import run
from tests.web.helpers import console_client

TOKEN = "a-long-enough-console-token"


@pytest.fixture
def sqlite_url(sqlite_url):
    """An SQLite store with its tables (the console never creates them)."""
    store = Store(sqlite_url)
    store.ensure_ready()
    store.dispose()
    return sqlite_url


def test_an_exposed_interface_is_refused_without_a_secret(sqlite_url):
    settings = RecoverySettings.from_sources({}, {}, {"database_url": sqlite_url})
    with pytest.raises(ConfigurationError, match="recovery_web_token"):
        secured(create_app(settings), settings, "0.0.0.0")
    result = run(sqlite_url, "web", "--bind", "0.0.0.0", "--port", "9899")
    assert result.exit_code == 2
    assert "refusing to serve the console on 0.0.0.0" in result.output
    assert "CELERY_RECOVERY_WEB_TOKEN" in result.output


@pytest.mark.parametrize("bind", ["127.0.0.1", "::1", "localhost"])
def test_the_loopback_needs_no_secret(sqlite_url, bind):
    with console_client(sqlite_url, bind=bind) as client:
        assert client.get("/").status_code == 200


def test_a_token_is_required_once_set(sqlite_url):
    with console_client(sqlite_url, bind="0.0.0.0", web_token=TOKEN) as client:
        refused = client.get("/api/overview")
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert client.get("/", headers={"Authorization": "Bearer wrong-token"}).status_code == 401
        ok = client.get("/api/overview", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
        # A link with ?token= is kept in a cookie and dropped from the address
        link = client.get(f"/jobs?type=worker&token={TOKEN}", follow_redirects=False)
        assert link.status_code == 303 and link.headers["location"] == "/jobs?type=worker"
        assert "httponly" in link.headers["set-cookie"].lower()
        assert client.get("/jobs?type=worker").status_code == 200  # the cookie now


def test_basic_credentials(sqlite_url, monkeypatch):
    monkeypatch.setenv("CELERY_RECOVERY_WEB_CREDENTIALS", "oncall:pa55word")
    settings = RecoverySettings.from_sources({}, None, {"database_url": sqlite_url})
    from starlette.testclient import TestClient

    with TestClient(secured(create_app(settings), settings, "0.0.0.0")) as client:
        refused = client.get("/recoveries")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Basic")
        good = base64.b64encode(b"oncall:pa55word").decode()
        bad = base64.b64encode(b"oncall:guess").decode()
        assert client.get("/", headers={"Authorization": f"Basic {bad}"}).status_code == 401
        assert client.get("/", headers={"Authorization": f"Basic {good}"}).status_code == 200


@pytest.mark.parametrize(("setting", "value"), [("web_token", "short"), ("web_credentials", "x")])
def test_weak_secrets_are_refused_naming_the_setting(setting, value):
    with pytest.raises(ConfigurationError, match=f"recovery_{setting}"):
        RecoverySettings.from_sources({}, {}, {setting: value})


def test_security_headers_on_every_response(sqlite_url):
    with console_client(sqlite_url, bind="0.0.0.0", web_token=TOKEN) as client:
        for response in (
            client.get("/"),  # refused
            client.get("/static/console.css", headers={"Authorization": f"Bearer {TOKEN}"}),
            client.get("/api/jobs", headers={"Authorization": f"Bearer {TOKEN}"}),
        ):
            csp = response.headers["content-security-policy"]
            assert "default-src 'none'" in csp and "script-src 'self'" in csp
            assert response.headers["x-frame-options"] == "DENY"
            assert response.headers["x-content-type-options"] == "nosniff"
            assert response.headers["referrer-policy"] == "no-referrer"


def test_no_secret_in_pages(pg_url):
    # Given a store URL with a password (PostgreSQL here trusts local connections)
    url = make_url(pg_url).set(password="s3cret-pw").render_as_string(hide_password=False)
    with console_client(url) as client:
        for path in ("/", "/api/overview", "/jobs", "/recoveries"):
            body = client.get(path).text
            assert "s3cret-pw" not in body
        assert ":***@" in client.get("/").text


def test_arguments_hidden_in_pages(store):
    task_id = add_try(store, "success")
    with console_client(store.url) as client:
        page = client.get(f"/tasks/{task_id}").text
    assert "hidden (start the console with --show-args)" in page


def test_a_store_without_tables_says_how_to_fix_it(tmp_path):
    with console_client(f"sqlite:///{tmp_path / 'empty.sqlite3'}") as client:
        page = client.get("/")
        api = client.get("/api/recoveries")
    assert page.status_code == 503 and "celery-recovery db upgrade" in page.text
    assert api.status_code == 503 and "db upgrade" in api.json()["error"]


def test_without_the_web_extra_the_command_names_it(sqlite_url):
    import subprocess
    import sys

    # A fresh interpreter in which Starlette cannot be imported, as without the extra.
    script = (
        "import sys; sys.modules['starlette'] = None; "
        "from celery_recovery.cli import main; "
        f"sys.argv = ['celery-recovery', '--database-url', {sqlite_url!r}, 'web']; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip install 'celery-recovery[web]'" in done.stderr
