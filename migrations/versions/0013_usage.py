"""usage: a rollup of what turns spent, request counters, per-key quotas

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04

``usage_rollup`` sums each turn's usage (tokens as its view folded them from
the upstreams' reports, tool calls, turns) per user, key, UTC day and model.
A trigger on ``turns`` keeps it: when a turn's row takes a terminal status
with its final view, which the store writes in the same commit as the
turn's terminal event, the trigger adds what that view holds beyond the view
the row had before (a turn that ends again after a resume adds only the
difference). So the rollup is a projection of the log kept in the log's own
transaction, whichever process writes it. The key is the ``key_hash`` the
turn's first event (``turn.started``) recorded. Terminal turns already stored
are summed in once here.

``rate_counters`` counts requests per minute (``adapters.store.usage``),
``key_quotas`` holds the quotas ``turnlog keys create`` gives a key.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TERMINAL = "('completed', 'cancelled', 'failed')"


def _sqlite_copied(name: str) -> str:
    """What a fork's copied events spent (its ``turn.forked`` says), taken
    off at its first end only: the parent counted it."""
    return (
        f"(CASE WHEN json_extract(OLD.view, '$.status') IN {_TERMINAL} THEN 0 ELSE COALESCE((SELECT json_extract(e.data, '$.copied.{name}') "
        "FROM events e WHERE e.turn_id = NEW.id AND e.seq = 1 AND e.type = 'turn.forked'), 0) END)"
    )


# SQLite (json1). ``OLD.view`` is NULL before a turn's first end.
_SQLITE_TRIGGER = f"""
CREATE TRIGGER turns_usage_rollup AFTER UPDATE OF status, view ON turns
FOR EACH ROW
WHEN NEW.status IN {_TERMINAL} AND NEW.view IS NOT NULL AND NEW.view IS NOT OLD.view
BEGIN
  INSERT INTO usage_rollup (user_id, key_hash, day, model, turns, input_tokens, output_tokens, tool_calls, estimated_turns)
  VALUES (
    NEW.user_id,
    COALESCE((SELECT json_extract(e.data, '$.key_hash') FROM events e WHERE e.turn_id = NEW.id AND e.seq = 1), ''),
    strftime('%Y-%m-%d', NEW.updated_at, 'unixepoch'),
    NEW.model,
    CASE WHEN json_extract(OLD.view, '$.status') IN {_TERMINAL} THEN 0 ELSE 1 END,
    COALESCE(json_extract(NEW.view, '$.usage.input_tokens'), 0) - COALESCE(json_extract(OLD.view, '$.usage.input_tokens'), 0)
      - {_sqlite_copied("input_tokens")},
    COALESCE(json_extract(NEW.view, '$.usage.output_tokens'), 0) - COALESCE(json_extract(OLD.view, '$.usage.output_tokens'), 0)
      - {_sqlite_copied("output_tokens")},
    (SELECT count(*) FROM json_each(NEW.view, '$.output') WHERE json_extract(value, '$.type') = 'function_call')
      - (SELECT count(*) FROM json_each(COALESCE(OLD.view, '{{}}'), '$.output') WHERE json_extract(value, '$.type') = 'function_call')
      - {_sqlite_copied("tool_calls")},
    CASE WHEN json_extract(NEW.view, '$.usage_estimated') = 1
          AND NOT COALESCE(json_extract(OLD.view, '$.status') IN {_TERMINAL} AND json_extract(OLD.view, '$.usage_estimated') = 1, 0)
         THEN 1 ELSE 0 END
  )
  ON CONFLICT (user_id, key_hash, day, model) DO UPDATE SET
    turns = turns + excluded.turns,
    input_tokens = input_tokens + excluded.input_tokens,
    output_tokens = output_tokens + excluded.output_tokens,
    tool_calls = tool_calls + excluded.tool_calls,
    estimated_turns = estimated_turns + excluded.estimated_turns;
