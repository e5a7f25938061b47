"""A RabbitMQ broker: durable queues and persistent messages survive a restart, and
its ``consumer_timeout`` must exceed the longest hold.

RabbitMQ closes the channel of a consumer that keeps a delivery unacknowledged longer
than ``consumer_timeout`` (30 minutes by default) and requeues every message of that
channel: a long ``acks_late`` task or a far ETA is delivered again while the first
worker still holds it.  A queue may set its own (``x-consumer-timeout``, RabbitMQ
3.12+); the server-wide value is in rabbitmq.conf, which AMQP cannot read."""

from __future__ import annotations

from typing import Any

from celery_recovery.core.urls import mask_secrets
from celery_recovery.doctor.deployment import Deployment
from celery_recovery.doctor.findings import Report, Severity
from celery_recovery.doctor.holds import longest_hold

NAME = "rabbitmq"

#: RabbitMQ's consumer_timeout when neither rabbitmq.conf nor the queue sets one.
DEFAULT_CONSUMER_TIMEOUT = 1800.0
#: Delivery modes that RabbitMQ keeps in memory only.
TRANSIENT = ("transient", 1)


def check(d: Deployment, report: Report) -> None:
    if d.broker_kind != "rabbitmq":
        return
    _server(d, report)
    queues = list(d.app.amqp.queues.values())
    for queue in queues:
        _durability(queue, report)
    mode = d.app.conf.task_default_delivery_mode
    report.note(f"task_default_delivery_mode: {mode!r}")
    if mode in TRANSIENT:
        report.found(
            "rabbitmq-transient-messages",
            Severity.ERROR,
            "task_default_delivery_mode",
            f"task_default_delivery_mode is {mode!r}: RabbitMQ keeps task messages in memory "
            "only, and a broker restart loses every queued task, even in a durable queue.",
            "app.conf.task_default_delivery_mode = 'persistent'",
        )
    _consumer_timeout(d, queues, report)


def _server(d: Deployment, report: Report) -> None:
    try:
        with d.broker_connection() as conn:
            conn.ensure_connection(max_retries=1)
            properties = getattr(conn.connection, "server_properties", {}) or {}
    except Exception as exc:
        report.cannot_tell(
            NAME, f"broker {d.masked_broker}", f"did not answer: {mask_secrets(str(exc))}"
        )
        return
    version = properties.get("version", "unknown version")
    report.note(f"rabbitmq broker {d.masked_broker}: RabbitMQ {version}")


def _durability(queue: Any, report: Report) -> None:
    exchange = getattr(queue, "exchange", None)
    exchange_durable = exchange is None or not exchange.name or exchange.durable
    report.note(
        f"queue {queue.name}: durable {queue.durable}, auto_delete {queue.auto_delete}, "
        f"exchange {getattr(exchange, 'name', '') or '(default)'} durable {exchange_durable}, "
        f"arguments {queue.queue_arguments or {}}"
    )
    if queue.durable and not queue.auto_delete and exchange_durable:
        return
    what = []
    if not queue.durable:
        what.append("the queue is not durable")
    if queue.auto_delete:
        what.append("the queue is deleted when its last consumer goes")
    if not exchange_durable:
        what.append(f"its exchange {getattr(exchange, 'name', '')} is not durable")
    report.found(
        "rabbitmq-queue-not-durable",
        Severity.ERROR,
        f"queue {queue.name}",
        f"{', '.join(what)}: a broker restart (or every worker stopping) loses the queue "
        "and every task waiting in it.",
        f"Queue({queue.name!r}, durable=True, auto_delete=False) in app.conf.task_queues; "
        f"RabbitMQ keeps an existing queue's flags, so delete it first (rabbitmqctl "
        f"delete_queue {queue.name}) while no task waits in it",
    )


def _consumer_timeout(d: Deployment, queues: list[Any], report: Report) -> None:
    holds = longest_hold(d)
    for line in holds.notes:
        report.note(line)
    hold = holds.longest
    if hold is None:
        return
    for queue in queues:
        argument = (queue.queue_arguments or {}).get("x-consumer-timeout")
        if argument is None:
            if hold.seconds > DEFAULT_CONSUMER_TIMEOUT:
                report.cannot_tell(
                    NAME,
                    f"queue {queue.name}",
                    f"{hold.source} is longer than RabbitMQ's default consumer_timeout "
                    f"({DEFAULT_CONSUMER_TIMEOUT:g}s); the server's own value (rabbitmq.conf) "
                    "cannot be read over AMQP",
                    _timeout_fix(queue.name, hold.seconds),
                )
            continue
        timeout = float(argument) / 1000
        if hold.seconds > timeout:
            report.found(
                "rabbitmq-consumer-timeout",
                Severity.ERROR,
                f"queue {queue.name}",
                f"{hold.source} is longer than the queue's x-consumer-timeout of {timeout:g}s: "
                "RabbitMQ closes the worker's channel and delivers its unacknowledged "
                "messages again while the first worker still holds them; tasks run twice.",
                _timeout_fix(queue.name, hold.seconds),
            )


def _timeout_fix(queue: str, hold: float) -> str:
    milliseconds = int(hold * 1.5 * 1000)
    return (
        f"Queue({queue!r}, queue_arguments={{'x-consumer-timeout': {milliseconds}}}) in "
        f"app.conf.task_queues (RabbitMQ 3.12+; an existing queue must be deleted first), or "
        f"consumer_timeout = {milliseconds} in rabbitmq.conf"
    )
