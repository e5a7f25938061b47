"""Recovery sweeps: zombies, orphan adoption, lost messages, dead jobs, failure callbacks.

Beside them: the revokes and purges the lost-message sweep honours (:mod:`.revocations`),
and the retention of finished history, ``db clean`` (:mod:`.retention`).
"""

from celery_recovery.core.records import SweepReport
from celery_recovery.sweeps.runner import run_sweep

__all__ = ["SweepReport", "run_sweep"]