END
"""

_SQLITE_BACKFILL = f"""
INSERT INTO usage_rollup (user_id, key_hash, day, model, turns, input_tokens, output_tokens, tool_calls, estimated_turns)
SELECT t.user_id,
       COALESCE((SELECT json_extract(e.data, '$.key_hash') FROM events e WHERE e.turn_id = t.id AND e.seq = 1), '') AS k,
       strftime('%Y-%m-%d', t.updated_at, 'unixepoch') AS d,
       t.model,
       count(*),
       sum(COALESCE(json_extract(t.view, '$.usage.input_tokens'), 0)),
       sum(COALESCE(json_extract(t.view, '$.usage.output_tokens'), 0)),
       sum((SELECT count(*) FROM json_each(t.view, '$.output') WHERE json_extract(value, '$.type') = 'function_call')),
       sum(CASE WHEN json_extract(t.view, '$.usage_estimated') = 1 THEN 1 ELSE 0 END)
FROM turns t
WHERE t.status IN {_TERMINAL} AND t.view IS NOT NULL
GROUP BY t.user_id, k, d, t.model
"""

# PostgreSQL: ``view`` and ``data`` are JSON text, read as jsonb. jsonb has
# no NUL character, which a JSON text may hold as ``\u0000`` (a request, an
# answer): such escapes are replaced before the cast, which would fail (and
# with it the turn's terminal commit). Only usage, item types and the key's
# hash are read, which never hold one.
_PG_FUNCTIONS = [
    """
CREATE FUNCTION turnlog_jsonb(t text) RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
  SELECT replace(t, '\\u0000', '\\ufffd')::jsonb
$$""",
    """
CREATE FUNCTION turnlog_view_calls(v jsonb) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN jsonb_typeof(v -> 'output') = 'array'
    THEN (SELECT count(*) FROM jsonb_array_elements(v -> 'output') i WHERE i ->> 'type' = 'function_call')
    ELSE 0 END
$$""",
    """
CREATE FUNCTION turnlog_count(v jsonb, k text) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
  -- (clamped: an absurd count an upstream reports must not overflow the cast)
  SELECT CASE WHEN jsonb_typeof(v -> k) = 'number' THEN LEAST(GREATEST((v ->> k)::numeric, 0), 1e15)::bigint ELSE 0 END
$$""",
    """
CREATE FUNCTION turnlog_view_tokens(v jsonb, k text) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
  SELECT turnlog_count(v -> 'usage', k)
$$""",
    """
CREATE FUNCTION turnlog_turn_key(turn text) RETURNS text LANGUAGE sql STABLE AS $$
  SELECT COALESCE((SELECT turnlog_jsonb(e.data) ->> 'key_hash' FROM events e WHERE e.turn_id = turn AND e.seq = 1), '')
$$""",
    f"""
CREATE FUNCTION turnlog_usage_rollup() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  nv jsonb := turnlog_jsonb(NEW.view);
  ov jsonb := turnlog_jsonb(COALESCE(OLD.view, '{{}}'));
  was_ended boolean := COALESCE(ov ->> 'status' IN {_TERMINAL}, false);
  -- a fork's copied events: the parent counted them (taken off at the first end)
  copied jsonb := CASE WHEN was_ended THEN '{{}}'::jsonb ELSE COALESCE(
    (SELECT turnlog_jsonb(e.data) -> 'copied' FROM events e WHERE e.turn_id = NEW.id AND e.seq = 1 AND e.type = 'turn.forked'), '{{}}'::jsonb) END;
