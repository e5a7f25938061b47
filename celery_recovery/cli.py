"""The ``celery-recovery`` command, also available as ``celery -A proj recovery``.

Examples::

    celery-recovery --app proj.celery:app db upgrade
    celery -A proj recovery db current
    CELERY_RECOVERY_DATABASE_URL=postgresql+psycopg://db/recovery celery-recovery db upgrade
"""

from __future__ import annotations

import sys
from typing import Any

import click

from .errors import RecoveryError
from .settings import RecoverySettings
from .store import Store
from .store.engine import create_store_engine
from .store.migrate import current_revision, head_revision, upgrade
from .urls import mask_secrets, mask_url


class CLIError(click.ClickException):
    """A user error: one line on stderr and exit status 2."""

    exit_code = 2


def _load_app(spec: str) -> Any:
    from celery.app.utils import find_app

    try:
        return find_app(spec)
    except (ImportError, AttributeError, ModuleNotFoundError) as exc:
        raise click.BadParameter(f"cannot import app {spec!r}: {exc}", param_hint="--app") from None


def _settings(ctx: click.Context) -> RecoverySettings:
    options = ctx.find_root().meta.setdefault("celery_recovery", {})
    if "settings" in options:
        return options["settings"]
    app = options.get("app")
    overrides = {"database_url": options["database_url"]} if options.get("database_url") else {}
    try:
        if app is not None:
            settings = RecoverySettings.from_app(app, **overrides)
        else:
            settings = RecoverySettings.from_sources(overrides=overrides)
    except RecoveryError as exc:
        raise CLIError(str(exc)) from None
    options["settings"] = settings
    return settings


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
        app = _load_app(app_spec)
    elif celery_ctx is not None and getattr(celery_ctx, "app", None) is not None:
        app = celery_ctx.app
    ctx.find_root().meta["celery_recovery"] = {"app": app, "database_url": database_url}


@recovery.group()
def db() -> None:
    """Manage the metadata store: its schema and the retention of history.

    \b
    Example:
      celery-recovery db upgrade
    """


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True, help="Target schema revision.")
@click.pass_context
def db_upgrade(ctx: click.Context, revision: str) -> None:
    """Create or migrate the store's tables to this version of the package.

    \b
    Example:
      celery-recovery --database-url postgresql+psycopg://db/recovery db upgrade
    """
    settings = _settings(ctx)
    engine = create_store_engine(settings.database_url, for_migrations=True)
    try:
        before = current_revision(engine)
        upgrade(engine, revision)
        after = current_revision(engine)
    except Exception as exc:
        raise CLIError(
            f"db upgrade failed on {mask_url(settings.database_url)}: "
            f"{mask_secrets(_first_line(exc))}"
        ) from None
    finally:
        engine.dispose()
    click.echo(f"{mask_url(settings.database_url)}: schema {before or 'none'} -> {after}")


@db.command("current")
@click.pass_context
def db_current(ctx: click.Context) -> None:
    """Print the store's schema revision and whether it is up to date (exit 1 if not).

    \b
    Example:
      celery-recovery db current
    """
    settings = _settings(ctx)
    store = Store(settings.database_url)
    try:
        current = current_revision(store.engine)
    except Exception as exc:
        raise CLIError(
            f"cannot read {mask_url(settings.database_url)}: {mask_secrets(_first_line(exc))}"
        ) from None
    finally:
        store.dispose()
    head = head_revision()
    state = "up to date" if current == head else f"needs upgrade to {head}"
    click.echo(f"{mask_url(settings.database_url)}: schema {current or 'none'} ({state})")
    if current != head:
        sys.exit(1)


def _metrics_port_option(verb: str) -> Any:
    return click.option(
        "--metrics-port",
        type=click.IntRange(1, 65535),
        metavar="PORT",
        help=f"{verb} Prometheus metrics on http://0.0.0.0:PORT/metrics "
        "[default: recovery_metrics_port; unset serves nothing].",
    )


