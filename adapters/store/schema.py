"""The tables of the event store (SQLAlchemy Core).

One table is the log (``events``); the others are small indexes next to it
(``turns``, ``chats``) and the API keys. JSON goes into TEXT columns so that the
same schema runs on SQLite and PostgreSQL; times are epoch seconds (float).

``migrations/versions/0001_initial.py`` (and later revisions: ``0002_blobs``)
create exactly this schema by hand; ``tests/test_store_contract.py`` checks
that the two agree.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

# BIGINT on PostgreSQL (a BIGSERIAL), INTEGER on SQLite so that the column is the
# rowid alias; ``sqlite_autoincrement`` makes ids never reused.
_Position = BigInteger().with_variant(Integer(), "sqlite")

events = Table(
    "events",
    metadata,
    # A surrogate key: no reader orders or follows the log by it (reads go by
    # turn and seq), so it promises neither commit order nor no gaps.
    Column("id", _Position, primary_key=True, autoincrement=True),
    Column("turn_id", Text, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("type", Text, nullable=False),
    Column("at", Float, nullable=False),
    Column("data", Text, nullable=False),  # compact JSON
    # sha256 of the previous event's hash and this event's canonical form
    # (``engine.chain``), its 32 bytes (BLOB, BYTEA: half the size of hex in
    # every row); NULL only with the chain off (bench).
    Column("hash", LargeBinary, nullable=True),
    # Optimistic concurrency: a second writer at the same (turn_id, seq) fails.
    UniqueConstraint("turn_id", "seq", name="uq_events_turn_seq"),
    sqlite_autoincrement=True,
)

turns = Table(
    "turns",
    metadata,
    Column("id", Text, primary_key=True),
    Column("chat_id", Text, nullable=False),
    Column("user_id", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("created_at", Float),
    Column("updated_at", Float),
    Column("owner", Text, nullable=True),
    Column("lease_until", Float, nullable=True),
    Column("fencing", Integer, nullable=False, server_default="0"),
    Column("view", Text, nullable=True),  # JSON of the last stored projection
    Index("ix_turns_chat_created", "chat_id", "created_at"),
    Index("ix_turns_user_created", "user_id", "created_at"),
    # A user's turns of one status, newest first, and the counts per status
    # (``adapters.store.turn_search``; migration 0011).
    Index("ix_turns_user_status_created", "user_id", "status", "created_at"),
    Index("ix_turns_status_lease", "status", "lease_until"),
)

chats = Table(
    "chats",
    metadata,
    Column("id", Text, primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("title", Text, nullable=True),
    Column("tags", Text, nullable=False, server_default="[]"),  # JSON list
    Column("created_at", Float),
    Column("updated_at", Float),
    Index("ix_chats_user_updated", "user_id", "updated_at"),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_hash", Text, primary_key=True),  # sha256 hex of the key, never the key
    Column("user_id", Text, nullable=False),
    Column("created_at", Float),
    Column("role", Text, nullable=False, server_default="user"),  # engine.ports.ROLES
)

# Content-addressed binary payloads (``engine.blobs``): ``id`` is the sha256 hex
# of ``user_id NUL data``, so a user's identical payloads are stored once and
# users never share a row. BLOB on SQLite, BYTEA on PostgreSQL.
blobs = Table(
    "blobs",
    metadata,
    Column("id", Text, primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("mime", Text, nullable=False),
    Column("size", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("created_at", Float),
)

# Usage per user, key, UTC day and model (``adapters.store.usage``): a
# projection of the log kept by database triggers (migration
# ``0013_usage``) in the commit that records a turn's end. ``key_hash``
# is '' for turns started without a key (auth off).
usage_rollup = Table(
    "usage_rollup",
    metadata,
    Column("user_id", Text, primary_key=True),
    Column("key_hash", Text, primary_key=True),
    Column("day", Text, primary_key=True),  # YYYY-MM-DD, UTC
    Column("model", Text, primary_key=True),
    Column("turns", Integer, nullable=False, server_default="0"),
    Column("input_tokens", BigInteger, nullable=False, server_default="0"),
    Column("output_tokens", BigInteger, nullable=False, server_default="0"),
    Column("tool_calls", Integer, nullable=False, server_default="0"),
    # Turns whose tokens turnlog counted itself (the upstream reported none).
    Column("estimated_turns", Integer, nullable=False, server_default="0"),
    Index("ix_usage_rollup_day", "day"),
)

# Requests-per-minute quotas: one row per scope ('*' for everyone, 'key:HASH'
# per key), the count of its current minute (epoch seconds // 60).
rate_counters = Table(
    "rate_counters",
    metadata,
    Column("scope", Text, primary_key=True),
    Column("minute", BigInteger, nullable=False),
    Column("count", Integer, nullable=False),
)

# A key's own quotas (``turnlog keys create --requests-per-minute N
# --tokens-per-day N``); no row: none.
key_quotas = Table(
    "key_quotas",
    metadata,
    Column("key_hash", Text, primary_key=True),
    Column("requests_per_minute", Integer, nullable=True),
    Column("tokens_per_day", BigInteger, nullable=True),
)
