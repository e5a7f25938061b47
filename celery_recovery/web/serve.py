"""Serve the console with uvicorn (``celery-recovery web``)."""

from __future__ import annotations

import logging
from typing import Any

from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.settings import RecoverySettings

#: Port the console listens on unless ``--port`` says otherwise.
DEFAULT_PORT = 9809
#: Interface the console binds unless ``--bind`` says otherwise: this machine only.
DEFAULT_BIND = "127.0.0.1"

_MISSING = "the console needs its extra: pip install 'celery-recovery[web]'"


def build(settings: RecoverySettings, bind: str, show_args: bool) -> Any:
    """The secured ASGI app; raises ConfigurationError when it must not be served."""
    try:
        from celery_recovery.web.app import create_app, secured
    except ImportError as exc:  # starlette, jinja2 missing
        raise ConfigurationError(f"{_MISSING} ({exc})") from None
    app = create_app(settings, show_args=show_args)
    return secured(app, settings, bind)


def serve(settings: RecoverySettings, bind: str, port: int, show_args: bool) -> None:
    """Serve until interrupted; refuses an exposed bind without a token or credentials."""
    app = build(settings, bind, show_args)
    try:
        import uvicorn
    except ImportError as exc:
        raise ConfigurationError(f"{_MISSING} ({exc})") from None
    logging.getLogger("celery_recovery.web").info("console on http://%s:%d/", bind, port)
    uvicorn.run(app, host=bind, port=port, log_level="warning", server_header=False)
