"""Stuck, not dead: each worker's consumer state with its heartbeat, and task heartbeats.

``task_heartbeats`` keeps, per try, when its task last called ``heartbeat()``
and the last details it gave (what a later try resumes from).

``jobs.consumer`` holds what a worker's main process knows of its broker
consumer (connection up or down and since when, last message received, held
and running messages, free slots, ready messages its queues held when it last
asked, and whether it judged itself stalled), written by the same UPDATE as
its heartbeat.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_recovery.store.schema import Json, MessageJSON, UTCDateTime

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "task_heartbeats",
        sa.Column("task_id", sa.String(255), nullable=False),
        sa.Column("try_number", sa.Integer, nullable=False),
        sa.Column("beat_at", UTCDateTime, nullable=False, comment="The try's last heartbeat()"),
        sa.Column("details", MessageJSON, comment="The last details it gave heartbeat() (JSON)"),
        sa.PrimaryKeyConstraint("task_id", "try_number", name="pk_task_heartbeats"),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column(
                "consumer",
                Json,
                comment="A worker main process's broker consumer state (JSON), with its heartbeat",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("consumer")
    op.drop_table("task_heartbeats")
