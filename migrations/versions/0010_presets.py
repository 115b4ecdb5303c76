"""presets: model presets created over HTTP, and shared knowledge collections

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04

``presets``: one row per preset of ``/v1/presets`` (its JSON body); presets of
the settings are not stored. ``knowledge.shared``: a collection an admin
created readable by every user (a preset may bind it); every collection that
exists before this revision stays private.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "presets",
        sa.Column("id", sa.Text(), primary_key=True),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.add_column("knowledge", sa.Column("shared", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("knowledge") as batch:  # SQLite drops a column by copying the table
        batch.drop_column("shared")
    op.drop_table("presets")
