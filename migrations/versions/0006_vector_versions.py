"""vectors: a version per collection; on PostgreSQL a GIN index on item metadata

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03

``vector_collections.version`` (both dialects): bumped by every write of the
SQLite vector store in its transaction, so a store holding a collection in
memory (``adapters.vectors.sqlite``) sees with one indexed read whether
another process or store instance changed it since.

``vector_items_metadata`` (PostgreSQL only): ``GIN (metadata
jsonb_path_ops)``, which answers the ``metadata @> {...}`` of a filtered
query: a filter on a few files' chunks reads those rows instead of walking
the HNSW graph until enough of them turn up (``adapters.vectors.pgvector``).
``fastupdate = off``: GIN's pending list would defer the index work of fresh
rows to every search until a vacuum (a freshly uploaded 100,000-chunk base
answered a one-file query in ~7 ms instead of ~1 ms); the insert pays instead,
next to its far larger HNSW cost.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("vector_collections") as batch:
        batch.add_column(sa.Column("version", sa.Integer(), nullable=False, server_default="0"))
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE INDEX vector_items_metadata ON vector_items USING gin (metadata jsonb_path_ops) WITH (fastupdate = off)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX vector_items_metadata")
    with op.batch_alter_table("vector_collections") as batch:
        batch.drop_column("version")
