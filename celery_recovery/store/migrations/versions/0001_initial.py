"""Initial schema: jobs, task records with tries, triggers, callbacks.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_recovery.store.schema import BigId, Json, MessageJSON, UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

RUNNING = sa.text("state = 'running'")
QUEUED = sa.text("state = 'queued'")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), nullable=False, comment="Random hex id made by the process"),
        sa.Column("job_type", sa.String(16), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False, comment="Machine host name"),
        sa.Column("node_name", sa.String(255), comment="Celery node name, e.g. celery@host"),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("start_date", UTCDateTime, nullable=False),
        sa.Column("end_date", UTCDateTime),
        sa.Column("latest_heartbeat", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
    )
    op.create_index(
        "ix_jobs_live",
        "jobs",
        ["job_type", "latest_heartbeat"],
        postgresql_where=RUNNING,
        sqlite_where=RUNNING,
    )

    op.create_table(
        "task_records",
        sa.Column("task_id", sa.String(255), nullable=False),
        sa.Column("try_number", sa.Integer, nullable=False, comment="Celery retries + 1"),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("queue", sa.String(255)),
        sa.Column("exchange", sa.String(255)),
        sa.Column("routing_key", sa.String(255)),
        sa.Column("priority", sa.Integer),
        sa.Column("args", MessageJSON),
        sa.Column("kwargs", MessageJSON),
        sa.Column(
            "headers", MessageJSON, comment="Message headers needed to publish the task again"
        ),
        sa.Column(
            "options", MessageJSON, comment="Linked callbacks, chain and chord of the message"
        ),
        sa.Column("republishable", sa.Boolean, nullable=False, server_default=sa.text("true")),
        sa.Column("republish_error", sa.Text, comment="Why the task cannot be published again"),
        sa.Column("eta", UTCDateTime),
        sa.Column("expires", UTCDateTime),
        sa.Column("job_id", sa.String(32), comment="jobs.id of the process running this try"),
        sa.Column("worker_hostname", sa.String(255)),
        sa.Column("worker_pid", sa.Integer),
        sa.Column(
            "external_executor_id", sa.String(255), comment="Celery task id to probe the backend"
        ),
        sa.Column("queued_at", UTCDateTime),
        sa.Column("started_at", UTCDateTime),
        sa.Column("ended_at", UTCDateTime),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.Column("state_reason", sa.Text, comment="Why the try reached its state"),
        sa.Column("error", sa.Text),
        sa.Column("publish_count", sa.Integer, nullable=False, server_default=sa.text("1")),
        sa.Column("adopted_until", UTCDateTime),
        sa.PrimaryKeyConstraint("task_id", "try_number", name="pk_task_records"),
    )
    op.create_index(
        "ix_task_records_running_job",
        "task_records",
        ["job_id"],
        postgresql_where=RUNNING,
        sqlite_where=RUNNING,
    )
    op.create_index(
        "ix_task_records_queued_at",
        "task_records",
        ["queued_at"],
        postgresql_where=QUEUED,
        sqlite_where=QUEUED,
    )
    op.create_index("ix_task_records_ended_at", "task_records", ["ended_at"])

    op.create_table(
        "triggers",
        sa.Column("id", BigId, nullable=False, autoincrement=True),
        sa.Column("classpath", sa.String(1000), nullable=False),
        sa.Column("kwargs", Json, nullable=False),
        sa.Column("task_id", sa.String(255), nullable=False),
        sa.Column("try_number", sa.Integer, nullable=False),
        sa.Column("method_name", sa.String(255)),
        sa.Column("method_kwargs", Json),
        sa.Column("queue", sa.String(255)),
        sa.Column("timeout_at", UTCDateTime),
        sa.Column("triggerer_id", sa.String(32), comment="jobs.id of the triggerer running it"),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_triggers"),
    )
    op.create_index("ix_triggers_triggerer_id", "triggers", ["triggerer_id"])
    op.create_index("ix_triggers_task", "triggers", ["task_id", "try_number"])

    op.create_table(
        "callbacks",
        sa.Column("id", BigId, nullable=False, autoincrement=True),
        sa.Column("task_id", sa.String(255), nullable=False),
        sa.Column("try_number", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False, comment="failure or retry"),
        sa.Column("payload", MessageJSON, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("claimed_by", sa.String(64)),
        sa.Column("claimed_until", UTCDateTime),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.PrimaryKeyConstraint("id", name="pk_callbacks"),
    )
    op.create_index("ix_callbacks_claimed_until", "callbacks", ["claimed_until"])


def downgrade() -> None:
    op.drop_table("callbacks")
    op.drop_table("triggers")
    op.drop_table("task_records")
    op.drop_table("jobs")
