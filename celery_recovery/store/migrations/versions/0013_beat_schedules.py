"""Beat schedules live in the store: one row per ``beat_schedule`` entry.

Each row holds the entry's latest decided scheduled time, the run claimed and
not yet sent (with the fencing token of the leader that claimed it), the last
run sent, and what was missed.  The beat leader's lease is a row of
``leases``, as the workers' fallback sweep lease is.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_recovery.store.schema import UTCDateTime

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "beat_entries",
        sa.Column("name", sa.String(255), nullable=False, comment="The beat_schedule entry's name"),
        sa.Column("task", sa.String(255), nullable=False, comment="The task the entry sends"),
        sa.Column("schedule", sa.Text, comment="The entry's schedule, as Celery prints it"),
        sa.Column(
            "last_run_at",
            UTCDateTime,
            nullable=False,
            comment="Latest scheduled time decided: claimed, or missed under the catch-up policy",
        ),
        sa.Column("total_run_count", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("pending_run_at", UTCDateTime, comment="Scheduled time of a claimed, unsent run"),
        sa.Column("pending_task_id", sa.String(64), comment="Task id of that run"),
        sa.Column(
            "pending_token", sa.BigInteger, comment="Fencing token of the leader that claimed it"
        ),
        sa.Column("last_sent_run_at", UTCDateTime, comment="Scheduled time of the last run sent"),
        sa.Column("last_task_id", sa.String(64), comment="Task id of the last run sent"),
        sa.Column("last_sent_at", UTCDateTime, comment="When the last run was sent"),
        sa.Column("missed_count", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("last_missed_at", UTCDateTime, comment="Latest scheduled time not run"),
        sa.Column("last_missed_reason", sa.Text, comment="Why it was not run"),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_beat_entries"),
    )


def downgrade() -> None:
    op.drop_table("beat_entries")
