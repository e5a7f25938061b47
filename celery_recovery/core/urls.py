"""Database URL handling: which stores are supported, and masking passwords."""

from __future__ import annotations

import re

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from celery_recovery.core.errors import ConfigurationError

#: Drivers the store is tested with, by the scheme users may write.
SUPPORTED_SCHEMES = {
    "sqlite": "sqlite",
    "sqlite+pysqlite": "sqlite",
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
}

#: ``scheme://user:password@``: the password runs to the last ``@`` of the authority
#: (an unencoded ``@`` in a password must not leave its tail visible).
_PASSWORD_IN_URL = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s]*:)[^/\s]*(?P<at>@)")
#: ``user:password@host`` with no scheme, as in a URL someone mistyped.
_PASSWORD_WITHOUT_SCHEME = re.compile(r"(?P<head>(?:^|(?<=[\s'\"(]))[^:/@\s'\"]*:)[^/\s]*(?P<at>@)")


def mask_url(url: str | URL) -> str:
    """The URL with any password replaced by ``***``, safe to print or log."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    return mask_secrets(str(url))


def mask_secrets(text: str) -> str:
    """Mask every URL password found anywhere in ``text`` (for error messages)."""
    text = _PASSWORD_IN_URL.sub(r"\g<head>***\g<at>", text)
    return _PASSWORD_WITHOUT_SCHEME.sub(r"\g<head>***\g<at>", text)


def normalise_database_url(url: str, setting: str = "recovery_database_url") -> URL:
    """Parse a store URL and pin the driver we support for its database.

    Raises :class:`ConfigurationError` naming ``setting`` when the URL cannot be
    parsed or names a database or driver the store does not support.
    """
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 - a port that is not a number fails here, not at connect
    except (ArgumentError, ValueError):
        raise ConfigurationError(
            f"{setting}={mask_url(url)!r} is not a database URL; expected e.g. "
            "'sqlite:///celery_recovery.sqlite3' or "
            "'postgresql+psycopg://user@host/dbname'"
        ) from None
    driver = SUPPORTED_SCHEMES.get(parsed.drivername)
    if driver is None:
        allowed = ", ".join(sorted(SUPPORTED_SCHEMES))
        raise ConfigurationError(
            f"{setting}={mask_url(url)!r} uses {parsed.drivername!r}, which the store does "
            f"not support; allowed schemes: {allowed}"
        )
    if driver == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise ConfigurationError(
            f"{setting}={mask_url(url)!r}: SQLite needs a file path "
            "(an in-memory database is not shared between worker processes), e.g. "
            "'sqlite:///celery_recovery.sqlite3'"
        )
    return parsed.set(drivername=driver)
