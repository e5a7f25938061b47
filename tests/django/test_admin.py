"""The celery-recovery pages of Django's admin (celery_recovery.contrib.django), through
Django's test client, over a real store.

The store holds a real run: a worker of the project SIGKILLed mid-task, a sweep,
the try run again by another worker.  Users live in the project's database shared
by the session: each test makes its own, with a name of its own, and deletes them.
"""

from __future__ import annotations

import ast
import html
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import celery_recovery
from celery_recovery.core.errors import ConfigurationError
from celery_recovery.recovery import recovery_for_app
from tests.builders import add_job, add_try, make_zombie
from tests.django import admin_app
from tests.sweeps.helpers import running_try, sweep_until, try_started

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

ADMIN = "/admin/celery_recovery"
PAGES = {
    "tries": f"{ADMIN}/try/",
    "recoveries": f"{ADMIN}/recovery/",
    "jobs": f"{ADMIN}/job/",
    "schedules": f"{ADMIN}/schedule/",
}
#: A page of each kind, a task's history included.
EVERY_PAGE = [*PAGES.values(), f"{ADMIN}/try/some-task-id/"]
#: A page of each kind that reads the store (Tries lists nothing until a choice is made).
READING_PAGES = [*EVERY_PAGE[1:], f"{PAGES['tries']}?state=running"]


@pytest.fixture
def admin_store(django_orm: Any, django_client_app: Any) -> Iterator[Any]:
    """The admin reads the test's store: ``CELERY_RECOVERY_APP`` names the test's app."""
    from django.test import override_settings

    admin_app.app = django_client_app
    with override_settings(CELERY_RECOVERY_APP="tests.django.admin_app:app"):
        yield django_client_app
    admin_app.app = None


@pytest.fixture
def make_user(django_orm: Any) -> Iterator[Callable[..., Any]]:
    """Users of the shared project database, each named uniquely, deleted afterwards."""
    from django.contrib.auth.models import Permission, User

    made: list[Any] = []

    def make(*, staff: bool = True, permitted: bool = False, superuser: bool = False) -> Any:
        name = f"admin-pages-{uuid.uuid4().hex[:12]}"
        user = User.objects.create_user(name, is_staff=staff, is_superuser=superuser)
        if permitted:
            perm = Permission.objects.get(
                content_type__app_label="celery_recovery", codename="view_recovery"
            )
            user.user_permissions.add(perm)
        made.append(user)
        return user

    yield make
    for user in made:
        user.delete()


def client_of(user: Any = None) -> Any:
    from django.test import Client

    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def page(client: Any, url: str) -> str:
    """The page at ``url`` (200 expected), as text."""
    response = client.get(url)
    text = str(response.content.decode())
    error = re.search(r'<p class="errornote">(.*?)</p>', text, re.S)
    assert response.status_code == 200, (url, response.status_code, error and error[1])
    return text


def hrefs(text: str, start: str) -> list[str]:
    """The links of a page that start with ``start``, unescaped."""
    return [html.unescape(h) for h in re.findall(r'href="([^"]*)"', text) if h.startswith(start)]


