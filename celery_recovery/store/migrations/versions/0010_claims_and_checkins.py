"""Publish-once claims and sweep check-ins get tables of their own; ``leases`` keeps leases.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_recovery.store.schema import MessageJSON, UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "publish_claims",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("holder", sa.String(64)),
        sa.Column("token", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("expires_at", UTCDateTime),
        sa.Column("completed_at", UTCDateTime, comment="When the claimed work was done"),
        sa.PrimaryKeyConstraint("name", name="pk_publish_claims"),
    )
    op.create_table(
        "checkins",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("completed_at", UTCDateTime, comment="Last time the named work finished"),
        sa.Column("report", MessageJSON, comment="What its last run reported"),
        sa.PrimaryKeyConstraint("name", name="pk_checkins"),
    )
    op.execute(
        "INSERT INTO publish_claims (name, holder, token, expires_at, completed_at) "
        "SELECT name, holder, token, expires_at, completed_at FROM leases "
        "WHERE name LIKE 'claim:%'"  # what told a claim from a lease in ``leases``
    )
    op.execute(
        "INSERT INTO checkins (name, completed_at, report) "
        "SELECT name, completed_at, report FROM leases "
        "WHERE name NOT LIKE 'claim:%' AND completed_at IS NOT NULL"
    )
    op.execute("DELETE FROM leases WHERE name LIKE 'claim:%'")
    # Rows that were only check-ins hold no lease.
    op.execute("DELETE FROM leases WHERE holder IS NULL AND expires_at IS NULL")
    with op.batch_alter_table("leases") as batch:
        batch.drop_column("report")
        batch.drop_column("completed_at")


def downgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.add_column(sa.Column("completed_at", UTCDateTime))
        batch.add_column(sa.Column("report", MessageJSON))
    op.execute(
        "INSERT INTO leases (name, holder, token, expires_at, completed_at) "
        "SELECT name, holder, token, expires_at, completed_at FROM publish_claims"
    )
    op.execute(
        "INSERT INTO leases (name, token, completed_at, report) "
        "SELECT name, 0, completed_at, report FROM checkins "
        "WHERE name NOT IN (SELECT name FROM leases)"
    )
    op.execute(
        "UPDATE leases SET completed_at = (SELECT c.completed_at FROM checkins c "
        "WHERE c.name = leases.name), report = (SELECT c.report FROM checkins c "
        "WHERE c.name = leases.name) WHERE name IN (SELECT name FROM checkins)"
    )
    op.drop_table("checkins")
    op.drop_table("publish_claims")
