"""An app configured the Django way: ``config_from_object(settings, namespace="CELERY")``.

Every setting, Celery's and ours, is an upper-case ``CELERY_*`` attribute of a
settings object, as in a Django ``settings.py``.  The store comes from
``RECOVERY_TEST_NAMESPACED_STORE``, not from a ``CELERY_RECOVERY_*`` variable,
so that only the namespaced setting can have put it there.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_recovery import Recovery


class Settings:
    CELERY_BROKER_URL = os.environ.get("RECOVERY_TEST_BROKER", "redis://127.0.0.1:6379/9")
    CELERY_RESULT_BACKEND = os.environ.get("RECOVERY_TEST_BACKEND", "redis://127.0.0.1:6379/10")
    CELERY_TASK_DEFAULT_QUEUE = os.environ.get("RECOVERY_TEST_QUEUE", "celery")
    CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
    CELERY_RECOVERY_DATABASE_URL = os.environ.get("RECOVERY_TEST_NAMESPACED_STORE")
    CELERY_RECOVERY_PRESET = "aggressive"
    CELERY_RECOVERY_QUEUED_TIMEOUT = 120


app = Celery("namespaced", set_as_current=False)
app.config_from_object(Settings, namespace="CELERY")
recovery = Recovery(app)


@app.task(name="namespaced.add")
def add(x, y):
    return x + y
