"""What the operator commands share: the app and settings the command line names,
the store of those settings, and turning failures into one line and exit status 2
instead of a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from celery_recovery.core.errors import RecoveryError
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.core.states import JobType
from celery_recovery.core.urls import mask_secrets
from celery_recovery.recovery import Recovery
from celery_recovery.store import Store


class CLIError(click.ClickException):
    """A user error: one line on stderr and exit status 2."""

    exit_code = 2


def load_app(spec: str) -> Any:
    from celery.app.utils import find_app

    try:
        return find_app(spec)
    # ValueError: Celery's "Couldn't import" around any error of the module, such as
    # Recovery(app) refusing its settings at import.
    except (ImportError, AttributeError, ValueError) as exc:
        raise click.BadParameter(f"cannot import app {spec!r}: {exc}", param_hint="--app") from None


def start_app(ctx: click.Context) -> Any:
    """The command's app, started as `celery worker` and `celery beat` start theirs.

    Their loader imports its default modules first: that fires the framework fixups
    (Django's calls ``django.setup()``, without which a ``django-db`` result backend
    cannot be asked anything) and imports the task modules (``imports``, ``include``,
    ``autodiscover_tasks``), whose classes a failure callback needs.  Once per command.
    """
    options = ctx.find_root().meta.setdefault("celery_recovery", {})
    app = options.get("app")
    if app is None or options.get("started"):
        return app
    try:
        app.loader.import_default_modules()
    except Exception as exc:
        raise CLIError(
            f"cannot start app {app.main or app!r} as a worker would: importing its modules "
            f"failed: {type(exc).__name__}: {exc}"
        ) from None
    options["started"] = True
    return app


def settings_of(ctx: click.Context) -> RecoverySettings:
    options = ctx.find_root().meta.setdefault("celery_recovery", {})
    if "settings" in options:
        return options["settings"]
    app = start_app(ctx)
    overrides = {"database_url": options["database_url"]} if options.get("database_url") else {}
    try:
        if app is not None:
            settings = RecoverySettings.from_app(app, **overrides)
        else:
            settings = RecoverySettings.from_sources(overrides=overrides)
    except RecoveryError as exc:
        raise CLIError(str(exc)) from None
    options["settings"] = settings
    return settings


def installed_recovery(ctx: click.Context, why: str) -> Any:
    """celery-recovery installed on the command's app (``--app``), with ``--database-url``."""
    options = ctx.find_root().meta.get("celery_recovery", {})
    app = start_app(ctx)
    if app is None:
        raise CLIError(f"{why}: pass --app (or use `celery -A proj recovery ...`)")
    overrides = {}
    if options.get("database_url"):
        overrides["database_url"] = options["database_url"]
    try:
        return Recovery(app, **overrides)
    except RecoveryError as exc:
        raise CLIError(str(exc)) from None


def first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextmanager
def store_of(ctx: click.Context) -> Iterator[tuple[Store, RecoverySettings]]:
    """The store named by ``--database-url`` / the app, closed afterwards.

    A store error (unreachable, schema missing) becomes a :class:`CLIError`.
    """
    settings = settings_of(ctx)
    store = Store(settings.database_url, settings.database_pooler)
    try:
        yield store, settings
    except RecoveryError as exc:
        raise CLIError(mask_secrets(str(exc))) from None
    finally:
        store.dispose()


def dead_after(job_type: str, settings: RecoverySettings) -> float:
    """Heartbeat age, in seconds, that makes a job of this type dead (as the sweeps judge)."""
    if job_type == JobType.WORKER.value:
        return settings.zombie_threshold
    return settings.health_check_threshold
