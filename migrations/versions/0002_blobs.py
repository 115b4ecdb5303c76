"""blobs: large binary payloads stored once and referenced from events

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-09

Hand-written; must stay equal to the ``blobs`` table of
``adapters/store/schema.py`` as of this revision. ``LargeBinary`` is BLOB on
SQLite and BYTEA on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("id", sa.Text(), primary_key=True),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("mime", sa.Text(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("blobs")
