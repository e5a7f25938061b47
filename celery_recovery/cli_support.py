"""What the operator commands share: the store of the command line's settings, and
turning store failures into one line and exit status 2 instead of a traceback.

Imported through :mod:`celery_recovery.cli`, which defines the group and options.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click

from .cli import CLIError, _settings
from .errors import RecoveryError
from .settings import RecoverySettings
from .states import JobType
from .store import Store
from .urls import mask_secrets


@contextmanager
def store_of(ctx: click.Context) -> Iterator[tuple[Store, RecoverySettings]]:
    """The store named by ``--database-url`` / the app, closed afterwards.

    A store error (unreachable, schema missing) becomes a :class:`CLIError`.
    """
    settings = _settings(ctx)
    store = Store(settings.database_url)
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
