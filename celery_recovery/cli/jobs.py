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
from celery_recovery.core.records import CLEAN_SWEEP, SWEEP_COMPLETION
from celery_recovery.core.states import JobType
from celery_recovery.core.timeutils import utcnow
from celery_recovery.sweeps.fallback import MISSED_SWEEPS


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
    type=click.Choice([t.value for t in JobType]),
    help="Which kind of process must be alive.",
)
@click.option(
    "--sweeps",
    is_flag=True,
    help="Instead of a job: a sweep must have finished cleanly (no step failing) within "
    "3 x recovery_sweep_interval, whoever swept (beat, `sweep --loop`, a worker's fallback).",
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
    job_type: str | None,
    sweeps: bool,
    hostname: str | None,
    local: bool,
    threshold: float | None,
) -> None:
    """Exit 0 if a running job of this type has a fresh heartbeat, 1 if not, 2 on error.

    A worker whose consumer is stalled (alive, taking no messages while its queues
    hold some, or its broker connection down) fails too, with a line "stalled: ...".

    Prints one line saying why.  Use it as a Kubernetes liveness probe of a
    worker pod (see docs/cli.md).

    With --sweeps: exit 1 when no sweep finished cleanly lately, with the steps the
    last sweep failed and why (an alert for a sweeper that runs but recovers nothing).

    \b
    Example:
      celery-recovery --app proj.celery:app jobs check --job-type worker --local
      celery-recovery jobs check --job-type beat --threshold 60
      celery-recovery --app proj.celery:app jobs check --sweeps
    """
    if threshold is not None:
        # NaN compares false with every age: the probe would pass for a dead job.
        threshold = positive_seconds("--threshold", threshold, click.BadParameter)
    if (job_type is None) == (not sweeps):
        raise click.UsageError("give --job-type or --sweeps (one of them)")
    if sweeps:
        if local or hostname:
            raise click.UsageError("--sweeps checks the deployment's sweeps: no host to give")
        _check_sweeps(ctx, threshold)
        return
    assert job_type is not None
    if local and hostname:
        raise click.UsageError("give --hostname or --local, not both")
    host = socket.gethostname() if local else hostname
    with store_of(ctx) as (store, settings):
        # Ages on the store's clock, as the heartbeats were written (this host's may be off).
        store.follow_clock()
        now = utcnow()
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


def _check_sweeps(ctx: click.Context, threshold: float | None) -> None:
    with store_of(ctx) as (store, settings):
        store.follow_clock()
        now = utcnow()
        allowed = threshold if threshold is not None else MISSED_SWEEPS * settings.sweep_interval
        last = store.checkins.last(SWEEP_COMPLETION)
        clean = store.checkins.last_completed(CLEAN_SWEEP)
    clean_age = age_seconds(now, clean)
    if clean_age is not None and clean_age <= allowed:
        click.echo(f"OK: a sweep finished cleanly {clean_age:.1f}s ago; threshold {allowed:g}s")
        return
    since = (
        "no sweep has ever finished cleanly"
        if clean_age is None
        else (f"the last clean sweep finished {clean_age:.1f}s ago")
    )
    if last is None:
        click.echo(
            f"FAIL: no sweep has finished: nothing recovers tasks (run beat with the "
            f"recovery schedule, or `sweep --loop`); threshold {allowed:g}s"
        )
        sys.exit(1)
    completed, report = last
    steps = ", ".join(report.get("failing_steps") or []) or "a step"
    why = report.get("first_error") or "see the sweeper's log"
    click.echo(
        f"FAIL: sweeps run (the last {age_seconds(now, completed) or 0.0:.1f}s ago) but fail: "
        f"{steps} ({why}); {since}; threshold {allowed:g}s"
    )
    sys.exit(1)
