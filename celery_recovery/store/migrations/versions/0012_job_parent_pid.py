"""Jobs name their parent process: a pool process's worker main process.

A pool process that dies under a live main process is judged by that main
process (Celery's ``WorkerLostError`` or hard time limit); the sweep finds the
parent by host and process id (see ``celery_recovery.sweeps.parents``).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column(
                "parent_pid",
                sa.Integer,
                comment="Process id of the worker's main process, for a pool process",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("parent_pid")
