"""Ask the broker how many messages wait, ready, in a worker's queues.

One passive ``queue_declare`` per queue on a short-lived connection of its
own (never the consumer's, which may be the stuck one), bounded by a
timeout: Redis answers with the length of the queue's lists (LLEN, every
priority), RabbitMQ with the queue's ready message count.  A queue the
broker does not know holds nothing (Redis deletes an emptied list).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def ready_messages(app: Any, queues: Iterable[str], timeout: float) -> int:
    """Messages ready in ``queues`` on ``app``'s broker; raises on a connection error."""
    total = 0
    driver = app.connection_for_read().transport.driver_type
    # New options (Celery copies them over the app's): never the app's own dict, which
    # its consumer's connection shares.
    options = _timeouts(driver, timeout)
    with app.connection_for_read(connect_timeout=timeout, transport_options=options) as conn:
        conn.ensure_connection(max_retries=1, timeout=timeout)
        for name in queues:
            channel = conn.channel()
            try:
                total += channel.queue_declare(queue=name, passive=True).message_count
            except conn.channel_errors:
                pass  # not declared: nothing waits in it
            finally:
                try:
                    channel.close()
                except conn.connection_errors + conn.channel_errors:
                    pass
    return total


def _timeouts(driver: str, timeout: float) -> dict[str, float]:
    """Transport options that bound every wait of one connection by ``timeout``."""
    if driver == "redis":
        # Connecting and every reply (kombu passes them to redis-py).
        return {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if driver == "amqp":
        # py-amqp: reading and writing frames (connecting is ``connect_timeout``).
        return {"read_timeout": timeout, "write_timeout": timeout}
    return {}
