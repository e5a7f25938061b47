"""The package's exceptions: one root, a family per concern."""

from __future__ import annotations


class RecoveryError(Exception):
    """Root of every exception raised by celery-recovery."""


class ConfigurationError(RecoveryError, ValueError):
    """A ``recovery_*`` setting or an argument has a value that is not allowed.

    The message names the setting, the value given and what is allowed.
    """


class StoreError(RecoveryError):
    """The metadata store could not be used."""


class StoreUnavailableError(StoreError):
    """The metadata store did not answer (down, unreachable or too slow)."""


class StoreSchemaError(StoreError):
    """The store's schema is missing or not at the version this package needs."""
