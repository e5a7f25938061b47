"""RabbitMQ's management API, asked only when it answers: the server's own view of a
queue (its durability, and the consumer timeout its arguments or policy set), which
AMQP cannot give.  Without the plugin the doctor reads the app's declarations."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from celery_recovery.doctor.deployment import CONNECT_TIMEOUT

#: The management plugin's port (RabbitMQ's default).
MANAGEMENT_PORT = 15672


@dataclass(frozen=True)
class ServerQueue:
    """A queue as the server has it."""

    durable: bool
    auto_delete: bool
    #: Seconds, from the queue's ``x-consumer-timeout`` or its policy's
    #: ``consumer-timeout``; None when neither sets one.
    consumer_timeout: float | None
    #: Where ``consumer_timeout`` was read.
    timeout_source: str = ""


class ManagementAPI:
    """The management API of the broker's host, with the broker's credentials."""

    def __init__(self, connection: Any) -> None:
        self.base = f"http://{connection.hostname or 'localhost'}:{MANAGEMENT_PORT}/api"
        self.vhost = connection.virtual_host or "/"
        credentials = f"{connection.userid or 'guest'}:{connection.password or 'guest'}"
        self._auth = "Basic " + base64.b64encode(credentials.encode()).decode()
        #: Why the API cannot be used (set at the first failure, which ends the asking).
        self.unavailable: str | None = None

    def queue(self, name: str) -> ServerQueue | None:
        """The server's queue ``name``; None when it does not exist there or the API
        does not answer (then :attr:`unavailable` says why)."""
        if self.unavailable is not None:
            return None
        url = f"{self.base}/queues/{quote(self.vhost, safe='')}/{quote(name, safe='')}"
        request = urllib.request.Request(url, headers={"Authorization": self._auth})
        try:
            with urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT) as response:
                return server_queue(json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            self.unavailable = f"{self.base} answered HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            self.unavailable = f"{self.base} did not answer ({exc})"
        return None


def server_queue(info: dict[str, Any]) -> ServerQueue:
    """A queue from the API's JSON (``GET /api/queues/VHOST/NAME``)."""
    arguments = info.get("arguments") or {}
    policy = info.get("effective_policy_definition") or {}
    timeout, source = None, ""
    if "x-consumer-timeout" in arguments:
        timeout, source = float(arguments["x-consumer-timeout"]) / 1000, "x-consumer-timeout"
    elif "consumer-timeout" in policy:
        timeout = float(policy["consumer-timeout"]) / 1000
        source = f"policy {info.get('policy') or ''} consumer-timeout".replace("  ", " ")
    return ServerQueue(
        durable=bool(info.get("durable", True)),
        auto_delete=bool(info.get("auto_delete", False)),
        consumer_timeout=timeout,
        timeout_source=source,
    )
