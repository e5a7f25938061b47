"""``celery-recovery web``: the read-only console over the store, in a browser."""

from __future__ import annotations

import click

from celery_recovery.cli.support import CLIError, settings_of
from celery_recovery.core.errors import RecoveryError
from celery_recovery.core.urls import mask_secrets
from celery_recovery.web.serve import DEFAULT_BIND, DEFAULT_PORT


@click.command("web")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="TCP port to serve on.",
)
@click.option(
    "--bind",
    default=DEFAULT_BIND,
    show_default=True,
    metavar="ADDRESS",
    help="Interface to listen on. Any other than the loopback needs recovery_web_token "
    "or recovery_web_credentials.",
)
@click.option(
    "--show-args",
    is_flag=True,
    help="Show task arguments and trigger kwargs (hidden by default: they may hold personal data).",
)
@click.pass_context
def web(ctx: click.Context, port: int, bind: str, show_args: bool) -> None:
    """Serve the read-only console: jobs, recoveries, task timelines, deferred tasks,
    callbacks and locks, each page also as JSON under /api/.

    \b
    Example:
      celery-recovery --database-url postgresql+psycopg://db/recovery web --port 9809
      open http://127.0.0.1:9809/
    """
    from celery_recovery.web.serve import build, serve

    settings = settings_of(ctx)
    try:
        build(settings, bind, show_args)  # refuse before printing that it serves
        click.echo(
            f"celery-recovery console on http://{bind}:{port}/ ({settings.masked_database_url})"
        )
        serve(settings, bind, port, show_args)
    except RecoveryError as exc:
        raise CLIError(mask_secrets(str(exc))) from None
