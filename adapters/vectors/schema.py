"""The vector store's tables (created by ``migrations/versions/0003_vectors.py``).

``vector_collections``: one row per collection, its dimension (fixed by the
first upsert). ``vector_items``: the items, ``PRIMARY KEY (collection, id)``,
with their dimension repeated in ``dim``.

The column types differ by dialect, which is why these tables are not in
``adapters.store.schema.metadata``:

=============  ==========================  ===============================
column         SQLite                      PostgreSQL
=============  ==========================  ===============================
``embedding``  BLOB: the *unit* vector,    ``vector`` (pgvector, untyped:
               float64 little-endian       any dimension), as given
``metadata``   TEXT (JSON)                 JSONB
=============  ==========================  ===============================

On PostgreSQL the HNSW indexes are per dimension (an untyped ``vector`` column
can't be indexed as such): see ``adapters.vectors.pgvector``.
"""

from __future__ import annotations

from sqlalchemy import Column, Float, Integer, LargeBinary, MetaData, PrimaryKeyConstraint, Table, Text

metadata = MetaData()

vector_collections = Table(
    "vector_collections",
    metadata,
    Column("name", Text, primary_key=True),
    Column("dimension", Integer, nullable=False),
    Column("created_at", Float),
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
