"""celery-recovery: the recovery guarantees of a workflow scheduler for any Celery app.

Two lines install it::

    from celery_recovery import Recovery
    recovery = Recovery(app)
"""

from celery_recovery.core.errors import (
    ConfigurationError,
    DeferralError,
    HeartbeatDetailsError,
    RecoveryError,
    StaleTryError,
    StoreError,
    StoreSchemaError,
    StoreUnavailableError,
    TriggerFailedError,
    TriggerTimeoutError,
)
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.core.states import DEFERRED_STATE, JobState, JobType, TaskState
from celery_recovery.deliveries.deferral import TaskDeferred, defer
from celery_recovery.deliveries.recoverable import current_fencing_token, recoverable
from celery_recovery.recovery import Recovery
from celery_recovery.task_heartbeats import heartbeat, heartbeat_details
from celery_recovery.triggers import (
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
    "HeartbeatDetailsError",
    "JobState",
    "JobType",
    "Recovery",
    "RecoveryError",
    "RecoverySettings",
    "StaleTryError",
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
    "heartbeat",
    "heartbeat_details",
    "recoverable",
]
