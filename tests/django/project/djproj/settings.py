"""Settings of the test project: a stock Django project, django-celery-results,
django-celery-beat and celery-recovery's admin pages.

celery-recovery's own settings are ``CELERY_RECOVERY_*`` here, as every Celery
setting of a Django project; the tests pass the store and their short intervals
as environment variables of the same names.
"""

import os

# The parts the test process's Django shares (tests/django/conftest.py).
from common_settings import INSTALLED_APPS, MIDDLEWARE, TEMPLATES, database

__all__ = ("INSTALLED_APPS", "MIDDLEWARE", "TEMPLATES")

SECRET_KEY = "tests-only-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = os.environ.get("RECOVERY_TEST_DJANGO_TIME_ZONE", "UTC")

ROOT_URLCONF = "djproj.urls"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": database(os.environ.get("RECOVERY_TEST_DJANGO_DB", "celery_recovery_django"))
}
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": os.environ.get("RECOVERY_TEST_DJANGO_CACHE", "redis://127.0.0.1:6379/10"),
    }
}

CELERY_BROKER_URL = os.environ.get("RECOVERY_TEST_BROKER", "redis://127.0.0.1:6379/9")
# django-celery-results: "django-db" (its TaskResult model) or "django-cache".
CELERY_RESULT_BACKEND = os.environ.get("RECOVERY_TEST_DJANGO_BACKEND", "django-db")
CELERY_CACHE_BACKEND = "default"
CELERY_RESULT_EXTENDED = True
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("RECOVERY_TEST_QUEUE", "celery")
CELERY_TIMEZONE = TIME_ZONE

# Beat runs celery-recovery's sweep, as the README says (the tests that ask for it).
if os.environ.get("RECOVERY_TEST_BEAT_INTERVAL"):
    from celery_recovery.beat_schedules import recovery_beat_schedule

    CELERY_BEAT_SCHEDULE = recovery_beat_schedule(
        sweep_interval=float(os.environ["RECOVERY_TEST_BEAT_INTERVAL"])
    )
