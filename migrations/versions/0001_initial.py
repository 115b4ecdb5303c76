"""initial schema: events, turns, chats, api_keys

Revision ID: 0001
Revises:
Create Date: 2026-12-02

Hand-written; must stay equal to ``adapters/store/schema.py`` as of this
revision (later changes go into new revisions, never here).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("turn_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.UniqueConstraint("turn_id", "seq", name="uq_events_turn_seq"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "turns",
        sa.Column("id", sa.Text(), primary_key=True),
        sa.Column("chat_id", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=True),
        sa.Column("owner", sa.Text(), nullable=True),
        sa.Column("lease_until", sa.Float(), nullable=True),
        sa.Column("fencing", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("view", sa.Text(), nullable=True),
    )
    op.create_index("ix_turns_chat_created", "turns", ["chat_id", "created_at"])
    op.create_index("ix_turns_user_created", "turns", ["user_id", "created_at"])
    op.create_index("ix_turns_status_lease", "turns", ["status", "lease_until"])
    op.create_table(
        "chats",
        sa.Column("id", sa.Text(), primary_key=True),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("title", sa.Text(), nullable=True),
        sa.Column("tags", sa.Text(), nullable=False, server_default="[]"),
        sa.Column("created_at", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=True),
    )
    op.create_index("ix_chats_user_updated", "chats", ["user_id", "updated_at"])
    op.create_table(
        "api_keys",
        sa.Column("key_hash", sa.Text(), primary_key=True),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("api_keys")
    op.drop_index("ix_chats_user_updated", table_name="chats")
    op.drop_table("chats")
    op.drop_index("ix_turns_status_lease", table_name="turns")
    op.drop_index("ix_turns_user_created", table_name="turns")
    op.drop_index("ix_turns_chat_created", table_name="turns")
    op.drop_table("turns")
    op.drop_table("events")
