"""The metadata store's tables.

``task_records`` holds one row per task id and try; a try's primary key never
changes, so retries add rows and history stays intact.  Partial indexes cover
the sweeps' hot lookups (running tries by job, queued tries by age) so they
never scan finished history.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_name)s",
        "pk": "pk_%(table_name)s",
    }
)

#: JSONB on PostgreSQL, JSON text elsewhere.
Json = JSON().with_variant(JSONB(), "postgresql")
#: 64-bit ids on PostgreSQL; SQLite's INTEGER PRIMARY KEY is already 64-bit and autoincrements.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class EncodedJSON(str):
    """A JSON document already encoded (in kombu's encoding), stored as it is."""


class UnreadableJSON(str):
    """A stored payload that is not JSON in kombu's encoding (written by hand, or
    corrupted), read back as its raw text.  Nothing decodes it further: it is
    never unpickled, and a try holding one is not published again."""


def unreadable(*values: Any) -> bool:
    """Whether any of ``values`` is a payload the store could not decode."""
    return any(isinstance(v, UnreadableJSON) for v in values)


class MessageJSON(TypeDecorator[Any]):
    """Message payloads as JSON text in kombu's encoding.

    Text rather than JSONB: payloads are written on the hot path and read
    back whole, so the server never needs to parse them.  Dates, UUIDs and
    decimals round-trip as they do through Celery's JSON serializer.  Text
    that does not decode is returned as :class:`UnreadableJSON`, so one bad
    row cannot make a whole query (and the sweep that runs it) fail.
    """

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        if value is None or isinstance(value, EncodedJSON | UnreadableJSON):
            return str(value) if isinstance(value, UnreadableJSON) else value
        return kombu_dumps(value)

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        if value is None:
            return None
        try:
            return kombu_loads(value)
        except Exception:  # JSON errors, and kombu's typed values (dates, decimals) gone bad
            return UnreadableJSON(value)


def _aware_utc(value: datetime) -> datetime:
    if value.tzinfo is not UTC:
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} given to the store; use aware UTC")
        value = value.astimezone(UTC)
    return value


