"""events.id from its sequence: move the PostgreSQL sequence past the existing ids

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-16

Until now the store numbered PostgreSQL events itself (``max(id) + n`` under
``LOCK TABLE events``), so the ``BIGSERIAL`` sequence of ``events.id`` never
moved; now inserts take its default. Without this, the first insert into a
database with events would reuse id 1 and fail. No schema change; nothing to do
on SQLite (its ids always came from AUTOINCREMENT).

Processes of the earlier version still running against the database number
from ``max(id)`` and may collide with the sequence: such a group commit fails
(primary key; nothing is lost), and its turns stop and are resumed. Stopping
the old processes before starting this version avoids it.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # is_called=false: the next nextval() returns exactly max(id) + 1.
        op.execute("SELECT setval(pg_get_serial_sequence('events', 'id'), coalesce(max(id), 0) + 1, false) FROM events")


def downgrade() -> None:
    """Nothing to undo: the earlier version ignores the sequence."""
