"""Celery apps for the admin pages in the test process, named by ``CELERY_RECOVERY_APP``
(``"tests.django.admin_app:app"``) under ``override_settings``: the project's own app
(``djproj``) is the workers', and the test process never imports it."""

from __future__ import annotations

from typing import Any

from celery import Celery

#: The app with the test's store: set by the ``admin_store`` fixture (tests/django/test_admin.py).
app: Any = None

#: An app whose store never answers: nothing listens on port 1.
unreachable = Celery("admin-pages-unreachable", set_as_current=False)
unreachable.conf.recovery_database_url = (
    "postgresql+psycopg://postgres:not-shown-pw@127.0.0.1:1/nowhere"
)
