"""``celery-recovery jobs check``: a liveness probe from the jobs' heartbeats.

Exit 0 when a running job of the type (on the host) has a heartbeat younger
than the threshold, 1 when none does or (workers) when a live worker there
says its consumer is stalled (docs/stuck.md), 2 when the question cannot be answered
(bad option, store unreachable).  Always exactly one line, so a probe's log
says why it failed.
"""

from __future__ import annotations

import socket
import sys

import click

from celery_recovery.cli.output import age_seconds
from celery_recovery.cli.support import dead_after, store_of
from celery_recovery.core.consumer import stalled_reason
from celery_recovery.core.durations import positive_seconds
from celery_recovery.core.states import JobType
from celery_recovery.core.timeutils import utcnow


@click.group()
def jobs() -> None:
    """Check the jobs (worker processes, beats, triggerers) that heartbeat into the store.

    \b
    Example:
      celery-recovery --app proj.celery:app jobs check --job-type worker --local
    """


@jobs.command("check")
@click.option(
    "--job-type",
    required=True,
    type=click.Choice([t.value for t in JobType]),
    help="Which kind of process must be alive.",
)
@click.option(
    "--hostname",
    metavar="HOST",
    help="Only jobs on this host (host name or Celery node name, e.g. celery@host).",
)
@click.option("--local", is_flag=True, help="Only jobs on this machine (its host name).")
@click.option(
    "--threshold",
    type=float,
    metavar="SECONDS",
    help="Heartbeat age that counts as dead. Default: recovery_zombie_threshold for "
    "workers, recovery_health_check_threshold for beat and triggerer.",
)
@click.pass_context
def check(
    ctx: click.Context,
    job_type: str,
    hostname: str | None,
    local: bool,
    threshold: float | None,
) -> None:
    """Exit 0 if a running job of this type has a fresh heartbeat, 1 if not, 2 on error.

    A worker whose consumer is stalled (alive, taking no messages while its queues
    hold some, or its broker connection down) fails too, with a line "stalled: ...".

    Prints one line saying why.  Use it as a Kubernetes liveness probe of a
    worker pod (see docs/cli.md).

    \b
    Example:
      celery-recovery --app proj.celery:app jobs check --job-type worker --local
      celery-recovery jobs check --job-type beat --threshold 60
    """
    if threshold is not None:
        # NaN compares false with every age: the probe would pass for a dead job.
        threshold = positive_seconds("--threshold", threshold, click.BadParameter)
    if local and hostname:
        raise click.UsageError("give --hostname or --local, not both")
    host = socket.gethostname() if local else hostname
    now = utcnow()
    with store_of(ctx) as (store, settings):
        if threshold is None:
            threshold = dead_after(job_type, settings)
        job = store.jobs.freshest_job(job_type, host)
        consumers = store.jobs.consumer_jobs(host) if job_type == JobType.WORKER.value else []
    where = f" on {host}" if host else ""
    if job is None:
        click.echo(f"FAIL: no running {job_type} job{where}")
        sys.exit(1)
    age = age_seconds(now, job["latest_heartbeat"]) or 0.0
    facts = f"{job_type} job {job['id']} (pid {job['pid']} on {job['hostname']})"
    if age > threshold:
        click.echo(
            f"FAIL: freshest {job_type} heartbeat{where} is {age:.1f}s old: {facts}; "
            f"threshold {threshold:g}s"
        )
        sys.exit(1)
    for consumer_job in consumers:
        reason = stalled_reason(consumer_job.get("consumer"))
        fresh = (age_seconds(now, consumer_job["latest_heartbeat"]) or 0.0) <= threshold
        if reason is not None and fresh:
            node = consumer_job.get("node_name") or consumer_job["hostname"]
            process = f"job {consumer_job['id']}, pid {consumer_job['pid']}"
            click.echo(f"FAIL: stalled: {reason}: worker {node} ({process})")
            sys.exit(1)
    click.echo(f"OK: {facts} heartbeat {age:.1f}s ago; threshold {threshold:g}s")
