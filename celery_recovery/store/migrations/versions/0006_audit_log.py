"""Recovery audit log, the last report of a guarded run (the sweep's) on its lease, and
an index for the console's search of tries by task name.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_recovery.store.schema import BigId, MessageJSON, UTCDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", BigId, nullable=False, autoincrement=True),
        sa.Column("at", UTCDateTime, nullable=False, comment="When the decision was taken"),
        sa.Column("action", sa.String(32), nullable=False, comment="What was done (AuditAction)"),
        sa.Column("reason", sa.String(32), nullable=False, comment="Why (AuditReason)"),
        sa.Column("task_id", sa.String(255)),
        sa.Column("try_number", sa.Integer),
        sa.Column("task_name", sa.String(255)),
        sa.Column("detail", sa.Text, comment="The decision in words, as the try's state_reason"),
        sa.Column("job_id", sa.String(32), comment="jobs.id of the process that ran the try"),
        sa.Column("hostname", sa.String(255)),
        sa.Column("pid", sa.Integer),
        sa.Column("last_heartbeat", UTCDateTime, comment="That process's last heartbeat"),
        sa.Column(
            "recovery_seconds", sa.Float, comment="Seconds from that heartbeat to the decision"
        ),
        sa.Column("actor", sa.String(64), comment="host:pid of the sweep or worker that decided"),
        sa.PrimaryKeyConstraint("id", name="pk_audit_log"),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_index("ix_audit_log_task", "audit_log", ["task_id", "try_number"])
    op.create_index("ix_task_records_task_name", "task_records", ["task_name", "queued_at"])
    with op.batch_alter_table("leases") as batch:
        batch.add_column(
            sa.Column(
                "report", MessageJSON, comment="What the last run of the guarded work reported"
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.drop_column("report")
    op.drop_index("ix_task_records_task_name", table_name="task_records")
    op.drop_index("ix_audit_log_task", table_name="audit_log")
    op.drop_index("ix_audit_log_at", table_name="audit_log")
    op.drop_table("audit_log")
