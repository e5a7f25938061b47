"""Ask the result backend what really happened to a task before touching its record."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery import Celery, states
from celery.backends.base import BaseKeyValueStoreBackend

from celery_recovery.core.states import DEFERRED_STATE
from celery_recovery.messages.result_backends import unaskable_because

logger = logging.getLogger("celery_recovery.probe")

#: Our state for "the backend did not answer" (down, or failing): asked again later.
UNKNOWN = "UNKNOWN"
#: Our state for "this kind of backend cannot answer for another process" (none is
#: configured, or ``rpc://``): nothing is asked, and asking again would not help.
UNASKABLE = "UNASKABLE"


@dataclass(frozen=True)
class Probe:
    """The backend's view of one task id."""

    state: str
    result: Any = None
    hostname: str | None = None
    pid: int | None = None


def probe_many(app: Celery, task_ids: list[str]) -> dict[str, Probe]:
    """Probe several tasks, in one round trip where the backend allows (key-value stores)."""
    backend = app.backend
    if unaskable_because(backend) is not None:
        return {task_id: Probe(UNASKABLE) for task_id in task_ids}
    if len(task_ids) > 1 and _reads_many(backend):
        try:
            values = backend.mget([backend.get_key_for_task(t) for t in task_ids])
            return {
                task_id: _from_meta(
                    backend.decode_result(value) if value else {"status": states.PENDING}
                )
                for task_id, value in zip(task_ids, values, strict=True)
            }
        except Exception as exc:
            logger.warning("celery-recovery: bulk probe failed (%s); probing one by one", exc)
    return {task_id: probe(app, task_id) for task_id in task_ids}


def _reads_many(backend: Any) -> bool:
    """A key-value backend that implements ``mget`` (Redis, memcached); django-celery-results'
    ``django-cache`` does not, and is asked one task at a time."""
    return (
        isinstance(backend, BaseKeyValueStoreBackend)
        and type(backend).mget is not BaseKeyValueStoreBackend.mget
    )


def probe(app: Celery, task_id: str) -> Probe:
    """The backend's state of ``task_id``; :data:`UNKNOWN` when it did not answer,
    :data:`UNASKABLE` when it cannot answer for another process (none, ``rpc://``)."""
    backend = app.backend
    if unaskable_because(backend) is not None:
        return Probe(UNASKABLE)
    try:
        meta = backend.get_task_meta(task_id)
    except NotImplementedError:
        return Probe(states.PENDING)
    except Exception as exc:
        logger.warning("celery-recovery: result backend did not answer for %s: %s", task_id, exc)
        text = str(exc).strip().splitlines()
        return Probe(UNKNOWN, f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__)
    return _from_meta(meta)


def finished_state(app: Celery, task_id: str) -> str | None:
    """The finished state (one of Celery's ready states) the backend holds for
    ``task_id``; None when it holds another, none, or cannot answer."""
    state = probe(app, task_id).state
    return state if state in states.READY_STATES else None


def _from_meta(meta: dict[str, Any]) -> Probe:
    state = meta.get("status") or states.PENDING
    result = meta.get("result")
    hostname = pid = None
    if state == states.STARTED and isinstance(result, dict):
        hostname, pid = result.get("hostname"), result.get("pid")
    return Probe(state, result, hostname, pid)


def never_started(seen: Probe, live: Mapping[tuple[Any, Any], Any]) -> bool:
    """Whether the backend's state leaves a queued try unstarted.

    ``live`` holds the live worker jobs by (node name, pid).  :data:`UNASKABLE`:
    nothing but the store can tell, and the store says queued (a try that may have
    started with its claim lost runs again: at least once).  ``PENDING``:
    nothing ever started.  ``DEFERRED``: its trigger fired and the resume was
    published (a started resume stores ``STARTED``).  ``RETRY``: the earlier try
    retried and published this one (a start of this try would have stored
    ``STARTED``, or its signals would have claimed it).  ``STARTED`` by a
    process that is not a live worker: the earlier try, which died.
    """
    if seen.state in (UNASKABLE, states.PENDING, states.RETRY, DEFERRED_STATE):
        return True
    return seen.state == states.STARTED and (seen.hostname, seen.pid) not in live
