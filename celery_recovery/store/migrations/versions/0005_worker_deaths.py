"""Worker deaths: how many runs of a try ended with the death of their process.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("task_records") as batch:
        batch.add_column(
            sa.Column(
                "deaths",
                sa.Integer,
                nullable=False,
                server_default=sa.text("0"),
                comment="Runs of this try that ended with the death of their process",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("task_records") as batch:
        batch.drop_column("deaths")
