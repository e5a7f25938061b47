"""Idempotency key and fencing token of each try.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("task_records") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(512)))
        batch.add_column(sa.Column("fencing_token", sa.BigInteger))


def downgrade() -> None:
    with op.batch_alter_table("task_records") as batch:
        batch.drop_column("fencing_token")
        batch.drop_column("idempotency_key")
