"""Brokers the other checks do not read: one that keeps messages in a process's memory,
and those the doctor cannot ask (Redis Sentinel, other kombu transports); and whether
workers answer over the broker at all (remote control, the sweeps' second opinion)."""

from __future__ import annotations

from celery_recovery.doctor.deployment import Deployment
from celery_recovery.doctor.findings import Report, Severity

NAME = "broker"

#: Broker kinds another check reads.
READ_ELSEWHERE = ("redis", "rabbitmq", "sqs")


def check(d: Deployment, report: Report) -> None:
    kind = d.broker_kind
    report.note(f"broker: {d.masked_broker} ({kind})")
    if not d.app.conf.worker_enable_remote_control:
        report.found(
            "remote-control-disabled",
            Severity.WARNING,
            "worker_enable_remote_control",
            "workers take no remote-control commands, so a sweep cannot ask a worker whose "
            "store heartbeats stopped whether it still runs its tasks: a worker cut off from "
            "the store alone (a network partition, a pooler restart, max_connections "
            "exhausted) is taken for dead after the zombie threshold, and its running tasks "
            "run a second time beside it.",
            "app.conf.worker_enable_remote_control = True (Celery's default)",
        )
    if kind in READ_ELSEWHERE:
        return
    if kind == "memory":
        report.found(
            "broker-not-persistent",
            Severity.ERROR,
            f"broker {d.masked_broker}",
            "the memory:// transport keeps messages inside one process: workers in other "
            "processes never see them, and every queued task is gone when it exits.",
            "app.conf.broker_url = 'redis://HOST:6379/0' (or 'amqp://USER:PASSWORD@HOST//')",
        )
        return
    report.note(
        f"broker {d.masked_broker}: the doctor does not read {kind} servers "
        "(eviction, persistence and timeouts not checked)"
    )
