"""The failure-callback outbox row: one payload, built by :func:`callback_row` for every
writer and read back by :meth:`CallbackPayload.from_json` for the sweep that delivers it.

A row is written in the transaction of the compare-and-set that makes it due (a pool
process that died, a hard time limit, a sweep's reset, a trigger's failure), and is
delivered later, with no transaction open (:mod:`celery_recovery.sweeps.callbacks`).
The payload is a JSON object in ``callbacks.payload``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, TypedDict

#: What a row runs: ``on_failure`` (after the result backend and before the
#: ``task_failure`` signal), or ``on_retry``; the failure listeners hear of both.
CallbackKind = Literal["failure", "retry"]

#: The reason of a row that names none.
UNKNOWN_REASON = "worker lost"


class CallbackStep(StrEnum):
    """A step of a failure callback that its outbox row may say was already taken
    (:attr:`CallbackPayload.done`), so that delivery does not take it twice."""

    RESULT_BACKEND = "result backend"
    FAILURE_SIGNAL = "task_failure signal"
    ON_FAILURE = "on_failure"
    ON_RETRY = "on_retry"


@dataclass(frozen=True, kw_only=True)
class CallbackPayload:
    """What delivering a try's callbacks needs besides the try: its task, why it ended,
    its arguments, and which steps were already taken."""

    #: The task's registered name (None only in a row this package did not write).
    task_name: str | None
    #: Why the try ended: the message of the exception the callbacks receive.
    reason: str
    #: The exception class the callbacks receive, by name; None: a lost worker
    #: (:class:`~celery_recovery.core.errors.LostWorkerError`).
    exception: str | None = None
    #: The arguments ``on_failure``/``on_retry`` receive, as decoded JSON.
    args: Any
    kwargs: Any
    #: The job that ran the try, and its host, when known.
    job_id: str | None = None
    hostname: str | None = None
    #: Steps already taken (by Celery itself): delivery skips them.
    done: tuple[str, ...] = ()
    #: The message's reply route (rpc://): where the stored failure reaches the caller.
    reply_route: Mapping[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        """The stored JSON object; a field left unset is left out, as a reader reads an
        absent key as unset (rows from earlier versions lack the keys added since)."""
        optional = {
            "exception": self.exception,
            "job_id": self.job_id,
            "hostname": self.hostname,
            "done": list(self.done),
            "reply_route": dict(self.reply_route or {}),
        }
        return {
            "task_name": self.task_name,
            "reason": self.reason,
            "args": self.args,
            "kwargs": self.kwargs,
            **{key: value for key, value in optional.items() if value},
        }

    @classmethod
    def from_json(cls, value: Any) -> CallbackPayload | None:
        """The payload of a stored row, with a default for each absent key; None when
        ``value`` is not a payload this package writes (not a JSON object, or its
        ``done`` not a list)."""
        if not isinstance(value, dict):
            return None
        done = value.get("done") or ()
        if not isinstance(done, Iterable):
            return None
        return cls(
            task_name=value.get("task_name"),
            reason=value.get("reason") or UNKNOWN_REASON,
            args=value.get("args") or [],
            kwargs=value.get("kwargs") or {},
            exception=value.get("exception"),
            job_id=value.get("job_id"),
            hostname=value.get("hostname"),
            done=tuple(done),
            reply_route=value.get("reply_route"),
        )


class OutboxRow(TypedDict):
    """A ``callbacks`` row to insert (the claim's columns start empty)."""

    task_id: str
    try_number: int
    kind: CallbackKind
    payload: dict[str, Any]
    created_at: datetime


def callback_row(
    task_id: str,
    try_number: int,
    kind: CallbackKind,
    payload: CallbackPayload,
    created_at: datetime,
) -> OutboxRow:
    """The outbox row that runs ``kind`` callbacks for one try with ``payload``."""
    return {
        "task_id": task_id,
        "try_number": try_number,
        "kind": kind,
        "payload": payload.as_json(),
        "created_at": created_at,
    }
