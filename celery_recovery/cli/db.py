"""``db``: the store's schema (upgrade, current) and the retention of its history (clean)."""

from __future__ import annotations

import sys

import click

from celery_recovery.cli.output import ROW_COUNT
from celery_recovery.cli.support import CLIError, first_line, settings_of, store_of
from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.timeutils import utcnow
from celery_recovery.core.urls import mask_secrets, mask_url
from celery_recovery.store import RETENTION_TABLES, Store
from celery_recovery.store.engine import create_store_engine
from celery_recovery.store.migrate import current_revision, head_revision, upgrade
from celery_recovery.sweeps.retention import (
    DEFAULT_BATCH_SIZE,
    check_tables,
    clean,
    count_expired,
    parse_cutoff,
)


@click.group()
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
    settings = settings_of(ctx)
    engine = create_store_engine(
        settings.database_url, for_migrations=True, pooler=settings.database_pooler
    )
    try:
        before = current_revision(engine)
        upgrade(engine, revision)
        after = current_revision(engine)
    except Exception as exc:
        raise CLIError(
            f"db upgrade failed on {mask_url(settings.database_url)}: "
            f"{mask_secrets(first_line(exc))}"
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
    settings = settings_of(ctx)
    store = Store(settings.database_url, settings.database_pooler)
    try:
        current = current_revision(store.engine)
    except Exception as exc:
        raise CLIError(
            f"cannot read {mask_url(settings.database_url)}: {mask_secrets(first_line(exc))}"
        ) from None
    finally:
        store.dispose()
    head = head_revision()
    state = "up to date" if current == head else f"needs upgrade to {head}"
    click.echo(f"{mask_url(settings.database_url)}: schema {current or 'none'} ({state})")
    if current != head:
        sys.exit(1)


@db.command("clean")
@click.option(
    "--before",
    required=True,
    metavar="TIME|AGE",
    help="Delete history older than this: an ISO 8601 timestamp (UTC unless it says "
    "otherwise) or an age such as 30d, 12h, 90m.",
)
@click.option(
    "--table",
    "tables",
    multiple=True,
    type=click.Choice(RETENTION_TABLES),
    help="Only this table (repeatable). Default: all of them.",
)
@click.option("--dry-run", is_flag=True, help="Only count what would be deleted.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--batch-size",
    default=DEFAULT_BATCH_SIZE,
    show_default=True,
    type=ROW_COUNT,
    help="Rows deleted per transaction.",
)
@click.pass_context
def db_clean(
    ctx: click.Context,
    before: str,
    tables: tuple[str, ...],
    dry_run: bool,
    yes: bool,
    batch_size: int,
) -> None:
    """Delete finished jobs, tries, triggers and stale callbacks older than --before.

    Never deletes a running job, a queued, running or deferred try, or the
    trigger of one.  Deletes in batches, each its own short transaction (on
    PostgreSQL skipping rows another transaction holds), so sweeps and workers
    never wait on it for more than one batch.  Asks for confirmation unless
    --yes.

    \b
    Example:
      celery-recovery --app proj.celery:app db clean --before 30d --dry-run
      celery-recovery db clean --before 2024-05-01T00:00:00Z --table task_records --yes
    """
    now = utcnow()
    try:
        cutoff = parse_cutoff(before, now)
        chosen = check_tables(tables)
    except ConfigurationError as exc:
        raise click.BadParameter(
            str(exc).removeprefix("--before="), param_hint="--before"
        ) from None
    with store_of(ctx) as (store, settings):
        counts = count_expired(store, cutoff, chosen, now)
        total = sum(counts.values())
        summary = ", ".join(f"{name} {count}" for name, count in counts.items())
        click.echo(
            f"{settings.masked_database_url}: rows older than {cutoff.isoformat()}: {summary}"
        )
        if dry_run or total == 0:
            click.echo("dry run: nothing deleted" if dry_run else "nothing to delete")
            return
        if not yes and not click.confirm(f"Delete these {total} rows?", default=False):
            click.echo("aborted: nothing deleted")
            ctx.exit(1)
        report = clean(store, cutoff, chosen, batch_size, now)
    deleted = ", ".join(f"{name} {count}" for name, count in report.deleted.items())
    click.echo(
        f"deleted: {deleted} ({report.batches} batches in {report.duration:.1f}s, "
        f"longest batch {report.longest_batch:.2f}s)"
    )
