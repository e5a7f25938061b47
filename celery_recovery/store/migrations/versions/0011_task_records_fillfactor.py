"""Task records leave room on each page for the update that follows their insert.

A try's row is written twice within a fraction of a second: inserted by the
publisher or the worker that gets there first, then updated by the other.
With free space on the page, PostgreSQL can make that update HOT (no new
index entries) whenever no indexed column changes, which is the case when
the publisher's write comes second.  PostgreSQL only: SQLite has no such
setting.  Existing pages keep their layout; new ones follow the setting.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # 80: a fifth of each heap page waits for the updates that follow inserts.
        op.execute("ALTER TABLE task_records SET (fillfactor = 80)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE task_records RESET (fillfactor)")
