"""memories, files, file chunks, knowledge collections

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

The tables of ``adapters.knowledge.schema``: a user's memories, uploaded files
(bytes in ``blobs``) with their status and chunks, and knowledge collections.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "memories",
        sa.Column("id", sa.Text(), primary_key=True),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_memories_user", "memories", ["user_id", "created_at"])
    op.create_table(
        "files",
        sa.Column("id", sa.Text(), primary_key=True),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("filename", sa.Text(), nullable=False),
        sa.Column("content_type", sa.Text(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("blob_id", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("chars", sa.Integer(), nullable=True),
        sa.Column("chunks", sa.Integer(), nullable=True),
        sa.Column("tokens", sa.Integer(), nullable=True),
        sa.Column("embedding_model", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_files_user", "files", ["user_id", "created_at"])
    op.create_index("ix_files_status", "files", ["status"])
    op.create_table(
        "file_chunks",
        sa.Column("file_id", sa.Text(), sa.ForeignKey("files.id", ondelete="CASCADE"), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("start", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("file_id", "seq", name="pk_file_chunks"),
    )
    op.create_table(
        "knowledge",
        sa.Column("id", sa.Text(), primary_key=True),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_knowledge_user", "knowledge", ["user_id", "created_at"])
    op.create_table(
        "knowledge_files",
        sa.Column("knowledge_id", sa.Text(), sa.ForeignKey("knowledge.id", ondelete="CASCADE"), nullable=False),
        sa.Column("file_id", sa.Text(), sa.ForeignKey("files.id", ondelete="CASCADE"), nullable=False),
        sa.Column("added_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("knowledge_id", "file_id", name="pk_knowledge_files"),
    )
    op.create_index("ix_knowledge_files_file", "knowledge_files", ["file_id"])


def downgrade() -> None:
    op.drop_index("ix_knowledge_files_file", table_name="knowledge_files")
    op.drop_table("knowledge_files")
    op.drop_table("knowledge")
    op.drop_table("file_chunks")
    op.drop_index("ix_files_status", table_name="files")
    op.drop_index("ix_files_user", table_name="files")
    op.drop_table("files")
    op.drop_index("ix_memories_user", table_name="memories")
    op.drop_table("memories")
