"""The ``celery-recovery`` command, also available as ``celery -A proj recovery``.

Examples::

    celery-recovery --app proj.celery:app db upgrade
    celery -A proj recovery db current
    CELERY_RECOVERY_DATABASE_URL=postgresql+psycopg://db/recovery celery-recovery db upgrade
"""

from __future__ import annotations

import click

from celery_recovery.cli.db import db
from celery_recovery.cli.doctor import doctor
from celery_recovery.cli.inspect import inspect
from celery_recovery.cli.jobs import jobs
from celery_recovery.cli.run import demo, sweep, triggerer
from celery_recovery.cli.schedules import schedules
from celery_recovery.cli.support import load_app
from celery_recovery.cli.web import web


@click.group(name="recovery")
@click.option(
    "-A",
    "--app",
    "app_spec",
    envvar="CELERY_APP",
    metavar="MODULE[:APP]",
    help="The Celery app whose recovery_* settings to use (as for `celery -A`).",
)
@click.option(
    "--database-url",
    envvar="CELERY_RECOVERY_DATABASE_URL",
    metavar="URL",
    help="The metadata store; overrides the app's recovery_database_url.",
)
@click.pass_context
def recovery(ctx: click.Context, app_spec: str | None, database_url: str | None) -> None:
    """Operate celery-recovery: migrate its store and inspect what it recorded.

    \b
    Example:
      celery-recovery --app proj.celery:app db upgrade
    """
    app = None
    celery_ctx = ctx.obj
    if app_spec:
        app = load_app(app_spec)
    elif celery_ctx is not None and getattr(celery_ctx, "app", None) is not None:
        app = celery_ctx.app
    ctx.find_root().meta["celery_recovery"] = {"app": app, "database_url": database_url}


for command in (db, inspect, jobs, sweep, triggerer, demo, web, doctor):
    recovery.add_command(command)
inspect.add_command(schedules)


def main() -> None:
    """Entry point of the ``celery-recovery`` console script."""
    recovery(prog_name="celery-recovery")


if __name__ == "__main__":
    main()
