"""The ``celery-recovery`` command, also available as ``celery -A proj recovery``.

Examples::

    celery-recovery --app proj.celery:app db upgrade
    celery -A proj recovery db current
    CELERY_RECOVERY_DATABASE_URL=postgresql+psycopg://db/recovery celery-recovery db upgrade
"""

from celery_recovery.cli.main import main, recovery

__all__ = ["main", "recovery"]