@recovery.command("sweep")
@click.option("--loop", is_flag=True, help="Sweep every recovery_sweep_interval until stopped.")
@click.option("--json", "as_json", is_flag=True, help="Print each report as one JSON line.")
@_metrics_port_option("With --loop: serve")
@click.pass_context
def sweep(ctx: click.Context, loop: bool, as_json: bool, metrics_port: int | None) -> None:
    """Run the recovery sweep in this process (for deployments without beat).

    Each sweep checks in to the Sentry cron monitor celery-recovery-sweep
    when sentry-sdk is initialised by the app.  Without --loop the exit status
    is 1 when a step of the pass failed (its report counts the errors).

    \b
    Example:
      celery-recovery --app proj.celery:app sweep --loop --metrics-port 9808
    """
    import json
    import time

    from . import metrics, sentry

    if metrics_port is not None and not loop:
        raise CLIError("--metrics-port needs --loop: a single sweep exits before any scrape")
    installed = _installed_recovery(ctx, "sweep needs the Celery app to publish tasks again")
    port = metrics_port or installed.settings.metrics_port
    if loop and port is not None:
        try:
            metrics.serve(port)
        except metrics.MetricsServerError as exc:
            raise CLIError(str(exc)) from None
    while True:
        swept = installed.sweep()
        sentry.sweep_checkin(installed.settings, swept)
        report = swept.as_dict()
        if as_json:
            click.echo(json.dumps(report))
        else:
            click.echo(
                " ".join(
                    f"{k}={v:.3f}" if k == "duration" else f"{k}={v}" for k, v in report.items()
                )
            )
        if not loop:
            # For cron jobs and scripts: a pass that could not do all its work fails.
            sys.exit(1 if swept.errors else 0)
        time.sleep(installed.settings.sweep_interval)


@recovery.command("triggerer")
@click.option(
    "-Q",
    "--queues",
    default="default",
    show_default=True,
    metavar="A,B",
    help="Comma-separated trigger queues this triggerer serves.",
)
@click.option(
    "--capacity",
    type=click.IntRange(min=1),
    default=None,
    help="Most triggers run at once [default: recovery_triggerer_capacity].",
)
@_metrics_port_option("Serve")
@click.option(
    "-l",
    "--loglevel",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.pass_context
def triggerer(
    ctx: click.Context,
    queues: str,
    capacity: int | None,
    metrics_port: int | None,
    loglevel: str,
) -> None:
    """Run deferred tasks' triggers on one asyncio loop, with no worker slot held.

    Several triggerers (on several hosts) share the work; each claims the
    triggers of its queues, and those of a triggerer that stopped
    heartbeating.  SIGTERM hands its triggers to the others at once.

    \b
    Example:
      celery -A proj recovery triggerer --queues default,reports --capacity 5000
    """
    import logging

    from .triggerer import Triggerer

    names = [q.strip() for q in queues.split(",") if q.strip()]
    if not names:
        raise click.BadParameter(
            "name at least one queue, e.g. --queues default", param_hint="--queues"
        )
    installed = _installed_recovery(
        ctx,
        "the triggerer needs the Celery app (its result backend "
        "and broker, and the modules of its triggers)",
    )
    logging.basicConfig(
        level=loglevel.upper(), format="[%(asctime)s: %(levelname)s/%(processName)s] %(message)s"
    )
    from . import metrics

    try:
        Triggerer(installed, names, capacity, metrics_port=metrics_port).run()
    except metrics.MetricsServerError as exc:
        raise CLIError(str(exc)) from None


@recovery.command("demo")
def demo() -> None:
    """Show a SIGKILLed worker's task being recovered, with no server needed.

    Starts two real workers (filesystem broker, SQLite result backend and
    store), sends tasks, SIGKILLs the worker running one, sweeps as beat
    would, and prints what happens and a summary.  Exits 1 if recovery failed.

    \b
    Example:
      celery-recovery demo
    """
    from .demo.runner import run_demo

    sys.exit(run_demo())


def _installed_recovery(ctx: click.Context, why: str) -> Any:
    """celery-recovery installed on the command's app (``--app``), with ``--database-url``."""
    from .recovery import Recovery

    options = ctx.find_root().meta.get("celery_recovery", {})
    app = options.get("app")
    if app is None:
        raise CLIError(f"{why}: pass --app (or use `celery -A proj recovery ...`)")
    overrides = {}
    if options.get("database_url"):
        overrides["database_url"] = options["database_url"]
    try:
        return Recovery(app, **overrides)
    except RecoveryError as exc:
        raise CLIError(str(exc)) from None


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# The operator commands register themselves on the group and ``db`` defined above.
from . import cli_clean, cli_inspect, cli_jobs, cli_web  # noqa: E402, F401


def main() -> None:
    """Entry point of the ``celery-recovery`` console script."""
    recovery(prog_name="celery-recovery")


if __name__ == "__main__":
    # Under ``python -m`` this file is ``__main__``; the command modules registered on
    # the group of the importable ``celery_recovery.cli``, so run that one.
    from celery_recovery.cli import main as _main

    _main()
