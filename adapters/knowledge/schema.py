"""The tables of memories, files and knowledge collections (migration 0005).

Kept apart from the event store's metadata (``adapters.store.schema``): they
belong to the knowledge features, not to the log. File bytes are stored as
blobs (``blobs`` table, content-addressed per user); chunk vectors live in the
vector store (``adapters.vectors``), keyed by chunk id.
"""

from __future__ import annotations

from sqlalchemy import Boolean, Column, Float, ForeignKey, Index, Integer, MetaData, PrimaryKeyConstraint, Table, Text, false

metadata = MetaData()

# A user's memories (``/v1/memories``); their vectors: vector store collection
# per embedding model, item id = memory id.
memories = Table(
    "memories",
    metadata,
    Column("id", Text, primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("content", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Index("ix_memories_user", "user_id", "created_at"),
)

# An uploaded document. ``status``: processing | ready | failed (``error`` says why).
files = Table(
    "files",
    metadata,
    Column("id", Text, primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("filename", Text, nullable=False),
    Column("content_type", Text, nullable=False),
    Column("bytes", Integer, nullable=False),
    Column("blob_id", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("error", Text),
    Column("chars", Integer),  # extracted text length
    Column("chunks", Integer),
    Column("tokens", Integer),
    # The embedding model whose vectors the chunks have (vector store collection
    # ``file_chunks:<model>``); NULL: lexical retrieval only.
    Column("embedding_model", Text),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Index("ix_files_user", "user_id", "created_at"),
    # Start-up resumes the files a crash left processing.
    Index("ix_files_status", "status"),
)

# A file's text cut into overlapping chunks; ``seq`` orders them.
file_chunks = Table(
    "file_chunks",
    metadata,
    Column("file_id", Text, ForeignKey("files.id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("text", Text, nullable=False),
    Column("tokens", Integer, nullable=False),
    Column("start", Integer, nullable=False),  # character offset in the extracted text
    PrimaryKeyConstraint("file_id", "seq", name="pk_file_chunks"),
)

# Knowledge collections and their files.
knowledge = Table(
    "knowledge",
    metadata,
    Column("id", Text, primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    # Created by an admin with "shared": true: readable by every user (migration 0010).
    Column("shared", Boolean, nullable=False, default=False, server_default=false()),
    Index("ix_knowledge_user", "user_id", "created_at"),
)

knowledge_files = Table(
    "knowledge_files",
    metadata,
    Column("knowledge_id", Text, ForeignKey("knowledge.id", ondelete="CASCADE"), nullable=False),
    Column("file_id", Text, ForeignKey("files.id", ondelete="CASCADE"), nullable=False),
    Column("added_at", Float, nullable=False),
    PrimaryKeyConstraint("knowledge_id", "file_id", name="pk_knowledge_files"),
    # Deleting a file cascades here: without it PostgreSQL scans the table.
    Index("ix_knowledge_files_file", "file_id"),
)

TABLES = frozenset(metadata.tables)
