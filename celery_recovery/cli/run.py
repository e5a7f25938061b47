"""The processes the command line runs: ``sweep``, ``triggerer`` and ``demo``."""

from __future__ import annotations

import sys
from typing import Any

import click

from celery_recovery.cli.support import CLIError, installed_recovery
from celery_recovery.triggers.base import DEFAULT_TRIGGER_QUEUE


def _metrics_port_option(verb: str) -> Any:
    return click.option(
        "--metrics-port",
        type=click.IntRange(1, 65535),
        metavar="PORT",
        help=f"{verb} Prometheus metrics on http://0.0.0.0:PORT/metrics "
        "[default: recovery_metrics_port; unset serves nothing].",
    )


@click.command("sweep")
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
    import threading

    from celery_recovery.telemetry import metrics, sentry

    if metrics_port is not None and not loop:
        raise CLIError("--metrics-port needs --loop: a single sweep exits before any scrape")
    installed = installed_recovery(ctx, "sweep needs the Celery app to publish tasks again")
    port = metrics_port or installed.settings.metrics_port
    if loop and port is not None:
        try:
            metrics.serve(port)
        except metrics.MetricsServerError as exc:
            raise CLIError(str(exc)) from None
    # A death the marker watch finds is swept at once, not at the next interval.
    woken = threading.Event()
    if loop:
        installed.watch_markers(on_deaths=woken.set)
    while True:
        woken.clear()
        swept = installed.sweep()
        sentry.sweep_checkin(installed.settings, swept)
        report = swept.as_dict()
        if as_json:
            click.echo(json.dumps(report))
        else:
            click.echo(_report_line(report))
        # Line by line into a log file or a container's log, not a block later.
        sys.stdout.flush()
        if not loop:
            # For cron jobs and scripts: a pass that could not do all its work fails.
            sys.exit(1 if swept.errors else 0)
        woken.wait(installed.settings.sweep_interval)


@click.command("triggerer")
@click.option(
    "-Q",
    "--queues",
    default=DEFAULT_TRIGGER_QUEUE,
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

    from celery_recovery.triggerer import Triggerer

    names = [q.strip() for q in queues.split(",") if q.strip()]
    if not names:
        raise click.BadParameter(
            "name at least one queue, e.g. --queues default", param_hint="--queues"
        )
    installed = installed_recovery(
        ctx,
        "the triggerer needs the Celery app (its result backend "
        "and broker, and the modules of its triggers)",
    )
    logging.basicConfig(
        level=loglevel.upper(), format="[%(asctime)s: %(levelname)s/%(processName)s] %(message)s"
    )
    from celery_recovery.telemetry import metrics

    triggerer = Triggerer(installed.context, names, capacity, metrics_port=metrics_port)

    def swept_then_claim() -> None:
        # A death the watch found: its tries are recovered, and a dead triggerer's
        # triggers are claimed now rather than at the next poll.
        installed.sweep()
        triggerer.wake()

    # Triggerers watch the markers too: a dead triggerer's triggers are taken over within
    # about a second, even where no sweeper runs on the same host.
    installed.watch_markers(on_deaths=swept_then_claim)
    try:
        triggerer.run()
    except metrics.MetricsServerError as exc:
        raise CLIError(str(exc)) from None


@click.command("demo")
def demo() -> None:
    """Show a SIGKILLed worker's task being recovered, with no server needed.

    Starts two real workers (filesystem broker, SQLite result backend and
    store), sends tasks, SIGKILLs the worker running one, sweeps as beat
    would, and prints what happens and a summary.  Exits 1 if recovery failed.

    \b
    Example:
      celery-recovery demo
    """
    from celery_recovery.demo.runner import run_demo

    sys.exit(run_demo())


def _report_line(report: dict[str, Any]) -> str:
    """``zombies=0 ... errors=0 ... duration=0.012``; a failing pass ends with the steps
    that failed and the first error, quoted (it has spaces)."""
    failing, first_error = report.pop("failing_steps"), report.pop("first_error")
    line = " ".join(f"{k}={v:.3f}" if k == "duration" else f"{k}={v}" for k, v in report.items())
    if failing:
        line += f" failing_steps={','.join(failing)!r} first_error={first_error!r}"
    return line
