"""Sweeps: when a try was recovered, late outcomes, and leases.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_recovery.store.schema import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("task_records") as batch:
        batch.add_column(
            sa.Column(
                "recovered_at", UTCDateTime, comment="When a sweep reset, reconciled or adopted it"
            )
        )
        batch.add_column(
            sa.Column(
                "late_state", sa.String(16), comment="Outcome reported after it was recovered"
            )
        )
        batch.add_column(sa.Column("late_at", UTCDateTime))
    op.create_table(
        "leases",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("holder", sa.String(64)),
        sa.Column("token", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("expires_at", UTCDateTime),
        sa.Column("completed_at", UTCDateTime, comment="Last time the guarded work finished"),
        sa.PrimaryKeyConstraint("name", name="pk_leases"),
    )


def downgrade() -> None:
    op.drop_table("leases")
    with op.batch_alter_table("task_records") as batch:
        batch.drop_column("late_at")
        batch.drop_column("late_state")
        batch.drop_column("recovered_at")
