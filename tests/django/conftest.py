"""A real Django project (tests/django/project) for the tests of a Django shop's setup.

Its database is a PostgreSQL database of the session's own, migrated by the
project's ``manage.py migrate`` (django-celery-results, django-celery-beat, the
admin, the project's app).  Its workers, beats and sweepers run as real
subprocesses started from the project's folder, as `celery -A djproj ...` is run
in a Django project.

The test process reads and edits the project's models through Django set up with
:func:`django.conf.settings.configure` (fixture ``django_orm``), never through
``DJANGO_SETTINGS_MODULE``: Celery installs its Django fixup on every app created
while that variable is set, and the rest of the suite's apps must stay plain.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_recovery.recovery import recovery_for_app
from tests.conftest import app_env
from tests.services import BACKEND_DB, PG_ADMIN_URL, REDIS_URL, create_pg_database, require
from tests.workers import ROOT, SessionProcess, WorkerProcess

PROJECT = Path(__file__).resolve().parent / "project"
#: The project's Celery app, as `celery -A` names it from the project's folder.
APP = "djproj"


def project_env(database: str) -> dict[str, str]:
    """What the project's processes need besides the test's broker, queue and store."""
    return {
        "RECOVERY_TEST_DJANGO_DB": database,
        "RECOVERY_TEST_DJANGO_CACHE": f"{REDIS_URL}/{BACKEND_DB}",
        "DJANGO_SETTINGS_MODULE": "djproj.settings",
    }


@pytest.fixture(scope="session")
def django_database() -> Iterator[str]:
    """The project's database, migrated by its ``manage.py migrate``: its name."""
    require("PostgreSQL", PG_ADMIN_URL, 5432)
    url, drop = create_pg_database("celery_recovery_django", revision=None)
    name = url.rsplit("/", 1)[1]
    migrated = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=PROJECT,
        env={**os.environ, **project_env(name), "PYTHONPATH": f"{PROJECT}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    yield name
    drop()


@pytest.fixture(scope="session")
def django_orm(django_database: str) -> Any:
    """Django set up in the test process on the project's database: its models can be
    read and edited here (the admin's test client, PeriodicTask edits, BodyRun rows)."""
    import django
    from django.conf import settings

    if str(PROJECT) not in sys.path:
        sys.path.insert(0, str(PROJECT))
    if not settings.configured:
        settings.configure(**in_process_settings(django_database))
        django.setup()
    return settings


def in_process_settings(database: str) -> dict[str, Any]:
    """The project's settings, without importing its package (which creates its Celery app)."""
    if str(PROJECT) not in sys.path:
        sys.path.insert(0, str(PROJECT))
    import common_settings as common

    return {
        "SECRET_KEY": "tests-only-not-a-secret",
        "DEBUG": False,
        "ALLOWED_HOSTS": ["*"],
        "USE_TZ": True,
        "TIME_ZONE": "UTC",
        "INSTALLED_APPS": common.INSTALLED_APPS,
        "MIDDLEWARE": common.MIDDLEWARE,
        "ROOT_URLCONF": "tests.django.urls",
        "TEMPLATES": common.TEMPLATES,
        "STATIC_URL": "static/",
        "DEFAULT_AUTO_FIELD": "django.db.models.BigAutoField",
        "CACHES": {
            "default": {
                "BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": f"{REDIS_URL}/{BACKEND_DB}",
            }
        },
        "DATABASES": {"default": common.database(database)},
    }


@pytest.fixture
def store_url(pg_url: str) -> str:
    """A Django shop's store: PostgreSQL, beside Django's own database."""
    return pg_url


@pytest.fixture
def django_backend() -> str:
    """The project's result backend: ``django-db`` (django-celery-results' TaskResult) unless
    a test parametrizes ``django-cache``."""
    return "django-db"


@pytest.fixture
def django_env(
    django_database: str,
    store_url: str,
    broker_urls: tuple[str, str],
    queue: str,
    django_backend: str,
) -> dict[str, str]:
    """Environment of the project's processes: the test's broker, queue and store, the
    fast settings, and the project's database and result backend."""
    return {
        **app_env(store_url, broker_urls, queue),
        **project_env(django_database),
        "RECOVERY_TEST_DJANGO_BACKEND": django_backend,
    }


@pytest.fixture
def start_django_worker(
    django_env: dict[str, str], queue: str, tmp_path: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    """Start `celery -A djproj worker` from the project's folder; SIGKILLed at teardown."""
    workers: list[WorkerProcess] = []

    def start(name: str | None = None, concurrency: int = 2, **env: str) -> WorkerProcess:
        name = name or f"w{len(workers) + 1}"
        worker = WorkerProcess(
            APP,
            {**django_env, **env},
            tmp_path / f"{name}.log",
            concurrency=concurrency,
            name=name,
            queue=queue,
            cwd=PROJECT,
        )
        workers.append(worker)
        return worker.wait_ready()

    yield start
    for worker in workers:
        worker.kill()


@pytest.fixture
def start_django_process(
    django_env: dict[str, str], tmp_path: Path
) -> Iterator[Callable[..., SessionProcess]]:
    """Start another `celery -A djproj ...` command (``recovery sweep --loop``, ``beat``,
    ``recovery triggerer``) from the project's folder; SIGKILLed at teardown."""
    procs: list[SessionProcess] = []

    def start(*args: str, name: str | None = None, **env: str) -> SessionProcess:
        name = name or f"{args[0]}-{len(procs) + 1}"
        command = [sys.executable, "-m", "celery", "-A", APP, *args]
        proc = SessionProcess(command, {**django_env, **env}, tmp_path / f"{name}.log", PROJECT)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


@pytest.fixture
def django_client_app(make_client_app: Callable[..., Any], store_url: str) -> Any:
    """A publishing app in the test process, with celery-recovery on the test's store.

    Tasks are sent by name (``shop.tasks.work``): the project's task modules are the
    workers', not this process's."""
    return make_client_app(store_url)


def close_installation(app: Any) -> None:
    installed = recovery_for_app(app)
    if installed is not None:
        installed.close()


@pytest.fixture
def beat_models(django_orm: Any) -> Iterator[Any]:
    """django-celery-beat's models, emptied before and after the test."""
    from django_celery_beat import models

    def empty() -> None:
        models.PeriodicTask.objects.all().delete()
        for schedule in (
            models.IntervalSchedule,
            models.CrontabSchedule,
            models.ClockedSchedule,
            models.SolarSchedule,
        ):
            schedule.objects.all().delete()

    empty()
    yield models
    empty()
