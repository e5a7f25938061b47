"""Triggerer: fired events kept on the trigger row, and the queues a triggerer serves.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_recovery.store.schema import MessageJSON, UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("triggers") as batch:
        batch.add_column(sa.Column("claimed_at", UTCDateTime, comment="When triggerer_id took it"))
        batch.add_column(sa.Column("fired_at", UTCDateTime, comment="When its event was recorded"))
        batch.add_column(
            sa.Column("event_kind", sa.String(16), comment="resume, success or failure")
        )
        batch.add_column(sa.Column("event", MessageJSON, comment="The event's payload"))
        batch.create_index("ix_triggers_queue", ["queue"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("queues", sa.Text, comment="Comma-separated queues a triggerer serves")
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("queues")
    with op.batch_alter_table("triggers") as batch:
        batch.drop_index("ix_triggers_queue")
        batch.drop_column("event")
        batch.drop_column("event_kind")
        batch.drop_column("fired_at")
        batch.drop_column("claimed_at")
