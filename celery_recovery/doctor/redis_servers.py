"""Each Redis server the app keeps messages, results or locks in: it must never evict
a key (``maxmemory-policy noeviction``) and must survive a restart (AOF or RDB).

Read with ``CONFIG GET``, or ``INFO`` where a managed Redis disables ``CONFIG``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery_recovery.core.urls import mask_secrets
from celery_recovery.doctor.deployment import Deployment, RedisServer
from celery_recovery.doctor.findings import Report, Severity

NAME = "redis"

#: What each role loses when Redis evicts its keys.
EVICTED = {
    "broker": "queued and unacknowledged messages are evicted and their tasks vanish",
    "result backend": "results are evicted, so a sweep asking about a dead worker's task "
    "reads PENDING and may run a finished task again",
    "idempotency locks": "idempotency locks and remembered results are evicted, so a "
    "@recoverable task runs twice",
}
#: What each role loses when Redis restarts without persistence.
RESTARTED = {
    "broker": "every queued message is lost (published again only after "
    "recovery_queued_timeout, and never if it was published without celery-recovery)",
    "result backend": "results are forgotten, so a sweep asking about a dead worker's task "
    "may run a finished task again",
    "idempotency locks": "locks and remembered results are forgotten, so a @recoverable "
    "task runs twice",
}


@dataclass(frozen=True)
class RedisConfig:
    policy: str
    maxmemory: int
    appendonly: bool
    #: RDB save points ("" for none); None when CONFIG is not allowed.
    save: str | None


def check(d: Deployment, report: Report) -> None:
    for server in d.redis_servers():
        subject = f"redis {server.address} ({', '.join(server.roles)})"
        config = _read_or_say_why(server, subject, report)
        if config is None:
            continue
        save = "unreadable (CONFIG not allowed)" if config.save is None else repr(config.save)
        report.note(
            f"{subject}: maxmemory-policy {config.policy}, maxmemory {config.maxmemory}, "
            f"appendonly {'yes' if config.appendonly else 'no'}, save {save}"
        )
        _eviction(server, subject, config, report)
        _persistence(server, subject, config, report)


def _read_or_say_why(server: RedisServer, subject: str, report: Report) -> RedisConfig | None:
    import redis

    try:
        return _read(server)
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        # Answered, but refused: a wrong password, an ACL user without INFO.
        report.cannot_tell(
            NAME,
            subject,
            f"refused the doctor: {mask_secrets(str(exc))}",
            "let the URL's user run INFO and CONFIG GET (ACL: +info +config|get)",
        )
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        report.cannot_tell(NAME, subject, f"did not answer: {mask_secrets(str(exc))}")
    return None


def _eviction(server: RedisServer, subject: str, config: RedisConfig, report: Report) -> None:
    if config.policy == "noeviction":
        return
    limit = (
        f"with maxmemory {config.maxmemory} bytes"
        if config.maxmemory
        else "(maxmemory is 0 now, so nothing is evicted until a limit is set, as managed "
        "Redis services do)"
    )
    report.found(
        "redis-eviction",
        Severity.ERROR if config.maxmemory else Severity.WARNING,
        subject,
        f"maxmemory-policy is {config.policy} {limit}: when memory runs short, "
        + "; ".join(EVICTED[role] for role in server.roles)
        + ". Nothing reports it.",
        f"{_cli(server)} CONFIG SET maxmemory-policy noeviction, and "
        "`maxmemory-policy noeviction` in redis.conf (a managed Redis: its parameter group)",
    )


def _persistence(server: RedisServer, subject: str, config: RedisConfig, report: Report) -> None:
    if config.appendonly or config.save:
        return
    if config.save is None:
        report.cannot_tell(
            NAME,
            subject,
            "appendonly is off and the RDB save points cannot be read (CONFIG is not "
            "allowed): a restart may lose everything in it",
            "check the server's persistence settings (a managed Redis: its backup/AOF option)",
        )
        return
    report.found(
        "redis-not-persistent",
        Severity.WARNING,
        subject,
        "no AOF and no RDB save points: when Redis restarts, "
        + "; ".join(RESTARTED[role] for role in server.roles)
        + ".",
        f"{_cli(server)} CONFIG SET appendonly yes, then CONFIG REWRITE (or `appendonly yes` "
        "and `appendfsync everysec` in redis.conf)",
    )


def _read(server: RedisServer) -> RedisConfig:
    import redis

    client = server.client()
    try:

        def config(name: str) -> Any:
            try:
                return client.config_get(name).get(name)
            except redis.ResponseError:  # CONFIG renamed or refused (managed Redis)
                return None

        memory = client.info("memory")
        policy = config("maxmemory-policy") or memory.get("maxmemory_policy", "unknown")
        maxmemory = config("maxmemory")
        appendonly = config("appendonly")
        if appendonly is None:
            appendonly = "yes" if client.info("persistence").get("aof_enabled") else "no"
        return RedisConfig(
            policy=str(policy),
            maxmemory=int(maxmemory if maxmemory is not None else memory.get("maxmemory", 0)),
            appendonly=str(appendonly) == "yes",
            save=config("save"),
        )
    finally:
        # The pool was passed in, so closing the client would leave its socket open.
        client.connection_pool.disconnect()


def _cli(server: RedisServer) -> str:
    host, _, port = server.address.rpartition(":")
    if server.address.startswith("unix://"):
        return f"redis-cli -s {server.address[len('unix://') :]}"
    return f"redis-cli -h {host} -p {port}"
