"""A Celery app whose every URL carries the password ``s3cret`` and points nowhere.

Used by tests/security/test_secrets.py to run the CLI commands that need
``--app`` and check that the password appears in no output or log.
"""

from __future__ import annotations

from celery import Celery

SECRET = "s3cret"
DATABASE_URL = f"postgresql+psycopg://u:{SECRET}@127.0.0.1:1/db"
BROKER_URL = f"redis://u:{SECRET}@127.0.0.1:1/0"

app = Celery("secret_app", broker=BROKER_URL, backend=BROKER_URL, set_as_current=False)
app.conf.recovery_database_url = DATABASE_URL
app.conf.broker_connection_retry_on_startup = False
app.conf.broker_connection_max_retries = 0
app.conf.redis_socket_connect_timeout = 1