BEGIN
  INSERT INTO usage_rollup AS r (user_id, key_hash, day, model, turns, input_tokens, output_tokens, tool_calls, estimated_turns)
  VALUES (
    NEW.user_id,
    turnlog_turn_key(NEW.id),
    to_char(to_timestamp(NEW.updated_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD'),
    NEW.model,
    CASE WHEN was_ended THEN 0 ELSE 1 END,
    turnlog_view_tokens(nv, 'input_tokens') - turnlog_view_tokens(ov, 'input_tokens') - turnlog_count(copied, 'input_tokens'),
    turnlog_view_tokens(nv, 'output_tokens') - turnlog_view_tokens(ov, 'output_tokens') - turnlog_count(copied, 'output_tokens'),
    turnlog_view_calls(nv) - turnlog_view_calls(ov) - turnlog_count(copied, 'tool_calls'),
    CASE WHEN nv ->> 'usage_estimated' = 'true' AND NOT (was_ended AND COALESCE(ov ->> 'usage_estimated', '') = 'true') THEN 1 ELSE 0 END
  )
  ON CONFLICT (user_id, key_hash, day, model) DO UPDATE SET
    turns = r.turns + EXCLUDED.turns,
    input_tokens = r.input_tokens + EXCLUDED.input_tokens,
    output_tokens = r.output_tokens + EXCLUDED.output_tokens,
    tool_calls = r.tool_calls + EXCLUDED.tool_calls,
    estimated_turns = r.estimated_turns + EXCLUDED.estimated_turns;
  RETURN NULL;
END
$$""",
    f"""
CREATE TRIGGER turns_usage_rollup AFTER UPDATE OF status, view ON turns
FOR EACH ROW
WHEN (NEW.status IN {_TERMINAL} AND NEW.view IS NOT NULL AND NEW.view IS DISTINCT FROM OLD.view)
EXECUTE FUNCTION turnlog_usage_rollup()
""",
]

_PG_BACKFILL = f"""
INSERT INTO usage_rollup (user_id, key_hash, day, model, turns, input_tokens, output_tokens, tool_calls, estimated_turns)
SELECT t.user_id, turnlog_turn_key(t.id) AS k,
       to_char(to_timestamp(t.updated_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS d,
       t.model, count(*),
       sum(turnlog_view_tokens(turnlog_jsonb(t.view), 'input_tokens')),
       sum(turnlog_view_tokens(turnlog_jsonb(t.view), 'output_tokens')),
       sum(turnlog_view_calls(turnlog_jsonb(t.view))),
       sum(CASE WHEN turnlog_jsonb(t.view) ->> 'usage_estimated' = 'true' THEN 1 ELSE 0 END)
FROM turns t
WHERE t.status IN {_TERMINAL} AND t.view IS NOT NULL
GROUP BY t.user_id, k, d, t.model
"""


def upgrade() -> None:
    op.create_table(
        "usage_rollup",
        sa.Column("user_id", sa.Text(), primary_key=True),
        sa.Column("key_hash", sa.Text(), primary_key=True),
        sa.Column("day", sa.Text(), primary_key=True),
        sa.Column("model", sa.Text(), primary_key=True),
        sa.Column("turns", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("tool_calls", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("estimated_turns", sa.Integer(), nullable=False, server_default="0"),
    )
    op.create_index("ix_usage_rollup_day", "usage_rollup", ["day"])
    op.create_table(
        "rate_counters",
        sa.Column("scope", sa.Text(), primary_key=True),
        sa.Column("minute", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
    )
    op.create_table(
        "key_quotas",
        sa.Column("key_hash", sa.Text(), primary_key=True),
        sa.Column("requests_per_minute", sa.Integer(), nullable=True),
        sa.Column("tokens_per_day", sa.BigInteger(), nullable=True),
    )
    if op.get_bind().dialect.name == "postgresql":
        for statement in _PG_FUNCTIONS:
            op.execute(statement)
        op.execute(_PG_BACKFILL)
    else:
        op.execute(_SQLITE_TRIGGER)
        op.execute(_SQLITE_BACKFILL)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER turns_usage_rollup ON turns")
        for fn in (
            "turnlog_usage_rollup()",
            "turnlog_turn_key(text)",
            "turnlog_view_tokens(jsonb, text)",
            "turnlog_view_calls(jsonb)",
            "turnlog_count(jsonb, text)",
            "turnlog_jsonb(text)",
        ):
            op.execute(f"DROP FUNCTION {fn}")
    else:
        op.execute("DROP TRIGGER turns_usage_rollup")
    op.drop_table("key_quotas")
    op.drop_table("rate_counters")
    op.drop_index("ix_usage_rollup_day", "usage_rollup")
    op.drop_table("usage_rollup")
