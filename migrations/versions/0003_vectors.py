"""vectors: collections and items of the vector store (engine.vectors)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-09

Dialect-aware (see ``adapters/vectors/schema.py``): on SQLite the embedding is
a BLOB (unit vector, float64) and metadata TEXT JSON; on PostgreSQL the
embedding is an untyped pgvector ``vector`` and metadata JSONB, and the
``vector`` extension is created if it is not there yet (that needs a role
allowed to create it, unless a DBA did it first). The per-dimension HNSW
indexes are created by ``adapters.vectors.pgvector`` when a collection of a
new dimension appears.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "vector_collections",
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("dimension", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=True),
    )
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        available = bind.exec_driver_sql("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").first()
        if available is None:
            raise RuntimeError("turnlog on PostgreSQL needs the pgvector extension (https://github.com/pgvector/pgvector) installed on the server")
        op.execute("CREATE EXTENSION IF NOT EXISTS vector")
        op.execute(
            """
            CREATE TABLE vector_items (
                collection text NOT NULL,
                id text NOT NULL,
                dim integer NOT NULL,
                embedding vector NOT NULL,
                text text NOT NULL,
                metadata jsonb NOT NULL,
                CONSTRAINT pk_vector_items PRIMARY KEY (collection, id)
            )
            """
        )
    else:
        op.create_table(
            "vector_items",
            sa.Column("collection", sa.Text(), nullable=False),
            sa.Column("id", sa.Text(), nullable=False),
            sa.Column("dim", sa.Integer(), nullable=False),
            sa.Column("embedding", sa.LargeBinary(), nullable=False),
            sa.Column("text", sa.Text(), nullable=False),
            sa.Column("metadata", sa.Text(), nullable=False),
            sa.PrimaryKeyConstraint("collection", "id", name="pk_vector_items"),
        )


def downgrade() -> None:
    op.drop_table("vector_items")  # its HNSW indexes go with it
    op.drop_table("vector_collections")
