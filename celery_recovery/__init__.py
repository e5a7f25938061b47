"""celery-recovery: the recovery guarantees of a workflow scheduler for any Celery app.

Two lines install it::

    from celery_recovery import Recovery
    recovery = Recovery(app)
"""

from .deferral import DEFERRED_STATE, TaskDeferred, defer
from .errors import (
    ConfigurationError,
    DeferralError,
    RecoveryError,
    StoreError,
    StoreSchemaError,
    StoreUnavailableError,
    TriggerFailedError,
    TriggerTimeoutError,
)
from .recoverable import current_fencing_token, recoverable
from .recovery import Recovery
from .settings import RecoverySettings
from .states import JobState, JobType, TaskState
from .triggers import (
    BaseTrigger,
    DateTimeTrigger,
    TaskFailedEvent,
    TaskResultTrigger,
    TaskSuccessEvent,
    TimeDeltaTrigger,
    TriggerEvent,
)

__version__ = "0.1.0"

__all__ = [
    "DEFERRED_STATE",
    "BaseTrigger",
    "ConfigurationError",
    "DateTimeTrigger",
    "DeferralError",
    "JobState",
    "JobType",
    "Recovery",
    "RecoveryError",
    "RecoverySettings",
    "StoreError",
    "StoreSchemaError",
    "StoreUnavailableError",
    "TaskDeferred",
    "TaskFailedEvent",
    "TaskResultTrigger",
    "TaskState",
    "TaskSuccessEvent",
    "TimeDeltaTrigger",
    "TriggerEvent",
    "TriggerFailedError",
    "TriggerTimeoutError",
    "__version__",
    "current_fencing_token",
    "defer",
    "recoverable",
]