def test_a_killed_workers_task_is_told_in_the_admin(
    admin_store: Any, start_django_worker: Any, store: Any, make_user: Any
) -> None:
    app = admin_store
    # Given a task of the project running on a worker that is then SIGKILLed
    doomed = start_django_worker("doomed", concurrency=1)
    result = app.send_task("shop.tasks.work", args=["card-4242-secret", 0.5, 60.0])
    first = running_try(store, result.id)
    dead = store.jobs.get_job(first["job_id"])
    doomed.kill()
    # When a sweep finds it and a second worker runs it again
    sweep_until(app, lambda: len(store.tries.history(result.id)) > 1, 30, "try 2")
    start_django_worker("survivor", concurrency=1)
    wait_for_try_2 = lambda: try_started(store, result.id, 2)  # noqa: E731
    sweep_until(app, wait_for_try_2, 30, "try 2 to start on the survivor")
    client = client_of(make_user(permitted=True))
    dead_process = f"{dead['hostname']} pid {dead['pid']}"

    # Then the index has the section and its four pages
    index = page(client, "/admin/")
    assert "Celery recovery" in index
    assert set(PAGES.values()) <= set(hrefs(index, ADMIN))
    # And Recoveries names the try, why, and the process that died
    recoveries = page(client, PAGES["recoveries"] + "?action=republished")
    assert result.id in recoveries and "worker_lost" in recoveries
    assert dead_process in recoveries
    # And its task id leads to the task's history: try 1 on the dead process, then try 2
    history_url = f"{ADMIN}/try/{result.id}/"
    assert history_url in hrefs(recoveries, history_url)
    history = page(client, history_url)
    timeline = re.search(r'<p id="timeline">(.*?)</p>', history, re.S)
    assert timeline is not None
    assert re.match(r"try 1 up_for_retry &rarr; try 2 (running|success)$", timeline[1])
    assert dead_process in history and "shop.tasks.work" in history
    # And the arguments stay hidden, as the console hides them
    assert "card-4242-secret" not in history and "hidden" in history
    # And the dead process's job leads to the tries it ran
    job_link = f"{PAGES['tries']}?job={dead['id']}"
    assert job_link in hrefs(history, PAGES["tries"])
    tries = page(client, job_link)
    assert result.id in tries and dead_process in tries
    # And the task's recoveries are one link away from its history
    own = page(client, f"{PAGES['recoveries']}?task_id={result.id}")
    assert "republished" in own and result.id in own
    # And a search by the task id goes straight to its history, by its name lists its tries
    found = client.get(PAGES["tries"], {"q": result.id})
    assert (found.status_code, found["Location"]) == (302, history_url)
    assert result.id in page(client, PAGES["tries"] + "?q=shop.tasks.work")
    # And Jobs shows the dead worker ended and the survivor live, each with its tries
    jobs = page(client, PAGES["jobs"])
    assert dead_process in jobs and job_link in hrefs(jobs, PAGES["tries"])
    live = page(client, PAGES["jobs"] + "?type=worker&state=running")
    assert dead_process not in live and "survivor" in live and "s / 2s" in live
    # And Schedules renders with no HA beat
    assert "No beat entries" in page(client, PAGES["schedules"])


def test_anonymous_users_log_in_and_staff_without_the_permission_are_refused(
    django_orm: Any, make_user: Any
) -> None:
    anonymous, outsider = client_of(), client_of(make_user(staff=False, permitted=True))
    refused = client_of(make_user())
    for url in EVERY_PAGE:
        # Anonymous users and non-staff are sent to the admin's login, as everywhere in it
        for client in (anonymous, outsider):
            response = client.get(url)
            assert response.status_code == 302, url
            assert response["Location"].startswith("/admin/login/?next=")
        # Staff without the permission are refused
        assert refused.get(url).status_code == 403, url
    index = page(refused, "/admin/")
    assert "Celery recovery" not in index and not hrefs(index, ADMIN)
    assert refused.get(f"{ADMIN}/").status_code == 404


def test_superusers_see_every_page_and_nothing_can_be_changed(
    admin_store: Any, make_user: Any
) -> None:
    from django.urls import NoReverseMatch, reverse

    superuser = client_of(make_user(superuser=True))
    index = page(superuser, "/admin/")
    assert set(PAGES.values()) <= set(hrefs(index, ADMIN))
    assert not [h for h in hrefs(index, ADMIN) if h.endswith("/add/")]
    for url in PAGES.values():
        page(superuser, url)
        # Read-only: any method but GET and HEAD is refused
        assert superuser.post(url, {}).status_code == 405, url
        assert superuser.head(url).status_code == 200, url
    assert superuser.get(f"{ADMIN}/try/no-such-task/").status_code == 404
    for view in ("add", "change", "delete", "history"):
        with pytest.raises(NoReverseMatch):
            reverse(f"admin:celery_recovery_try_{view}", args=["x"] if view != "add" else [])


