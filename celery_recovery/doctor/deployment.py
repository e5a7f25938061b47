"""What the checks read, each thing once, on first use: the app's ``recovery_*`` settings,
its broker, result backend and tasks, the Redis servers it uses, and the store."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from celery_recovery.core.errors import RecoveryError
from celery_recovery.core.settings import RecoverySettings, app_values
from celery_recovery.core.urls import mask_url
from celery_recovery.store import Store

#: Seconds the doctor waits for a server to answer before it says it cannot tell.
CONNECT_TIMEOUT = 3.0

#: Broker URL schemes by the kind of server they talk to.
BROKER_KINDS = {
    "redis": "redis",
    "rediss": "redis",
    "redis+socket": "redis",
    "sentinel": "redis-sentinel",
    "amqp": "rabbitmq",
    "amqps": "rabbitmq",
    "pyamqp": "rabbitmq",
    "librabbitmq": "rabbitmq",
    "sqs": "sqs",
    "memory": "memory",
}
#: Celery's broker when none is configured.
DEFAULT_BROKER_URL = "amqp://guest@localhost//"


@dataclass(frozen=True)
class TaskFacts:
    """What the doctor needs of one registered task (after Celery's config and annotations)."""

    name: str
    acks_late: bool
    time_limit: float | None
    ignore_result: bool
    recoverable: bool


@dataclass
class RedisServer:
    """One Redis server and what the app keeps in it (several roles may share one)."""

    address: str
    roles: list[str]
    client: Callable[[], Any] = field(repr=False)


class Deployment:
    """The deployment of one Celery app, as the doctor reads it.

    ``settings``: the validated settings of an installed Recovery (a worker);
    without them they are read from the app like ``Recovery(app)`` would, with
    ``overrides``, and a refusal is kept in :attr:`settings_error` instead of raised.
    ``store``: the installation's store; without it one is opened on the settings'
    URL and closed by :meth:`close`.
    """

    def __init__(
        self,
        app: Any,
        settings: RecoverySettings | None = None,
        store: Store | None = None,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        self.app = app
        self._settings = settings
        self._overrides = overrides or {}
        self._store = store
        self._own_store: Store | None = None
        self.settings_error: str | None = None

    # -- settings --------------------------------------------------------------------

    @functools.cached_property
    def values(self) -> dict[str, Any] | None:
        """Every ``recovery_*`` setting by name, parsed but not cross-checked; None when
        one cannot be parsed (the reason is in :attr:`settings_error`)."""
        if self._settings is not None:
            return {f.name: getattr(self._settings, f.name) for f in fields(self._settings)}
        try:
            return app_values(self.app, **self._overrides)
        except RecoveryError as exc:
            self.settings_error = str(exc)
            return None

    # -- broker and backend ----------------------------------------------------------

    @functools.cached_property
    def broker_url(self) -> str:
        """The first URL of the broker the app publishes to (failover URLs follow it)."""
        url = self.app.conf.broker_write_url or self.app.conf.broker_url or DEFAULT_BROKER_URL
        if isinstance(url, list | tuple):
            url = url[0]
        return str(url).split(";")[0].strip()

    @property
    def broker_kind(self) -> str:
        """``redis``, ``rabbitmq``, ``sqs``, ``memory``, ``redis-sentinel`` or the scheme."""
        scheme = urlsplit(self.broker_url).scheme or self.broker_url.partition(":")[0]
        return BROKER_KINDS.get(scheme, scheme)

    @property
    def masked_broker(self) -> str:
        return mask_url(self.broker_url)

    @property
    def transport_options(self) -> dict[str, Any]:
        return dict(self.app.conf.broker_transport_options or {})

    def broker_connection(self) -> Any:
        """A kombu connection to the broker, not yet connected."""
        return self.app.connection_for_write(connect_timeout=CONNECT_TIMEOUT)

    @property
    def backend_url(self) -> str | None:
        backend = self.app.conf.result_backend
        return None if backend is None else str(backend)

    # -- tasks -----------------------------------------------------------------------

    @functools.cached_property
    def tasks(self) -> list[TaskFacts]:
        """The app's own tasks (Celery's and ours left out), as the worker runs them."""
        found = []
        for name, task in sorted(self.app.tasks.items()):
            if name.startswith(("celery.", "celery_recovery.")):
                continue
            limit = getattr(task, "time_limit", None)
            found.append(
                TaskFacts(
                    name=name,
                    acks_late=bool(getattr(task, "acks_late", False)),
                    time_limit=float(limit) if limit else None,
                    ignore_result=bool(getattr(task, "ignore_result", False)),
                    recoverable=hasattr(getattr(task, "run", None), "__recoverable__"),
                )
            )
        return found

    # -- Redis -----------------------------------------------------------------------

    def redis_servers(self) -> list[RedisServer]:
        """Each Redis server the app relies on, with its roles: the broker, the result
        backend, and the idempotency locks when a task is ``@recoverable``."""
        servers: dict[str, RedisServer] = {}

        def add(role: str, kwargs: dict[str, Any]) -> None:
            address = (
                f"unix://{kwargs['path']}"
                if kwargs.get("path")
                else f"{kwargs.get('host') or 'localhost'}:{kwargs.get('port') or 6379}"
            )
            if address in servers:
                servers[address].roles.append(role)
                return
            options = {
                **kwargs,
                "socket_connect_timeout": CONNECT_TIMEOUT,
                "socket_timeout": CONNECT_TIMEOUT,
                "decode_responses": True,
            }
            servers[address] = RedisServer(address, [role], functools.partial(_client, options))

        if self.broker_kind == "redis":
            add("broker", _redis_kwargs(self.broker_url))
        backend = self.backend_url or ""
        if backend.startswith(("redis://", "rediss://", "unix://")):
            add("result backend", _redis_kwargs(backend))
        values = self.values or {}
        if values.get("redis_url") and any(task.recoverable for task in self.tasks):
            add("idempotency locks", _redis_kwargs(values["redis_url"]))
        return list(servers.values())

    # -- store -----------------------------------------------------------------------

    def store(self) -> Store | None:
        """The metadata store, or None when there is none to read (settings refused, or
        a SQLite file no process has created yet: the doctor never creates one)."""
        if self._store is not None:
            return self._store
        if self._own_store is None:
            values = self.values
            if values is None:
                return None
            url = values["database_url"]
            path = sqlite_path(url)
            if path is not None and not path.exists():
                return None
            self._own_store = Store(url, values.get("database_pooler") or "auto")
        return self._own_store

    @property
    def database_url(self) -> str | None:
        if self._store is not None:
            return self._store.url
        return None if self.values is None else self.values["database_url"]

    def close(self) -> None:
        if self._own_store is not None:
            self._own_store.dispose()
            self._own_store = None


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite store URL, None for another database."""
    if not url.startswith("sqlite"):
        return None
    from sqlalchemy.engine import make_url

    return Path(make_url(url).database or "")


def _client(options: dict[str, Any]) -> Any:
    import redis

    return redis.Redis(connection_pool=redis.ConnectionPool(**options))


def _redis_kwargs(url: str) -> dict[str, Any]:
    """redis-py connection-pool arguments from a Redis URL as Celery and kombu write them
    (kombu accepts ``redis://host//`` for database 0, which redis-py refuses)."""
    from redis.connection import UnixDomainSocketConnection, parse_url

    parts = urlsplit(url)
    if parts.scheme == "redis+socket":
        return {"path": parts.path, "connection_class": UnixDomainSocketConnection}
    if parts.scheme in ("redis", "rediss") and parts.path.strip("/") == "":
        url = parts._replace(path="/0").geturl()
    return dict(parse_url(url))
