"""Integrations with frameworks around Celery."""