def test_filters_pages_and_escaping(admin_store: Any, store: Any, make_user: Any) -> None:
    # Given three zombies the sweep republished, a late triggerer and a hostile task name
    for i in range(3):
        make_zombie(store, f"zombie-{i}", job_id=f"deadjob{i}", age=60.0)
    assert recovery_for_app(admin_store).sweep().republished == 3
    add_job(store, "triggerer", heartbeat_age=120, hostname="slow-triggerer")
    add_try(store, "failed", task_name="<script>alert(1)</script>", task_id="hostile")
    client = client_of(make_user(permitted=True))
    recoveries = PAGES["recoveries"]

    # When the recoveries are filtered by action, two a page
    first = page(client, recoveries + "?action=republished&limit=2")
    older = [h for h in hrefs(first, "?") if "before=" in h]
    assert len(older) == 1 and "action=republished" in older[0]
    second = page(client, recoveries + older[0])
    # Then between them the pages hold the three decisions
    shown = re.findall(r"zombie-\d", first) + re.findall(r"zombie-\d", second)
    assert sorted(set(shown), reverse=True) == ["zombie-2", "zombie-1", "zombie-0"]
    # And the filters are links, the chosen one marked, keeping the other filters
    assert '<li class="selected"><a href="?action=republished&amp;limit=2">' in first
    assert "?action=republished&limit=2&reason=worker_lost" in hrefs(first, "?")
    assert "zombie-1" in page(client, recoveries + "?reason=worker_lost&action=republished")
    nothing = page(client, recoveries + "?action=failed")
    assert "zombie-" not in nothing and "matching these filters" in nothing
    assert "zombie-" not in page(client, recoveries + "?reason=message_lost")
    # And a state lists its tries; a late triggerer says so
    failed = page(client, PAGES["tries"] + "?state=failed")
    assert "hostile" in failed
    jobs = page(client, PAGES["jobs"] + "?type=triggerer")
    assert "slow-triggerer" in jobs and "<strong>late</strong>" in jobs
    # And what the store holds is escaped, never markup
    assert "<script>alert(1)</script>" not in failed and "&lt;script&gt;" in failed
    # And with no choice made, Tries asks for one instead of sorting every try
    assert "Search a task id or a task name" in page(client, PAGES["tries"])


def test_a_store_that_does_not_answer_is_a_page_that_says_so(
    django_orm: Any, make_user: Any
) -> None:
    from django.test import override_settings

    client = client_of(make_user(permitted=True))
    with override_settings(CELERY_RECOVERY_APP="tests.django.admin_app:unreachable"):
        for url in READING_PAGES:
            response = client.get(url)
            text = response.content.decode()
            assert response.status_code == 503, url
            assert "did not answer" in text and "127.0.0.1:1/nowhere" in text
            assert "not-shown-pw" not in text
        # And the rest of the admin works on
        assert "Celery recovery" in page(client, "/admin/")
    with override_settings(CELERY_RECOVERY_APP="tests.django.no_such_module:app"):
        response = client.get(PAGES["jobs"])
        text = response.content.decode()
        assert response.status_code == 503
        assert "could not be found" in text and "CELERY_RECOVERY_APP" in text


def test_the_current_app_is_used_when_no_app_is_named(django_orm: Any) -> None:
    from celery import Celery, _state

    from celery_recovery.contrib.django.store import celery_app

    previous, default = _state._tls.current_app, _state.default_app
    app = Celery("admin-pages-current")  # current in this thread, as a project's is
    try:
        assert celery_app() is app
        # With no app made, Celery's own fallback app is not taken for the project's
        _state._set_current_app(None)
        _state.set_default_app(None)
        with pytest.raises(ConfigurationError, match="CELERY_RECOVERY_APP"):
            celery_app()
    finally:
        _state._set_current_app(previous)
        _state.set_default_app(default)
        app.close()


def test_the_app_setting_is_not_taken_for_a_store_setting() -> None:
    import types

    from celery import Celery

    from celery_recovery.core.settings import RecoverySettings

    # A Django project's settings, read by Celery under the CELERY namespace
    conf = types.SimpleNamespace(
        CELERY_RECOVERY_APP="proj.celery:app", CELERY_RECOVERY_QUEUED_TIMEOUT=41
    )
    app = Celery("admin-pages-settings", set_as_current=False)
    app.config_from_object(conf, namespace="CELERY")
    assert RecoverySettings.from_app(app).queued_timeout == 41


def test_what_the_console_and_the_admin_share_never_imports_django() -> None:
    # The console (web/) and the store and settings under it run where Django is not
    # installed; only contrib/django (and optional integrations beside it) imports it.
    package = Path(celery_recovery.__file__).parent
    found = []
    for shared in ("web", "core", "store"):
        for path in (package / shared).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                found += [f"{path}: {n}" for n in names if n.split(".")[0] == "django"]
    assert found == []
