"""The store the admin pages read: the project's Celery app's, opened read-only on first use.

Never at import or when Django starts, so that ``manage.py migrate`` and every
other command work while the store is down; then once per process, like the
console's (:class:`~celery_recovery.web.readonly.ReadOnlyStore`).  The app is
the one the Django setting ``CELERY_RECOVERY_APP`` names (as ``celery -A``
takes it: ``"proj"`` or ``"proj.celery:app"``), else Celery's current app,
which a project set up as Celery's Django guide says makes when Django starts;
its settings are those of ``Recovery(app)`` when the project installed it.
"""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from sqlalchemy.exc import ArgumentError

from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.recovery import recovery_for_app
from celery_recovery.web.queries import ConsoleQueries
from celery_recovery.web.readonly import ReadOnlyStore

#: The Django setting naming the project's Celery app.
APP_SETTING = "CELERY_RECOVERY_APP"
#: What stands in for task arguments, trigger kwargs and heartbeat details: the
#: console hides them too unless started with --show-args, which the admin has not.
HIDDEN = "hidden"

_lock = threading.Lock()
_queries: ConsoleQueries | None = None


def console_queries() -> ConsoleQueries:
    """The console's queries over the store (raises
    :class:`~celery_recovery.core.errors.RecoveryError` when no app or settings are found;
    a store that does not answer raises on each query instead)."""
    global _queries
    with _lock:
        if _queries is None:
            settings = settings_of(celery_app())
            try:
                store = ReadOnlyStore(settings.database_url, settings.database_pooler)
            # A driver missing from the web server's environment (psycopg), or a URL
            # SQLAlchemy cannot read: said on the page, as any store failure.
            except (ImportError, ArgumentError) as exc:
                raise ConfigurationError(
                    f"cannot open the store {settings.masked_database_url}: {exc}"
                ) from exc
            _queries = ConsoleQueries(store, settings, hidden=HIDDEN)
        return _queries


def settings_of(app: Any) -> RecoverySettings:
    """The settings the app's processes use: its installation's (``Recovery(app,
    **overrides)``) when the project installed it in this process too, else its conf's."""
    installed = recovery_for_app(app)
    return installed.settings if installed is not None else RecoverySettings.from_app(app)


def celery_app() -> Any:
    """The project's Celery app: ``CELERY_RECOVERY_APP``'s, else the current one."""
    spec = getattr(django_settings, APP_SETTING, None)
    if spec:
        from celery.app.utils import find_app

        try:
            app = find_app(spec)
        # ValueError: Celery's "Couldn't import" around any error of the module.
        except (ImportError, AttributeError, ValueError) as exc:
            raise ConfigurationError(f"{APP_SETTING} = {spec!r}: cannot import it: {exc}") from exc
        if not hasattr(app, "conf"):
            raise ConfigurationError(f"{APP_SETTING} = {spec!r} is not a Celery app: {app!r}")
        return app
    from celery import current_app

    app = current_app._get_current_object()
    # With no app of the project's made yet, Celery answers with a fallback app of its
    # own, whose store would be an empty SQLite file in the working folder.
    if app.main == "default" and not app.set_as_current:
        raise ConfigurationError(
            f"no Celery app in this process: set {APP_SETTING} = 'proj.celery:app' in Django's "
            "settings, or import the app in proj/__init__.py as Celery's Django guide does"
        )
    return app


def forget() -> None:
    """Close the store and find it again on next use (after ``CELERY_RECOVERY_APP``
    changes, as in tests with ``override_settings``)."""
    global _queries
    with _lock:
        if _queries is not None:
            _queries.store.dispose()
        _queries = None


@receiver(setting_changed)
def _on_setting_changed(*, setting: str, **_kwargs: Any) -> None:
    if setting == APP_SETTING:
        forget()
