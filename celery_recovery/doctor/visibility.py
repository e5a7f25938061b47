"""The visibility timeout of a Redis or SQS broker against the longest hold.

Redis (kombu) and SQS give an unacknowledged message to another consumer once it
has been out for ``visibility_timeout`` seconds, whether or not the worker holding
it is alive: an ``acks_late`` task that runs longer, or a countdown/ETA task that
waits longer, runs twice."""

from __future__ import annotations

import math

from celery_recovery.doctor.deployment import Deployment
from celery_recovery.doctor.findings import Report, Severity
from celery_recovery.doctor.holds import longest_hold

NAME = "visibility timeout"

#: kombu's defaults when broker_transport_options sets none.
DEFAULT_VISIBILITY_TIMEOUTS = {"redis": 3600.0, "redis-sentinel": 3600.0, "sqs": 1800.0}
#: The suggested timeout leaves this much room above the longest hold.
MARGIN = 1.5


def check(d: Deployment, report: Report) -> None:
    default = DEFAULT_VISIBILITY_TIMEOUTS.get(d.broker_kind)
    if default is None:
        return
    given = d.transport_options.get("visibility_timeout")
    timeout = float(given) if given is not None else default
    source = "broker_transport_options" if given is not None else "kombu's default"
    report.note(f"{d.broker_kind} broker: visibility_timeout {timeout:g}s ({source})")
    holds = longest_hold(d)
    for line in holds.notes:
        report.note(line)
    hold = holds.longest
    if hold is None or hold.seconds <= timeout:
        return
    suggested = math.ceil(hold.seconds * MARGIN)
    report.found(
        "visibility-timeout-short",
        Severity.WARNING,
        f"broker {d.masked_broker}",
        f"{hold.source} is longer than the broker's visibility_timeout of {timeout:g}s "
        f"({source}): the broker gives the message to another worker while the first still "
        "holds it, again every timeout. Only celery-recovery's redundant-delivery check, "
        "which finds the first run live in the store, keeps the task from running twice; it "
        "cannot while the store is down, nor on a worker without Recovery(app).",
        f"app.conf.broker_transport_options = {{'visibility_timeout': {suggested}}} "
        "(keep the other options you set; celery-recovery, not this timeout, brings back "
        "the tasks of a dead worker)",
    )
