"""Reading ``recovery_*`` settings from a Celery app the way Celery reads its own.

An app configured with ``config_from_object(obj, namespace="CELERY")`` (every
Django project) names its settings ``CELERY_BROKER_URL``, and so ours
``CELERY_RECOVERY_DATABASE_URL``; Celery's own lookup (``app.conf.get``)
resolves the lower-case name through the namespace, and so do we.  A key that
looks like one of ours but would not be read (the wrong prefix for the app's
namespace) is reported, never silently skipped: a store silently different
from the configured one would lose every recovery without a sign.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.log_once import LogOnce

logger = logging.getLogger("celery_recovery")

PREFIX = "recovery_"
#: Names under our prefix that are no setting of the app's: ``CELERY_RECOVERY_APP`` is
#: the Django setting naming the app itself (the admin pages, contrib/django), found
#: among a Django project's ``CELERY_*`` settings without being one of ours.
NOT_APP_SETTINGS = frozenset({"app"})

_warned: weakref.WeakKeyDictionary[Any, LogOnce] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class AppConfValues:
    """The settings an app's conf gives: ``name -> (key as written, value)``."""

    read: dict[str, tuple[str, Any]]
    #: Keys that look like ours but that the app's namespace does not read:
    #: ``key -> (the key that would be read instead, its value)``.
    unread: dict[str, tuple[str, Any]]


def read_app_conf(app: Any) -> AppConfValues:
    """Our settings from ``app.conf``, honouring the app's namespace.

    A readable key with an unknown name is returned too, under that name, so
    that the caller can refuse it with a hint.
    """
    conf = app.conf
    namespace = _namespace(app)
    keys = {key for key in conf if isinstance(key, str)}
    read: dict[str, tuple[str, Any]] = {}
    unread: dict[str, tuple[str, Any]] = {}
    for key in sorted(keys):
        name, readable = _classify(key, namespace)
        if name is None or name in NOT_APP_SETTINGS:
            continue
        if not readable:
            unread[key] = (_readable_key(name, namespace), _raw(conf, key))
        elif name not in read:
            # Celery's own precedence between the spellings it accepts for one name.
            chosen = next((k for k in _spellings(name, namespace) if k in keys), key)
            read[name] = (chosen, conf[chosen])
    return AppConfValues(read, unread)


def _classify(key: str, namespace: str) -> tuple[str | None, bool]:
    """(setting name, whether this app reads this spelling) for a key that looks like
    ours; (None, False) for any other key."""
    lowered = key.lower()
    ns = namespace.lower() + "_" if namespace else ""
    if ns and lowered.startswith(ns + PREFIX):
        # Celery matches the namespace's case: CELERY_RECOVERY_X, or celery_recovery_x.
        rest = key[len(ns) :]
        return lowered[len(ns) + len(PREFIX) :], rest.isupper() == namespace.isupper()
    if lowered.startswith(PREFIX):
        # recovery_x is read with or without a namespace (Celery tries the bare name
        # too); the upper-case RECOVERY_X, like Celery's old upper-case settings, only
        # without one.
        return lowered[len(PREFIX) :], key.islower() or not namespace
    if lowered.startswith("celery_" + PREFIX):
        return lowered[len("celery_") + len(PREFIX) :], False
    return None, False


def _raw(conf: Any, key: str) -> Any:
    """The value stored under exactly ``key``: ``conf[key]`` would resolve it through the
    namespace to another key."""
    for mapping in conf.maps:
        try:
            return mapping[key]
        except KeyError:
            continue
    return None


def _readable_key(name: str, namespace: str) -> str:
    return _spellings(name, namespace)[0]


def _namespace(app: Any) -> str:
    return (getattr(app, "namespace", None) or "").rstrip("_")


def spelling(app: Any) -> Callable[[str], str]:
    """How this app writes the key of a setting name: ``CELERY_RECOVERY_X`` under the
    namespace ``CELERY``, else ``recovery_x``."""
    namespace = _namespace(app)
    return lambda name: _readable_key(name, namespace)


def _spellings(name: str, namespace: str) -> list[str]:
    """The keys this app reads for ``name``, most preferred first."""
    if not namespace:
        return [PREFIX + name, (PREFIX + name).upper()]
    # Celery matches the namespace's case (celery/utils/collections.py match_case).
    namespaced = f"{namespace}_{PREFIX}{name}"
    return [namespaced.upper() if namespace.isupper() else namespaced.lower(), PREFIX + name]


def report_unread(app: Any, values: AppConfValues, resolved_database_url: str) -> None:
    """Refuse an unread database URL that differs from the one in use; warn, once per app
    and key, about any other unread key."""
    namespace = _namespace(app)
    how = (
        f"this app's configuration namespace is {namespace!r}"
        if namespace
        else "this app's configuration has no namespace"
    )
    for key, (instead, value) in values.unread.items():
        message = f"setting {key!r} is not read: {how}, so celery-recovery reads {instead!r}"
        if key.lower().endswith(PREFIX + "database_url") and not _same_store(
            value, resolved_database_url
        ):
            from celery_recovery.core.urls import mask_url

            fix = f"Rename the setting to {instead!r}" + (
                ""
                if namespace
                else ", or load the configuration with config_from_object(..., namespace='CELERY')"
            )
            raise ConfigurationError(
                f"{message}; the store would be {mask_url(resolved_database_url)} instead "
                f"of {mask_url(str(value))}. {fix}"
            )
        if not _warned.setdefault(app, LogOnce()).first(key):
            continue
        text = f"{message}; rename it to {instead!r}"
        # Both: daemons (workers, beat) often hide warnings, tests and shells hide logs.
        warnings.warn(text, stacklevel=4)
        logger.warning(text)


def _same_store(value: Any, resolved: str) -> bool:
    from celery_recovery.core.urls import normalise_database_url

    try:
        url = normalise_database_url(str(value).strip(), "database_url")
    except ConfigurationError:
        return False
    return url.render_as_string(hide_password=False) == resolved
