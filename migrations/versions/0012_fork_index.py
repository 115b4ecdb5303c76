"""fork index: each parent turn's forks

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04

``turn_forks``: one row per fork (``turn_id``), naming the turn it forked
(``parent_turn_id``) and the parent's seq it was forked at (``at``), so that a
turn's forks are one indexed look-up instead of a scan of every log's first
event. A trigger on ``events`` keeps it from the fork's ``turn.forked`` event,
whichever process writes it; existing forks are back-filled from their events.
A row it cannot make (JSON that is no ``jsonb`` on PostgreSQL) never fails the
append it rides on.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "CREATE TABLE turn_forks (turn_id TEXT PRIMARY KEY, parent_turn_id TEXT NOT NULL, at INTEGER NOT NULL)"
_INDEX = "CREATE INDEX ix_turn_forks_parent ON turn_forks (parent_turn_id, turn_id)"


def upgrade() -> None:
    op.execute(_TABLE)
    op.execute(_INDEX)
    if op.get_bind().dialect.name == "postgresql":
        _postgres()
    else:
        _sqlite()


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS turn_forks_on_event ON events")
        op.execute("DROP FUNCTION IF EXISTS turn_forks_on_event()")
    else:
        op.execute("DROP TRIGGER IF EXISTS turn_forks_on_event")
    op.execute("DROP TABLE IF EXISTS turn_forks")


def _sqlite() -> None:
    parent = "json_extract({d}, '$.parent_turn_id')"
    at = "json_extract({d}, '$.at')"
    valid = "json_valid({d}) AND json_type({d}, '$.parent_turn_id') = 'text' AND json_type({d}, '$.at') = 'integer'"
    op.execute(
        "CREATE TRIGGER turn_forks_on_event AFTER INSERT ON events"
        f" WHEN NEW.type = 'turn.forked' AND {valid.format(d='NEW.data')} BEGIN"
        f" INSERT OR REPLACE INTO turn_forks(turn_id, parent_turn_id, at) VALUES (NEW.turn_id, {parent.format(d='NEW.data')}, {at.format(d='NEW.data')});"
        " END"
    )
    op.execute(
        "INSERT OR REPLACE INTO turn_forks(turn_id, parent_turn_id, at)"
        f" SELECT turn_id, {parent.format(d='data')}, {at.format(d='data')} FROM events"
        f" WHERE type = 'turn.forked' AND {valid.format(d='data')}"
    )


def _postgres() -> None:
    op.execute(
        "CREATE FUNCTION turn_forks_on_event() RETURNS trigger LANGUAGE plpgsql AS $$ DECLARE d jsonb; BEGIN"
        " BEGIN"
        " d := NEW.data::jsonb;"
        " IF jsonb_typeof(d->'parent_turn_id') = 'string' AND jsonb_typeof(d->'at') = 'number' THEN"
        " INSERT INTO turn_forks(turn_id, parent_turn_id, at) VALUES (NEW.turn_id, d->>'parent_turn_id', (d->>'at')::integer)"
        " ON CONFLICT (turn_id) DO UPDATE SET parent_turn_id = excluded.parent_turn_id, at = excluded.at;"
        " END IF;"
        # The index never fails the append it rides on.
        " EXCEPTION WHEN others THEN RAISE WARNING 'fork index: turn % not indexed: %', NEW.turn_id, SQLERRM;"
        " END; RETURN NULL; END $$"
    )
    op.execute("CREATE TRIGGER turn_forks_on_event AFTER INSERT ON events FOR EACH ROW WHEN (NEW.type = 'turn.forked') EXECUTE FUNCTION turn_forks_on_event()")
    op.execute(
        "CREATE OR REPLACE FUNCTION pg_temp.as_jsonb(t text) RETURNS jsonb LANGUAGE plpgsql AS $$"
        " BEGIN RETURN t::jsonb; EXCEPTION WHEN others THEN RETURN NULL; END $$"
    )
    op.execute(
        "INSERT INTO turn_forks(turn_id, parent_turn_id, at)"
        " SELECT turn_id, d->>'parent_turn_id', (d->>'at')::integer FROM"
        " (SELECT turn_id, pg_temp.as_jsonb(data) AS d FROM events WHERE type = 'turn.forked') AS f"
        " WHERE jsonb_typeof(d->'parent_turn_id') = 'string' AND jsonb_typeof(d->'at') = 'number'"
        " ON CONFLICT (turn_id) DO NOTHING"
    )