def _sqlite_text(value: datetime | None) -> str | None:
    if value is None:
        return None
    # "YYYY-MM-DD HH:MM:SS.ffffff": SQLite DATETIME's storage format, without the "+00:00".
    return _aware_utc(value).isoformat(" ", "microseconds")[:-6]


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> datetime | None:
        if value is None:
            return None
        value = _aware_utc(value)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def bind_processor(self, dialect: Any) -> Any:
        if dialect.name == "sqlite":
            # Straight to the text SQLAlchemy's SQLite DATETIME stores, on every path: the
            # batched writes hand rows to the driver themselves, whose own datetime adapter
            # (deprecated since Python 3.12) drops a zero microsecond part, so their times
            # would not compare as text with the rest.  One call instead of three a value.
            return _sqlite_text
        return super().bind_processor(dialect)

    def process_result_value(self, value: Any, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


jobs = Table(
    "jobs",
    metadata,
    Column("id", String(32), primary_key=True, comment="Random hex id made by the process"),
    Column("job_type", String(16), nullable=False),
    Column("hostname", String(255), nullable=False, comment="Machine host name"),
    Column("node_name", String(255), comment="Celery node name, e.g. celery@host"),
    Column("pid", Integer, nullable=False),
    Column(
        "parent_pid",
        Integer,
        comment="Process id of the worker's main process, for a pool process",
    ),
    Column("state", String(16), nullable=False),
    Column("start_date", UTCDateTime, nullable=False),
    Column("end_date", UTCDateTime),
    Column("latest_heartbeat", UTCDateTime, nullable=False),
    Column("queues", Text, comment="Comma-separated queues a triggerer serves"),
    Column(
        "process_marker",
        String(200),
        comment="Boot id, pid namespace and start time of the process (Linux)",
    ),
    Column(
        "marker_lock",
        BigInteger,
        comment="PostgreSQL advisory lock key held while the process tree lives",
    ),
    Column(
        "marker_missing_since",
        UTCDateTime,
        comment="When a sweep first saw the advisory lock missing",
    ),
    Column(
        "consumer",
        Json,
        comment="A worker main process's broker consumer state (JSON), with its heartbeat",
    ),
    Index(
        "ix_jobs_live",
        "job_type",
        "latest_heartbeat",
        postgresql_where=text("state = 'running'"),
        sqlite_where=text("state = 'running'"),
    ),
)

task_records = Table(
    "task_records",
    metadata,
    Column("task_id", String(255), primary_key=True),
    Column("try_number", Integer, primary_key=True, comment="Celery retries + 1"),
    Column("task_name", String(255), nullable=False),
    Column("state", String(16), nullable=False),
    Column("queue", String(255)),
    Column("exchange", String(255)),
    Column("routing_key", String(255)),
    Column("priority", Integer),
    Column("args", MessageJSON),
    Column("kwargs", MessageJSON),
    Column("headers", MessageJSON, comment="Message headers needed to publish the task again"),
    Column("options", MessageJSON, comment="Linked callbacks, chain and chord of the message"),
    Column("republishable", Boolean, nullable=False, server_default=text("true")),
    Column("republish_error", Text, comment="Why the task cannot be published again"),
    Column("eta", UTCDateTime),
    Column("expires", UTCDateTime),
    Column("job_id", String(32), comment="jobs.id of the process running this try"),
    Column("worker_hostname", String(255)),
    Column("worker_pid", Integer),
    Column("external_executor_id", String(255), comment="Celery task id to probe the backend"),
    Column("queued_at", UTCDateTime),
    Column("started_at", UTCDateTime),
    Column("ended_at", UTCDateTime),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("state_reason", Text, comment="Why the try reached its state"),
    Column("error", Text),
    Column("publish_count", Integer, nullable=False, server_default=text("1")),
    Column("adopted_until", UTCDateTime),
    Column("recovered_at", UTCDateTime, comment="When a sweep reset, reconciled or adopted it"),
    Column("late_state", String(16), comment="Outcome reported after it was recovered"),
    Column("late_at", UTCDateTime),
    Column("idempotency_key", String(512)),
    Column("fencing_token", BigInteger),
    Column(
        "deaths",
        Integer,
        nullable=False,
        server_default=text("0"),
        comment="Runs of this try that ended with the death of their process",
    ),
    Index(
        "ix_task_records_running_job",
        "job_id",
        postgresql_where=text("state = 'running'"),
        sqlite_where=text("state = 'running'"),
    ),
    Index(
        "ix_task_records_queued_at",
        "queued_at",
        postgresql_where=text("state = 'queued'"),
        sqlite_where=text("state = 'queued'"),
    ),
    Index("ix_task_records_ended_at", "ended_at"),
    # The console's search by task name, newest first.
    Index("ix_task_records_task_name", "task_name", "queued_at"),
)

triggers = Table(
    "triggers",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("classpath", String(1000), nullable=False),
    Column("kwargs", Json, nullable=False),
    Column("task_id", String(255), nullable=False),
    Column("try_number", Integer, nullable=False),
    Column("method_name", String(255)),
    Column("method_kwargs", Json),
    Column("queue", String(255)),
    Column("timeout_at", UTCDateTime),
    Column("triggerer_id", String(32), comment="jobs.id of the triggerer running it"),
    Column("created_at", UTCDateTime, nullable=False),
    Column("claimed_at", UTCDateTime, comment="When triggerer_id took it"),
    Column("fired_at", UTCDateTime, comment="When its event was recorded"),
    Column("event_kind", String(16), comment="resume, success or failure"),
    Column("event", MessageJSON, comment="The event's payload"),
    Index("ix_triggers_triggerer_id", "triggerer_id"),
    Index("ix_triggers_queue", "queue"),
    Index("ix_triggers_task", "task_id", "try_number"),
)

reservations = Table(
    "reservations",
    metadata,
    Column("task_id", String(255), primary_key=True),
    Column("try_number", Integer, primary_key=True),
    Column("job_id", String(32), nullable=False, comment="jobs.id of the process holding it"),
    Column("reserved_at", UTCDateTime, nullable=False, comment="When that process received it"),
    Index("ix_reservations_job_id", "job_id"),
    Index("ix_reservations_reserved_at", "reserved_at"),
)


#: The columns that name one try: the key of task_records and of the tables beside it.
TRY_KEY = ("task_id", "try_number")


def same_try(table: Table) -> Any:
    """Join condition of ``table``'s (task_id, try_number) with the try's record."""
    return and_(
        table.c.task_id == task_records.c.task_id,
        table.c.try_number == task_records.c.try_number,
    )


callbacks = Table(
    "callbacks",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("task_id", String(255), nullable=False),
    Column("try_number", Integer, nullable=False),
    Column("kind", String(16), nullable=False, comment="failure or retry"),
    Column("payload", MessageJSON, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("claimed_by", String(64)),
    Column("claimed_until", UTCDateTime),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Index("ix_callbacks_claimed_until", "claimed_until"),
)

leases = Table(
    "leases",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("holder", String(64)),
    Column("token", BigInteger, nullable=False, server_default=text("0")),
    Column("expires_at", UTCDateTime),
)

publish_claims = Table(
    "publish_claims",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("holder", String(64)),
    Column("token", BigInteger, nullable=False, server_default=text("0")),
    Column("expires_at", UTCDateTime),
    Column("completed_at", UTCDateTime, comment="When the claimed work was done"),
)

checkins = Table(
    "checkins",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("completed_at", UTCDateTime, comment="Last time the named work finished"),
    Column("report", MessageJSON, comment="What its last run reported"),
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime, nullable=False, comment="When the decision was taken"),
    Column("action", String(32), nullable=False, comment="What was done (AuditAction)"),
    Column("reason", String(32), nullable=False, comment="Why (AuditReason)"),
    Column("task_id", String(255)),
    Column("try_number", Integer),
    Column("task_name", String(255)),
    Column("detail", Text, comment="The decision in words, as the try's state_reason"),
    Column("job_id", String(32), comment="jobs.id of the process that ran the try"),
    Column("hostname", String(255)),
    Column("pid", Integer),
    Column("last_heartbeat", UTCDateTime, comment="That process's last heartbeat"),
    Column("recovery_seconds", Float, comment="Seconds from that heartbeat to the decision"),
    Column("actor", String(64), comment="host:pid of the sweep or worker that decided"),
    Index("ix_audit_log_at", "at"),
    Index("ix_audit_log_task", "task_id", "try_number"),
)

revocations = Table(
    "revocations",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("kind", String(16), nullable=False, comment="task, stamp or purge"),
    Column("task_id", String(255), comment="The revoked task id (kind task)"),
    Column("header", String(255), comment="The stamped header name (kind stamp)"),
    Column("value", MessageJSON, comment="The revoked stamp values (kind stamp)"),
    Column("queue", String(255), comment="The purged queue (kind purge)"),
    Column("created_at", UTCDateTime, nullable=False),
    Index("ix_revocations_task_id", "task_id"),
    Index("ix_revocations_created_at", "created_at"),
)

task_heartbeats = Table(
    "task_heartbeats",
    metadata,
    Column("task_id", String(255), primary_key=True),
    Column("try_number", Integer, primary_key=True),
    Column("beat_at", UTCDateTime, nullable=False, comment="The try's last heartbeat()"),
    Column("details", MessageJSON, comment="The last details it gave heartbeat() (JSON)"),
)

beat_entries = Table(
    "beat_entries",
    metadata,
    Column("name", String(255), primary_key=True, comment="The beat_schedule entry's name"),
    Column("task", String(255), nullable=False, comment="The task the entry sends"),
    Column("schedule", Text, comment="The entry's schedule, as Celery prints it"),
    Column(
        "last_run_at",
        UTCDateTime,
        nullable=False,
        comment="Latest scheduled time decided: claimed, or missed under the catch-up policy",
    ),
    Column("total_run_count", Integer, nullable=False, server_default=text("0")),
    Column("pending_run_at", UTCDateTime, comment="Scheduled time of a claimed, unsent run"),
    Column("pending_task_id", String(64), comment="Task id of that run"),
    Column("pending_token", BigInteger, comment="Fencing token of the leader that claimed it"),
    Column("last_sent_run_at", UTCDateTime, comment="Scheduled time of the last run sent"),
    Column("last_task_id", String(64), comment="Task id of the last run sent"),
    Column("last_sent_at", UTCDateTime, comment="When the last run was sent"),
    Column("missed_count", Integer, nullable=False, server_default=text("0")),
    Column("last_missed_at", UTCDateTime, comment="Latest scheduled time not run"),
    Column("last_missed_reason", Text, comment="Why it was not run"),
    Column("updated_at", UTCDateTime, nullable=False),
)
