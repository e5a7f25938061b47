"""Revocations: revokes and purges made through a Recovery app's control object.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_recovery.store.schema import BigId, MessageJSON, UTCDateTime

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "revocations",
        sa.Column("id", BigId, nullable=False, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False, comment="task, stamp or purge"),
        sa.Column("task_id", sa.String(255), comment="The revoked task id (kind task)"),
        sa.Column("header", sa.String(255), comment="The stamped header name (kind stamp)"),
        sa.Column("value", MessageJSON, comment="The revoked stamp values (kind stamp)"),
        sa.Column("queue", sa.String(255), comment="The purged queue (kind purge)"),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_revocations"),
    )
    op.create_index("ix_revocations_task_id", "revocations", ["task_id"])
    op.create_index("ix_revocations_created_at", "revocations", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_revocations_created_at", "revocations")
    op.drop_index("ix_revocations_task_id", "revocations")
    op.drop_table("revocations")
