"""``celery-recovery doctor``: what in this deployment loses or duplicates tasks
silently, each with its fix.  Exit 0 when nothing is found, 1 when something is,
2 when the doctor cannot tell (a server did not answer, a value cannot be read)."""

from __future__ import annotations

import json
import sys

import click

from celery_recovery.cli.support import CLIError, start_app
from celery_recovery.doctor import Report, Severity, diagnose

#: Colour of a finding's severity, and of the "cannot tell" heading.
COLOURS = {Severity.ERROR: "red", Severity.WARNING: "yellow", "cannot tell": "cyan"}
INDENT = "    "


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Name each setting that loses or duplicates tasks silently, with its fix.

    Reads the app's recovery_* settings and tasks, the broker (Redis, RabbitMQ,
    SQS), the result backend, the Redis servers it uses and the store.  Exit 0:
    nothing found; 1: findings; 2: cannot tell (a server did not answer, or a
    value cannot be read).  docs/doctor.md explains each finding.

    \b
    Example:
      celery-recovery --app proj.celery:app doctor
      celery -A proj recovery doctor --json
    """
    options = ctx.find_root().meta.get("celery_recovery", {})
    # Started as the worker starts it: task_time_limit, acks_late and annotations are
    # read from the tasks as it would run them.
    app = start_app(ctx)
    if app is None:
        raise CLIError("doctor needs the app: pass --app (or use `celery -A proj recovery doctor`)")
    overrides = {"database_url": options["database_url"]} if options.get("database_url") else {}
    report = diagnose(app, **overrides)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        _print(report)
    sys.exit(int(report.exit_status))


def _print(report: Report) -> None:
    for finding in report.findings:
        severity = click.style(finding.severity.value.upper(), fg=COLOURS[finding.severity])
        click.echo(f"{severity} {click.style(finding.id, bold=True)}: {finding.subject}")
        click.echo(f"{INDENT}{finding.problem}")
        click.echo(f"{INDENT}fix: {finding.fix}")
    for unknown in report.unknowns:
        heading = click.style("CANNOT TELL", fg=COLOURS["cannot tell"])
        click.echo(f"{heading} ({unknown.check}): {unknown.subject}")
        click.echo(f"{INDENT}{unknown.reason}")
        if unknown.fix:
            click.echo(f"{INDENT}to tell: {unknown.fix}")
    click.echo("read:")
    for line in report.read:
        click.echo(f"{INDENT}{line}")
    errors = sum(1 for f in report.findings if f.severity is Severity.ERROR)
    click.echo(
        f"{len(report.findings)} finding(s) ({errors} error(s)), {len(report.unknowns)} cannot tell"
    )
