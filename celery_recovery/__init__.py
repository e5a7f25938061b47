"""celery-recovery: the recovery guarantees of a workflow scheduler for any Celery app.

Two lines install it::

    from celery_recovery import Recovery
    recovery = Recovery(app)
"""

from .errors import (
    ConfigurationError,
    RecoveryError,
    StoreError,
    StoreSchemaError,
    StoreUnavailableError,
)
from .recoverable import current_fencing_token, recoverable
from .recovery import Recovery
from .settings import RecoverySettings
from .states import JobState, JobType, TaskState

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "JobState",
    "JobType",
    "Recovery",
    "RecoveryError",
    "RecoverySettings",
    "StoreError",
    "StoreSchemaError",
    "StoreUnavailableError",
    "TaskState",
    "__version__",
    "current_fencing_token",
    "recoverable",
]
