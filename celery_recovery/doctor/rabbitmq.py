"""A RabbitMQ broker: durable queues and persistent messages survive a restart, and
its ``consumer_timeout`` must exceed the longest hold.

RabbitMQ closes the channel of a consumer that keeps a delivery unacknowledged longer
than ``consumer_timeout`` (30 minutes by default) and requeues every message of that
channel: a long ``acks_late`` task or a far ETA is delivered again while the first
worker still holds it.  A queue may set its own (``x-consumer-timeout``, RabbitMQ
3.12+) or a policy (``consumer-timeout``), read through the management API when it
answers; the server-wide value is in rabbitmq.conf, which neither can read."""

from __future__ import annotations

from typing import Any

from celery_recovery.core.urls import mask_secrets
from celery_recovery.doctor.deployment import Deployment
from celery_recovery.doctor.findings import Report, Severity
from celery_recovery.doctor.holds import longest_hold
from celery_recovery.doctor.management import ManagementAPI, ServerQueue

NAME = "rabbitmq"

#: RabbitMQ's consumer_timeout when neither rabbitmq.conf nor the queue sets one.
DEFAULT_CONSUMER_TIMEOUT = 1800.0
#: Delivery modes that RabbitMQ keeps in memory only.
TRANSIENT = ("transient", 1)


def check(d: Deployment, report: Report) -> None:
    if d.broker_kind != "rabbitmq":
        return
    _server(d, report)
    api = ManagementAPI(d.broker_connection())
    queues = [(queue, api.queue(queue.name)) for queue in d.app.amqp.queues.values()]
    if api.unavailable:
        report.note(
            f"rabbitmq management API: {api.unavailable}; queue flags and consumer timeouts "
            "read from the app's declarations only"
        )
    for queue, on_server in queues:
        _durability(queue, on_server, report)
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
            conn.ensure_connection(max_retries=0)  # one attempt: a worker must not wait
            properties = getattr(conn.connection, "server_properties", {}) or {}
    except Exception as exc:
        report.cannot_tell(
            NAME, f"broker {d.masked_broker}", f"did not answer: {mask_secrets(str(exc))}"
        )
        return
    version = properties.get("version", "unknown version")
    report.note(f"rabbitmq broker {d.masked_broker}: RabbitMQ {version}")


def _durability(queue: Any, on_server: ServerQueue | None, report: Report) -> None:
    exchange = getattr(queue, "exchange", None)
    exchange_durable = exchange is None or not exchange.name or exchange.durable
    durable, auto_delete = queue.durable, queue.auto_delete
    where = "declared by the app"
    if on_server is not None:
        # The server keeps the flags of whoever declared the queue first.
        durable, auto_delete, where = on_server.durable, on_server.auto_delete, "on the server"
    report.note(
        f"queue {queue.name} ({where}): durable {durable}, auto_delete {auto_delete}, "
        f"exchange {getattr(exchange, 'name', '') or '(default)'} durable {exchange_durable}, "
        f"arguments {queue.queue_arguments or {}}"
    )
    if durable and not auto_delete and exchange_durable:
        return
    what = []
    if not durable:
        what.append("the queue is not durable")
    if auto_delete:
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


def _consumer_timeout(
    d: Deployment, queues: list[tuple[Any, ServerQueue | None]], report: Report
) -> None:
    holds = longest_hold(d)
    for line in holds.notes:
        report.note(line)
    hold = holds.longest
    if hold is None:
        return
    for queue, on_server in queues:
        timeout, source = _queue_timeout(queue, on_server)
        if timeout is None:
            if hold.seconds > DEFAULT_CONSUMER_TIMEOUT:
                report.cannot_tell(
                    NAME,
                    f"queue {queue.name}",
                    f"{hold.source} is longer than RabbitMQ's default consumer_timeout "
                    f"({DEFAULT_CONSUMER_TIMEOUT:g}s); the server's own value (rabbitmq.conf) "
                    "cannot be read over AMQP or the management API",
                    _timeout_fix(queue.name, hold.seconds),
                )
            continue
        if hold.seconds > timeout:
            report.found(
                "rabbitmq-consumer-timeout",
                Severity.ERROR,
                f"queue {queue.name}",
                f"{hold.source} is longer than the queue's {source} of {timeout:g}s: "
                "RabbitMQ closes the worker's channel and delivers its unacknowledged "
                "messages again while the first worker still holds them; tasks run twice.",
                _timeout_fix(queue.name, hold.seconds),
            )


def _queue_timeout(queue: Any, on_server: ServerQueue | None) -> tuple[float | None, str]:
    """The queue's consumer timeout in seconds and where it was read: the server's view
    first (its arguments or policy), else the app's declaration."""
    if on_server is not None and on_server.consumer_timeout is not None:
        return on_server.consumer_timeout, on_server.timeout_source
    argument = (queue.queue_arguments or {}).get("x-consumer-timeout")
    if argument is None:
        return None, ""
    return float(argument) / 1000, "x-consumer-timeout"


def _timeout_fix(queue: str, hold: float) -> str:
    milliseconds = int(hold * 1.5 * 1000)
    return (
        f"Queue({queue!r}, queue_arguments={{'x-consumer-timeout': {milliseconds}}}) in "
        f"app.conf.task_queues (RabbitMQ 3.12+; an existing queue must be deleted first), or "
        f"consumer_timeout = {milliseconds} in rabbitmq.conf"
    )
