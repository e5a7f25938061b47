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


class LostWorkerError(RecoveryError):
    """A try was failed or retried by a recovery sweep because its worker was lost.

    Passed to the task's ``on_failure``/``on_retry`` and to failure listeners
    when the process that ran the try died before it could report.
    """

    def __init__(self, message: str, task_id: str | None = None, try_number: int | None = None):
        super().__init__(message)
        self.task_id = task_id
        self.try_number = try_number


class DeferralError(RecoveryError):
    """``defer()`` was called wrongly, or a stored trigger cannot be rebuilt."""


class TriggerFailedError(RecoveryError):
    """A deferred task's trigger failed: it raised, yielded ``TaskFailedEvent``, or
    could not be loaded.  Stored as the task's failure in the result backend."""


class TriggerTimeoutError(TriggerFailedError):
    """A deferred task waited longer than the ``timeout`` given to ``defer()``."""


class HeartbeatDetailsError(RecoveryError, ValueError):
    """``heartbeat(details)`` was given details that are not JSON, or too large."""


class StaleTryError(RecoveryError):
    """A try beat after it was given up (hung, or its worker taken for dead) and a
    later try replaced it: it must stop, and its progress belongs to the later try."""
