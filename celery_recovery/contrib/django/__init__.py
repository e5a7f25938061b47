"""celery-recovery in a Django project: add ``"celery_recovery.contrib.django"`` to
``INSTALLED_APPS`` (docs/django.md).

Its admin pages (admin.py) show the store as the console does, read-only, to staff
with the ``celery_recovery.view_recovery`` permission; the store is found from the
project's Celery app (store.py), never at import or start.
"""
