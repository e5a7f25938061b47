"""A Django project set up as Celery's Django guide writes it, with celery-recovery.

The tests (tests/django) run it for real: its database on the test PostgreSQL,
django-celery-results as the result backend, django-celery-beat's schedules, the
admin.  Where the services are comes from the environment the tests give it
(``RECOVERY_TEST_*`` and ``CELERY_RECOVERY_*``).
"""

# As Celery's guide says: the app is loaded whenever Django starts, so that
# @shared_task uses it.
from djproj.celery import app as celery_app

__all__ = ("celery_app",)
