"""Receives a dead worker left open: on SQS they still take messages.

A consumer on Amazon SQS long-polls: each ``ReceiveMessage`` waits on the
server up to ``wait_time_seconds`` (a broker transport option; kombu's default
is 10 s, SQS allows 20) for a message to arrive.  When the worker is
SIGKILLed during that wait, the server does not know: the receive stays open
until its wait ends, and takes the first message that becomes visible
meanwhile.  That message is then in flight to a process that no longer
exists, invisible to every live worker for the queue's visibility timeout
(kombu creates queues with 30 minutes), and no worker records holding it.
Measured with moto's SQS server (docs/brokers.md); nothing in SQS's contract
says a closed connection ends a receive sooner.

A try the sweep publishes again because its worker died a moment ago is
exactly such a message: it would go to the dead worker's own receive, and come
back only through the lost-message sweep, ``recovery_queued_timeout`` later,
as a third try.  So on SQS it is published with a delivery delay
(``DelaySeconds``) that ends after every receive the dead worker may have left
open.  The worker died before the sweep found it, and its last receive began
before it died: that receive ends at most the wait after now (plus
:data:`MARGIN`).  Its last heartbeat gives no closer bound: a starved
heartbeat thread beats late, and a receive begun after it is still open.  On
other brokers a dead consumer takes nothing (Redis's ``BRPOP`` and RabbitMQ's
deliveries end with the connection), and the delay is 0.
"""

from __future__ import annotations

import math
from typing import Any

from celery import Celery

#: kombu's ``wait_time_seconds`` when the transport options set none.
SQS_DEFAULT_WAIT_TIME = 10.0
#: Seconds added to the wait: moto's server looks for messages once a second, so its
#: receives run up to a second past their wait; and one for the network.
MARGIN = 2.0
#: The longest delivery delay SQS accepts (15 minutes).
SQS_MAX_DELAY = 900


def open_receive_wait(app: Celery) -> float:
    """How long a receive of a dead consumer of ``app``'s broker may still take messages
    (seconds): SQS's long-poll wait, 0 on other brokers."""
    connection = app.connection_for_write()
    try:
        driver = connection.transport.driver_type
        options = connection.transport_options or {}
    finally:
        connection.release()
    if driver != "sqs":
        return 0.0
    wait = options.get("wait_time_seconds")
    return SQS_DEFAULT_WAIT_TIME if wait is None else max(float(wait), 0.0)


def republish_delay(app: Celery) -> int:
    """Seconds to hold back a try published again because its worker died, so that no
    receive the dead worker left open can take it (0 on brokers without such receives)."""
    wait = open_receive_wait(app)
    if wait <= 0:
        return 0
    return min(math.ceil(wait + MARGIN), SQS_MAX_DELAY)


def delay_options(seconds: int) -> dict[str, Any]:
    """The publish options that hold a message back ``seconds`` on the broker (SQS's
    ``DelaySeconds`` message property, which kombu's SQS transport sends)."""
    return {"DelaySeconds": seconds} if seconds > 0 else {}
