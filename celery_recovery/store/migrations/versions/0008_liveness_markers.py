"""Liveness markers on jobs: the process marker, the advisory lock key, when it went missing.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_recovery.store.schema import UTCDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column(
                "process_marker",
                sa.String(200),
                comment="Boot id, pid namespace and start time of the process (Linux)",
            )
        )
        batch.add_column(
            sa.Column(
                "marker_lock",
                sa.BigInteger,
                comment="PostgreSQL advisory lock key held while the process tree lives",
            )
        )
        batch.add_column(
            sa.Column(
                "marker_missing_since",
                UTCDateTime,
                comment="When a sweep first saw the advisory lock missing",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("marker_missing_since")
        batch.drop_column("marker_lock")
        batch.drop_column("process_marker")
