"""The project's Celery app: Celery's Django guide, plus the two lines of celery-recovery."""

import os

from celery import Celery

from celery_recovery import Recovery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproj.settings")

app = Celery("djproj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

Recovery(app)
