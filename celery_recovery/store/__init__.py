"""The metadata store shared by workers, beats, triggerers and the CLI.

Outside this package, import from here only: the repositories' modules and
the schema are the store's own.
"""

from celery_recovery.store.beat import BEAT_LEASE, Fence
from celery_recovery.store.claims import CLAIM_NAME_MAX, CLAIM_PREFIX, Claim
from celery_recovery.store.engine import behind_pooler
from celery_recovery.store.retention import RETENTION_TABLES
from celery_recovery.store.schema import EncodedJSON, unreadable
from celery_recovery.store.store import Store
from celery_recovery.store.tries import MESSAGE_COLUMNS
from celery_recovery.store.triggers import FAILURE, RESUME, SUCCESS, Finish, Firing
from celery_recovery.store.try_recovery import MISSING_JOB_GRACE

__all__ = [
    "BEAT_LEASE",
    "CLAIM_NAME_MAX",
    "CLAIM_PREFIX",
    "FAILURE",
    "MESSAGE_COLUMNS",
    "MISSING_JOB_GRACE",
    "RESUME",
    "RETENTION_TABLES",
    "SUCCESS",
    "Claim",
    "EncodedJSON",
    "Fence",
    "Finish",
    "Firing",
    "Store",
    "behind_pooler",
    "unreadable",
]
