"""Reservations: which worker job holds each message it received but has not started.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_recovery.store.schema import UTCDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reservations",
        sa.Column("task_id", sa.String(255), nullable=False),
        sa.Column("try_number", sa.Integer, nullable=False),
        sa.Column(
            "job_id", sa.String(32), nullable=False, comment="jobs.id of the process holding it"
        ),
        sa.Column(
            "reserved_at", UTCDateTime, nullable=False, comment="When that process received it"
        ),
        sa.PrimaryKeyConstraint("task_id", "try_number", name="pk_reservations"),
    )
    op.create_index("ix_reservations_job_id", "reservations", ["job_id"])
    op.create_index("ix_reservations_reserved_at", "reservations", ["reserved_at"])


def downgrade() -> None:
    op.drop_index("ix_reservations_reserved_at", "reservations")
    op.drop_index("ix_reservations_job_id", "reservations")
    op.drop_table("reservations")
