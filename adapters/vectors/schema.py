"""The vector store's tables (created by ``migrations/versions/0003_vectors.py``).

``vector_collections``: one row per collection, its dimension (fixed by the
first upsert) and its ``version`` (migration 0006; bumped by each write of the
SQLite store, which keeps collections in memory and reloads one whose version
moved under it). ``vector_items``: the items, ``PRIMARY KEY (collection, id)``,
with their dimension repeated in ``dim``.

The column types differ by dialect, which is why these tables are not in
``adapters.store.schema.metadata``:

=============  ==========================  ===============================
column         SQLite                      PostgreSQL
=============  ==========================  ===============================
``embedding``  BLOB: the *unit* vector,    ``vector`` (pgvector, untyped:
               float32 little-endian       any dimension), as given
               (float64 before 0006's
               store; still read)
``metadata``   TEXT (JSON)                 JSONB
=============  ==========================  ===============================

On PostgreSQL the HNSW indexes are per dimension (an untyped ``vector`` column
can't be indexed as such): see ``adapters.vectors.pgvector``; ``metadata`` has
a GIN ``jsonb_path_ops`` index (migration 0006) for filters.
"""

from __future__ import annotations

from sqlalchemy import Column, Float, Integer, LargeBinary, MetaData, PrimaryKeyConstraint, Table, Text, text

metadata = MetaData()

vector_collections = Table(
    "vector_collections",
    metadata,
    Column("name", Text, primary_key=True),
    Column("dimension", Integer, nullable=False),
    Column("created_at", Float),
    Column("version", Integer, nullable=False, server_default=text("0")),
)

# The SQLite shape (see the module doc for PostgreSQL's).
vector_items = Table(
    "vector_items",
    metadata,
    Column("collection", Text, nullable=False),
    Column("id", Text, nullable=False),
    Column("dim", Integer, nullable=False),
    Column("embedding", LargeBinary, nullable=False),
    Column("text", Text, nullable=False),
    Column("metadata", Text, nullable=False),
    PrimaryKeyConstraint("collection", "id", name="pk_vector_items"),
)

TABLES = frozenset(metadata.tables)
