"""turn_search: what finds a turn (its new user messages, its answer, its title)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04

``turn_texts``: one row per turn, kept by triggers so that no writer has to
know about it: an ``assembly.completed`` event sets ``prompt`` (the text of the
turn's new user messages, the trailing run of user messages of its
``new_messages``, joined by U+001E), a ``tool.started`` sets ``tools``, a
failed ``tool.completed`` sets ``tool_failed``, and the turn row's final view
(written with the terminal event) sets ``answer`` and ``title``. Words are
indexed by the database: SQLite's FTS5 (``turn_fts``, external content,
``unicode61`` without diacritics removal) and PostgreSQL's tsvector (``doc``,
lexemes are the lower-cased runs of letters and digits, as FTS5 makes them,
not a text search configuration's stems). ``adapters.store.turn_search`` reads
them. Existing turns are back-filled from their events and views. And an
index of a user's turns by status (``ix_turns_user_status_created``).

A trigger never fails the write it rides on: on PostgreSQL a value it cannot
index (JSON that is no ``jsonb``) leaves the turn unindexed with a warning.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: How much of the prompt and of the answer is indexed (characters; as
#: ``adapters.store.turn_search.MAX_CHARS``).
MAX_CHARS = 100_000
#: Longer words are not indexed on PostgreSQL (a lexeme's limit is 2 KiB);
#: a query may not name one (``adapters.store.turn_search.MAX_WORD``).
MAX_WORD = 200


def upgrade() -> None:
    # A user's turns of one status, newest first, and the counts per status.
    op.create_index("ix_turns_user_status_created", "turns", ["user_id", "status", "created_at"])
    if op.get_bind().dialect.name == "postgresql":
        _postgres()
    else:
        _sqlite()


def downgrade() -> None:
    op.drop_index("ix_turns_user_status_created", "turns")
    if op.get_bind().dialect.name == "postgresql":
        for trigger, table in (
            ("turn_texts_on_event", "events"),
            ("turn_texts_on_view_insert", "turns"),
            ("turn_texts_on_view_update", "turns"),
            ("turn_texts_doc", "turn_texts"),
        ):
            op.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {table}")
        op.execute("DROP TABLE IF EXISTS turn_texts")
        for fn in ("turn_texts_on_event()", "turn_texts_on_view()", "turn_texts_doc()", "turn_search_prompt(jsonb)", "turn_search_words(text)"):
            op.execute(f"DROP FUNCTION IF EXISTS {fn}")
        return
    for trigger in (
        "turn_texts_prompt",
        "turn_texts_tools",
        "turn_texts_tool_failed",
        "turn_texts_view_insert",
        "turn_texts_view_update",
        "turn_texts_fts_insert",
        "turn_texts_fts_update",
        "turn_texts_fts_delete",
    ):
        op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    op.execute("DROP TABLE IF EXISTS turn_fts")
    op.execute("DROP TABLE IF EXISTS turn_texts")


# --------------------------------------------------------------------- SQLite


def _sqlite_prompt(data: str) -> str:
    """The prompt of an ``assembly.completed`` event whose data is ``data`` (an
    SQL expression): its trailing user messages' texts, U+001E between them.
    (CASE guards every JSON function from a value that is not an object.)"""
    text_of = (
        "CASE json_type(m.value, '$.content') "
        "WHEN 'text' THEN json_extract(m.value, '$.content') "
        "WHEN 'array' THEN (SELECT group_concat(json_extract(p.value, '$.text'), char(10)) "
        "FROM json_each(m.value, '$.content') AS p "
        "WHERE CASE WHEN p.type = 'object' THEN json_type(p.value, '$.text') = 'text' ELSE 0 END) END"
    )
    is_user = "CASE WHEN {m}.type = 'object' THEN coalesce(json_extract({m}.value, '$.role') = 'user', 0) ELSE 0 END"
    last_other = f"(SELECT max(n.key) FROM json_each({data}, '$.new_messages') AS n WHERE NOT {is_user.format(m='n')})"
    return (
        f"(SELECT substr(group_concat(t, char(30)), 1, {MAX_CHARS}) FROM ("
        f"SELECT {text_of} AS t FROM json_each({data}, '$.new_messages') AS m "
        f"WHERE {is_user.format(m='m')} AND m.key > coalesce({last_other}, -1) ORDER BY m.key))"
    )


def _sqlite_view(view: str, key: str) -> str:
    """A string field of a stored view (JSON text), else NULL."""
    return f"CASE WHEN json_valid({view}) AND json_type({view}, '$.{key}') = 'text' THEN json_extract({view}, '$.{key}') END"


def _sqlite() -> None:
    op.execute(
        "CREATE TABLE turn_texts ("
        # An explicit rowid: FTS5's external content follows it, and VACUUM may
        # renumber an implicit one.
        " rid INTEGER PRIMARY KEY,"
        " turn_id TEXT NOT NULL UNIQUE,"
        " prompt TEXT, answer TEXT, title TEXT,"
        " tools INTEGER NOT NULL DEFAULT 0,"
        " tool_failed INTEGER NOT NULL DEFAULT 0)"
    )
    op.execute("CREATE VIRTUAL TABLE turn_fts USING fts5(prompt, answer, content='turn_texts', content_rowid='rid', tokenize='unicode61 remove_diacritics 0')")
    op.execute(
        "CREATE TRIGGER turn_texts_fts_insert AFTER INSERT ON turn_texts BEGIN"
        " INSERT INTO turn_fts(rowid, prompt, answer) VALUES (NEW.rid, NEW.prompt, NEW.answer); END"
    )
    op.execute(
        "CREATE TRIGGER turn_texts_fts_update AFTER UPDATE OF prompt, answer ON turn_texts BEGIN"
        " INSERT INTO turn_fts(turn_fts, rowid, prompt, answer) VALUES ('delete', OLD.rid, OLD.prompt, OLD.answer);"
        " INSERT INTO turn_fts(rowid, prompt, answer) VALUES (NEW.rid, NEW.prompt, NEW.answer); END"
    )
    op.execute(
        "CREATE TRIGGER turn_texts_fts_delete AFTER DELETE ON turn_texts BEGIN"
        " INSERT INTO turn_fts(turn_fts, rowid, prompt, answer) VALUES ('delete', OLD.rid, OLD.prompt, OLD.answer); END"
    )
    # (An INSERT … SELECT needs a WHERE before its upsert clause: SQLite's parser.)
    op.execute(
        "CREATE TRIGGER turn_texts_prompt AFTER INSERT ON events"
        " WHEN NEW.type = 'assembly.completed' AND json_valid(NEW.data) BEGIN"
        f" INSERT INTO turn_texts(turn_id, prompt) SELECT NEW.turn_id, {_sqlite_prompt('NEW.data')} WHERE true"
        " ON CONFLICT(turn_id) DO UPDATE SET prompt = excluded.prompt; END"
    )
    op.execute(
        "CREATE TRIGGER turn_texts_tools AFTER INSERT ON events WHEN NEW.type = 'tool.started' BEGIN"
        " INSERT INTO turn_texts(turn_id, tools) VALUES (NEW.turn_id, 1) ON CONFLICT(turn_id) DO UPDATE SET tools = 1; END"
    )
    op.execute(
        "CREATE TRIGGER turn_texts_tool_failed AFTER INSERT ON events"
        " WHEN NEW.type = 'tool.completed' AND CASE WHEN json_valid(NEW.data) THEN json_extract(NEW.data, '$.status') = 'failed' ELSE 0 END BEGIN"
        " INSERT INTO turn_texts(turn_id, tool_failed) VALUES (NEW.turn_id, 1) ON CONFLICT(turn_id) DO UPDATE SET tool_failed = 1; END"
    )
    answer = f"substr({_sqlite_view('NEW.view', 'content')}, 1, {MAX_CHARS})"
    title = _sqlite_view("NEW.view", "title")
    upsert = (
        f" INSERT INTO turn_texts(turn_id, answer, title) VALUES (NEW.id, {answer}, {title})"
        " ON CONFLICT(turn_id) DO UPDATE SET answer = excluded.answer, title = excluded.title; END"
    )
    op.execute("CREATE TRIGGER turn_texts_view_insert AFTER INSERT ON turns WHEN NEW.view IS NOT NULL BEGIN" + upsert)
    op.execute("CREATE TRIGGER turn_texts_view_update AFTER UPDATE OF view ON turns WHEN NEW.view IS NOT NULL AND NEW.view IS NOT OLD.view BEGIN" + upsert)
    # Back-fill: the same values from the events and views already stored
    # (events in log order, so that a later assembly wins, as it does live).
    op.execute(
        f"INSERT INTO turn_texts(turn_id, prompt) SELECT e.turn_id, {_sqlite_prompt('e.data')} FROM events AS e"
        " WHERE e.type = 'assembly.completed' AND json_valid(e.data) ORDER BY e.turn_id, e.seq"
        " ON CONFLICT(turn_id) DO UPDATE SET prompt = excluded.prompt"
    )
    op.execute(
        "INSERT INTO turn_texts(turn_id, tools) SELECT DISTINCT turn_id, 1 FROM events WHERE type = 'tool.started' AND true"
        " ON CONFLICT(turn_id) DO UPDATE SET tools = 1"
    )
    op.execute(
        "INSERT INTO turn_texts(turn_id, tool_failed) SELECT DISTINCT turn_id, 1 FROM events"
        " WHERE type = 'tool.completed' AND CASE WHEN json_valid(data) THEN json_extract(data, '$.status') = 'failed' ELSE 0 END"
        " ON CONFLICT(turn_id) DO UPDATE SET tool_failed = 1"
    )
    op.execute(
        f"INSERT INTO turn_texts(turn_id, answer, title) SELECT t.id, substr({_sqlite_view('t.view', 'content')}, 1, {MAX_CHARS}),"
        f" {_sqlite_view('t.view', 'title')} FROM turns AS t WHERE t.view IS NOT NULL"
        " ON CONFLICT(turn_id) DO UPDATE SET answer = excluded.answer, title = excluded.title"
    )


# ----------------------------------------------------------------- PostgreSQL


def _postgres() -> None:
    # The driver's own statements: no bind-parameter parsing of the quoted
    # SQL (its % and $$).
    pg = op.get_bind().exec_driver_sql
    # The builtin C.UTF-8 collation (PostgreSQL 17+) lower-cases and classifies
    # letters by Unicode whatever the database's locale (the C locale knows
    # ASCII only); before 17 the database's own collation decides.
    builtin = op.get_bind().exec_driver_sql("SELECT 1 FROM pg_collation WHERE collname = 'pg_c_utf8'").first()
    collate = ' COLLATE "pg_c_utf8"' if builtin else ""
    pg(
        "CREATE FUNCTION turn_search_words(body text) RETURNS tsvector LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$"
        " SELECT array_to_tsvector(coalesce(array_agg(DISTINCT w), '{}'::text[]))"
        f" FROM regexp_split_to_table(lower(body{collate}), '[^[:alnum:]]+') AS w"
        f" WHERE w <> '' AND length(w) <= {MAX_WORD} $$"
    )
    messages = "CASE WHEN jsonb_typeof(d->'new_messages') = 'array' THEN d->'new_messages' ELSE '[]'::jsonb END"
    is_user = "(jsonb_typeof({m}) = 'object' AND jsonb_typeof({m}->'role') = 'string' AND {m}->>'role' = 'user')"
    pg(
        "CREATE FUNCTION turn_search_prompt(d jsonb) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$"
        f" SELECT left(string_agg(t, chr(30) ORDER BY i), {MAX_CHARS}) FROM ("
        " SELECT m.i, CASE jsonb_typeof(m.v->'content')"
        " WHEN 'string' THEN m.v->>'content'"
        " WHEN 'array' THEN (SELECT string_agg(p.v->>'text', chr(10) ORDER BY p.j)"
        " FROM jsonb_array_elements(m.v->'content') WITH ORDINALITY AS p(v, j) WHERE jsonb_typeof(p.v->'text') = 'string') END AS t"
        f" FROM jsonb_array_elements({messages}) WITH ORDINALITY AS m(v, i)"
        f" WHERE {is_user.format(m='m.v')} AND m.i > coalesce((SELECT max(n.i)"
        f" FROM jsonb_array_elements({messages}) WITH ORDINALITY AS n(v, i) WHERE NOT {is_user.format(m='n.v')}), 0)"
        ") AS s $$"
    )
    pg(
        "CREATE TABLE turn_texts ("
        " turn_id text PRIMARY KEY, prompt text, answer text, title text,"
        " tools integer NOT NULL DEFAULT 0, tool_failed integer NOT NULL DEFAULT 0,"
        " doc tsvector NOT NULL DEFAULT ''::tsvector)"
    )
    pg("CREATE INDEX ix_turn_texts_doc ON turn_texts USING gin (doc)")
    pg(
        "CREATE FUNCTION turn_texts_doc() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF TG_OP = 'INSERT' OR NEW.prompt IS DISTINCT FROM OLD.prompt OR NEW.answer IS DISTINCT FROM OLD.answer THEN"
        " NEW.doc := turn_search_words(coalesce(NEW.prompt, '') || ' ' || coalesce(NEW.answer, ''));"
        " END IF; RETURN NEW; END $$"
    )
    pg("CREATE TRIGGER turn_texts_doc BEFORE INSERT OR UPDATE ON turn_texts FOR EACH ROW EXECUTE FUNCTION turn_texts_doc()")
    pg(
        "CREATE FUNCTION turn_texts_on_event() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " BEGIN"
        " IF NEW.type = 'assembly.completed' THEN"
        " INSERT INTO turn_texts(turn_id, prompt) VALUES (NEW.turn_id, turn_search_prompt(NEW.data::jsonb))"
        " ON CONFLICT (turn_id) DO UPDATE SET prompt = excluded.prompt;"
        " ELSIF NEW.type = 'tool.started' THEN"
        " INSERT INTO turn_texts(turn_id, tools) VALUES (NEW.turn_id, 1) ON CONFLICT (turn_id) DO UPDATE SET tools = 1;"
        " ELSIF NEW.type = 'tool.completed' AND NEW.data::jsonb->>'status' = 'failed' THEN"
        " INSERT INTO turn_texts(turn_id, tool_failed) VALUES (NEW.turn_id, 1) ON CONFLICT (turn_id) DO UPDATE SET tool_failed = 1;"
        " END IF;"
        # Indexing never fails the append it rides on.
        " EXCEPTION WHEN others THEN RAISE WARNING 'turn search: turn % seq % not indexed: %', NEW.turn_id, NEW.seq, SQLERRM;"
        " END; RETURN NULL; END $$"
    )
    pg(
        "CREATE TRIGGER turn_texts_on_event AFTER INSERT ON events FOR EACH ROW"
        " WHEN (NEW.type IN ('assembly.completed', 'tool.started', 'tool.completed')) EXECUTE FUNCTION turn_texts_on_event()"
    )
    pg(
        "CREATE FUNCTION turn_texts_on_view() RETURNS trigger LANGUAGE plpgsql AS $$ DECLARE v jsonb; BEGIN"
        " BEGIN"
        " v := NEW.view::jsonb;"
        " INSERT INTO turn_texts(turn_id, answer, title) VALUES (NEW.id,"
        f" left(CASE WHEN jsonb_typeof(v->'content') = 'string' THEN v->>'content' END, {MAX_CHARS}),"
        " CASE WHEN jsonb_typeof(v->'title') = 'string' THEN v->>'title' END)"
        " ON CONFLICT (turn_id) DO UPDATE SET answer = excluded.answer, title = excluded.title;"
        " EXCEPTION WHEN others THEN RAISE WARNING 'turn search: turn % not indexed: %', NEW.id, SQLERRM;"
        " END; RETURN NULL; END $$"
    )
    pg("CREATE TRIGGER turn_texts_on_view_insert AFTER INSERT ON turns FOR EACH ROW WHEN (NEW.view IS NOT NULL) EXECUTE FUNCTION turn_texts_on_view()")
    pg(
        "CREATE TRIGGER turn_texts_on_view_update AFTER UPDATE OF view ON turns FOR EACH ROW"
        " WHEN (NEW.view IS NOT NULL AND NEW.view IS DISTINCT FROM OLD.view) EXECUTE FUNCTION turn_texts_on_view()"
    )
    # Back-fill (a turn's last assembly wins, as live). JSON that is no jsonb
    # (a NUL escape) is left unindexed, as the triggers leave it.
    pg("CREATE FUNCTION pg_temp.as_jsonb(t text) RETURNS jsonb LANGUAGE plpgsql AS $$ BEGIN RETURN t::jsonb; EXCEPTION WHEN others THEN RETURN NULL; END $$")
    pg(
        "INSERT INTO turn_texts(turn_id, prompt) SELECT DISTINCT ON (turn_id) turn_id, turn_search_prompt(pg_temp.as_jsonb(data)) FROM events"
        " WHERE type = 'assembly.completed' ORDER BY turn_id, seq DESC"
        " ON CONFLICT (turn_id) DO UPDATE SET prompt = excluded.prompt"
    )
    pg(
        "INSERT INTO turn_texts(turn_id, tools) SELECT DISTINCT turn_id, 1 FROM events WHERE type = 'tool.started'"
        " ON CONFLICT (turn_id) DO UPDATE SET tools = 1"
    )
    pg(
        "INSERT INTO turn_texts(turn_id, tool_failed) SELECT DISTINCT turn_id, 1 FROM events"
        " WHERE type = 'tool.completed' AND pg_temp.as_jsonb(data)->>'status' = 'failed'"
        " ON CONFLICT (turn_id) DO UPDATE SET tool_failed = 1"
    )
    pg(
        f"INSERT INTO turn_texts(turn_id, answer, title) SELECT id, left(CASE WHEN jsonb_typeof(v->'content') = 'string' THEN v->>'content' END, {MAX_CHARS}),"
        " CASE WHEN jsonb_typeof(v->'title') = 'string' THEN v->>'title' END"
        " FROM (SELECT id, pg_temp.as_jsonb(view) AS v FROM turns WHERE view IS NOT NULL) AS t WHERE v IS NOT NULL"
        " ON CONFLICT (turn_id) DO UPDATE SET answer = excluded.answer, title = excluded.title"
    )
