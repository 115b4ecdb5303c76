"""Finding turns: a user's turns filtered, full-text searched and keyset paged.

What a turn is found by lives in ``turn_texts``, one row per turn that the
database keeps itself (triggers of ``migrations/versions/0011_turn_search``,
no writer involved): ``prompt``, the text of the turn's *new* user messages
(the trailing user messages of its assembly's ``new_messages``: never the
history a client sends again), its ``answer`` and ``title`` (from the final
view), whether it ran a tool and whether a tool call failed.

The one meaning of ``q``, on every backend: a word is a run of letters and
digits (anything else separates words), compared without case; a turn matches
when each word of ``q`` is a word of its prompt or its answer (``word*``: a
word starting so). SQLite answers it with FTS5 (``unicode61``, diacritics
kept), PostgreSQL with a tsvector of exactly those words, the in-memory store
with :func:`words`. A ``q`` without words filters nothing.

Paging is by keyset: newest first by ``(created_at, id)``; the next page is the
turns before the last one shown.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Column, Integer, MetaData, Table, Text, and_, func, literal_column, not_, or_, select, text, tuple_

from adapters.store.common import loads
from adapters.store.memory import MemoryEventStore
from adapters.store.schema import chats, turns

#: How much of a prompt and of an answer is indexed (characters).
MAX_CHARS = 100_000
#: The longest word a query may name (PostgreSQL's lexemes stop short of 2 KiB).
MAX_WORD = 200
#: The most words a query may hold.
MAX_TERMS = 16
#: Between the texts of two new user messages in ``prompt``.
SEPARATOR = "\x1e"

#: The tables the migration makes besides ``schema.metadata``'s (FTS5's own
#: shadow tables included): the schema comparison leaves them out.
TABLES = frozenset({"turn_texts", "turn_fts", "turn_fts_data", "turn_fts_idx", "turn_fts_docsize", "turn_fts_config", "turn_fts_content"})

_metadata = MetaData()
turn_texts = Table(
    "turn_texts",
    _metadata,
    Column("turn_id", Text, primary_key=True),
    Column("prompt", Text),
    Column("answer", Text),
    Column("title", Text),
    Column("tools", Integer),
    Column("tool_failed", Integer),
)

_WORD = re.compile(r"[^\W_]+")
_QUERY_WORD = re.compile(r"([^\W_]+)(\*?)")


class QueryError(ValueError):
    """A ``q`` that cannot be searched (too long a word, too many words)."""


@dataclass(frozen=True)
class Term:
    word: str  # lower-cased letters and digits
    prefix: bool = False


def words(body: str) -> set[str]:
    """The words of a text, as the index holds them."""
    return {w for w in _WORD.findall(body[:MAX_CHARS].lower()) if len(w) <= MAX_WORD}


def parse_query(q: str) -> list[Term]:
    """The terms of ``q`` (``QueryError`` for one that no index could answer)."""
    terms = [Term(m.group(1), bool(m.group(2))) for m in _QUERY_WORD.finditer(q.lower())]
    long = [t.word for t in terms if len(t.word) > MAX_WORD]
    if long:
        raise QueryError(f"a word of q is longer than {MAX_WORD} characters: {long[0][:20]}…")
    if len(terms) > MAX_TERMS:
        raise QueryError(f"q has {len(terms)} words; at most {MAX_TERMS}")
    return terms


def _fts5(terms: Sequence[Term]) -> str:
    return " ".join(f'"{t.word}"' + ("*" if t.prefix else "") for t in terms)


def _tsquery(terms: Sequence[Term]) -> str:
    return " & ".join(f"'{t.word}'" + (":*" if t.prefix else "") for t in terms)


def _matches(terms: Sequence[Term], found: set[str]) -> bool:
    return all(any(w.startswith(t.word) for w in found) if t.prefix else t.word in found for t in terms)


@dataclass(frozen=True)
class TurnQuery:
    """One page's question. ``status`` is as clients see it: ``running`` and
    ``interrupted`` split the stored ``running`` by whether the turn has a live
    owner (one of ``live``, or an unexpired lease at ``now``)."""

    user_id: str
    terms: Sequence[Term] = ()
    status: str | None = None
    model: str | None = None
    chat_ids: Sequence[str] = ()  # any of these chats (none: every chat)
    since: float | None = None  # created_at >= since
    until: float | None = None  # created_at < until
    tools: bool | None = None  # ran a tool (or not)
    failed: bool | None = None  # failed, or one of its tool calls did (or neither)
    before: tuple[float, str | None] | None = None  # (created_at, id) of the last turn shown
    limit: int = 25
    live: Sequence[str] = ()
    now: float = field(default_factory=time.time)


@dataclass(frozen=True)
class FoundTurn:
    id: str
    chat_id: str
    status: str  # as clients see it
    model: str
    title: str | None
    first_message: str | None
    created_at: float
    updated_at: float | None
    tools: bool
    failed: bool
    chat_title: str | None = None


def _first(prompt: str | None, limit: int = 500) -> str | None:
    return None if prompt is None else prompt.split(SEPARATOR, 1)[0][:limit]


def _shown_status(status: str, turn_id: str, lease_until: float | None, query: TurnQuery) -> str:
    if status == "running" and turn_id not in query.live and (lease_until is None or lease_until < query.now):
        return "interrupted"
    return status


# ------------------------------------------------------------------------ SQL


def _owned(query: TurnQuery) -> Any:
    leased = and_(turns.c.lease_until.is_not(None), turns.c.lease_until >= query.now)
    return or_(turns.c.id.in_(list(query.live)), leased)


def _status_clause(status: str, query: TurnQuery) -> Any:
    if status == "running":
        return and_(turns.c.status == "running", _owned(query))
    if status == "interrupted":
        return and_(turns.c.status == "running", not_(_owned(query)))
    return turns.c.status == status


def _filters(query: TurnQuery, dialect: str, *, with_status: bool = True, walk: bool = False, user_index: bool = True) -> list[Any]:
    """The WHERE clauses of ``query``. ``walk``: the text match is checked row
    by row (a page walked newest first); ``user_index=False`` keeps SQLite off
    the user's index (``+``), so that it starts from the text matches."""
    user = turns.c.user_id if user_index or dialect != "sqlite" else literal_column("+turns.user_id", Text)
    where: list[Any] = [user == query.user_id]
    if with_status and query.status is not None:
        where.append(_status_clause(query.status, query))
    if query.model is not None:
        where.append(turns.c.model == query.model)
    if query.chat_ids:
        where.append(turns.c.chat_id.in_(list(query.chat_ids)))
    if query.since is not None:
        where.append(turns.c.created_at >= query.since)
    if query.until is not None:
        where.append(turns.c.created_at < query.until)
    tools = func.coalesce(turn_texts.c.tools, 0) == 1
    if query.tools is not None:
        where.append(tools if query.tools else not_(tools))
    if query.failed is not None:
        failed = or_(turns.c.status == "failed", func.coalesce(turn_texts.c.tool_failed, 0) == 1)
        where.append(failed if query.failed else not_(failed))
    if query.terms:
        where.append(_text_match(query.terms, dialect, walk))
    return where


def _text_match(terms: Sequence[Term], dialect: str, walk: bool) -> Any:
    if dialect == "postgresql":
        match = text("turn_texts.doc @@ CAST(:turn_search_q AS tsquery)").bindparams(turn_search_q=_tsquery(terms))
        if walk:
            return match
        # The matches as a set to start from: ``OFFSET 0`` keeps the planner
        # from turning it back into a check of each turn's text in turn.
        return turns.c.id.in_(select(turn_texts.c.turn_id).where(match).offset(0))
    if not walk:  # every match, listed once
        matched = text("SELECT rowid FROM turn_fts WHERE turn_fts MATCH :turn_search_q").bindparams(turn_search_q=_fts5(terms))
        return literal_column("turn_texts.rid").in_(matched.columns(literal_column("rowid")))
    # One condition per word, walked row by row: a whole word is a seek into
    # its list per row (a list of every match first would cost as many rows
    # as match); a word's start expands to many words, so it matches once.
    clauses: list[Any] = []
    for i, term in enumerate(terms):
        key = f"turn_search_q{i}"
        if term.prefix:
            matched = text(f"SELECT rowid FROM turn_fts WHERE turn_fts MATCH :{key}").bindparams(**{key: _fts5([term])})
            clauses.append(literal_column("turn_texts.rid").in_(matched.columns(literal_column("rowid"))))
        else:
            seek = f"EXISTS (SELECT 1 FROM turn_fts WHERE turn_fts MATCH :{key} AND turn_fts.rowid = turn_texts.rid)"
            clauses.append(text(seek).bindparams(**{key: _fts5([term])}))
    return and_(*clauses)


def _joined() -> Any:
    return turns.outerjoin(turn_texts, turn_texts.c.turn_id == turns.c.id)


#: A ``q`` matching at most this many turns is answered from its matches
#: (looked up and sorted), a commoner one by walking the user's turns newest
#: first until a page is full.
SELECTIVE = 5_000


async def _selective(store: Any, dialect: str, terms: Sequence[Term]) -> bool:
    """Whether a ``q`` matches few enough turns to start from its matches."""
    if dialect == "postgresql":
        sql, q = "SELECT count(*) FROM (SELECT 1 FROM turn_texts WHERE doc @@ CAST(:turn_search_q AS tsquery) LIMIT :turn_search_n) AS m", _tsquery(terms)
    else:
        sql, q = "SELECT count(*) FROM (SELECT 1 FROM turn_fts WHERE turn_fts MATCH :turn_search_q LIMIT :turn_search_n)", _fts5(terms)
    rows = await store._fetch(text(sql).bindparams(turn_search_q=q, turn_search_n=SELECTIVE + 1))
    return int(rows[0][0]) <= SELECTIVE


async def _sql_find(store: Any, query: TurnQuery) -> list[FoundTurn]:
    dialect = store.engine.dialect.name
    if query.terms and await _selective(store, dialect, query.terms):
        # From the matches, looked up and sorted: the user's index would walk
        # every turn of the user for a rare word (PostgreSQL's planner, left
        # to itself, does for a word in 1 % of them).
        where, source = _filters(query, dialect, user_index=False), turns.join(turn_texts, turn_texts.c.turn_id == turns.c.id)
    else:
        where, source = _filters(query, dialect, walk=True), _joined()
    stmt = select(
        turns.c.id,
        turns.c.chat_id,
        turns.c.status,
        turns.c.model,
        turns.c.created_at,
        turns.c.updated_at,
        turns.c.lease_until,
        turn_texts.c.title,
        func.substr(turn_texts.c.prompt, 1, 2000).label("prompt"),
        turn_texts.c.tools,
        turn_texts.c.tool_failed,
        chats.c.title.label("chat_title"),
    ).select_from(source.outerjoin(chats, chats.c.id == turns.c.chat_id))
    for clause in where:
        stmt = stmt.where(clause)
    if query.before is not None:
        at, turn_id = query.before
        stmt = stmt.where(turns.c.created_at < at if turn_id is None else tuple_(turns.c.created_at, turns.c.id) < tuple_(at, turn_id))
    stmt = stmt.order_by(turns.c.created_at.desc(), turns.c.id.desc()).limit(query.limit)
    return [
        FoundTurn(
            id=r.id,
            chat_id=r.chat_id,
            status=_shown_status(r.status, r.id, r.lease_until, query),
            model=r.model,
            title=r.title,
            first_message=_first(r.prompt),
            created_at=r.created_at,
            updated_at=r.updated_at,
            tools=bool(r.tools),
            failed=r.status == "failed" or bool(r.tool_failed),
            chat_title=r.chat_title,
        )
        for r in await store._fetch(stmt)
    ]


async def _sql_counts(store: Any, query: TurnQuery) -> dict[str, int]:
    dialect = store.engine.dialect.name
    # The search table only when a filter needs it (a count reads every row).
    texts = bool(query.terms) or query.tools is not None or query.failed is not None
    where = _filters(query, dialect, with_status=False)
    source = _joined() if texts else turns
    stmt = select(turns.c.status, func.count()).select_from(source).where(*where).group_by(turns.c.status)
    counts = {row[0]: int(row[1]) for row in await store._fetch(stmt)}
    if counts.get("running"):
        # Stored statuses alone are counted from the index; which running
        # turns have lost their owner is asked of those few rows only.
        lost_stmt = select(func.count()).select_from(source).where(*where, _status_clause("interrupted", query))
        lost = int((await store._fetch(lost_stmt))[0][0])
        counts["running"] -= lost
        counts["interrupted"] = lost
    return {status: n for status, n in counts.items() if n}


# --------------------------------------------------------------------- memory


def _memory_rows(store: MemoryEventStore, query: TurnQuery, only: str | None = None) -> Iterator[FoundTurn]:
    db = store.database
    for turn_id, row in db.turns.items():
        if row.user_id != query.user_id or (only is not None and turn_id != only):
            continue
        prompt: str | None = None
        tools = tool_failed = False
        log = db.events.get(turn_id)
        rows = log.rows if log is not None else {}
        for seq in log.seqs if log is not None else ():
            type_, _, data, _ = rows[seq]
            if type_ == "assembly.completed":
                prompt = memory_prompt(loads(data))
            elif type_ == "tool.started":
                tools = True
            elif type_ == "tool.completed" and loads(data).get("status") == "failed":
                tool_failed = True
        view = loads(row.view) if row.view is not None else {}
        answer = view.get("content") if isinstance(view.get("content"), str) else None
        title = view.get("title") if isinstance(view.get("title"), str) else None
        if query.terms and not _matches(query.terms, words(prompt or "") | words(answer or "")):
            continue
        yield FoundTurn(
            id=turn_id,
            chat_id=row.chat_id,
            status=_shown_status(row.status, turn_id, row.lease_until, query),
            model=row.model,
            title=title,
            first_message=_first(prompt),
            created_at=row.created_at,
            updated_at=row.updated_at,
            tools=tools,
            failed=row.status == "failed" or tool_failed,
            chat_title=chat.title if (chat := db.chats.get(row.chat_id)) is not None else None,
        )


def memory_prompt(data: Any) -> str | None:
    """The prompt of an ``assembly.completed`` event's data: the texts of its
    trailing user messages (what the SQL triggers compute)."""
    messages = data.get("new_messages") if isinstance(data, dict) else None
    if not isinstance(messages, list):
        return None
    start = 0
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and m.get("role") == "user"):
            start = i + 1
    texts = [t for t in (_message_text(m) for m in messages[start:]) if t is not None]
    return SEPARATOR.join(texts)[:MAX_CHARS] if texts else None


def _message_text(message: dict[str, Any]) -> str | None:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "\n".join(parts) if parts else None
    return None


def _memory_keep(found: FoundTurn, query: TurnQuery, *, with_status: bool = True) -> bool:
    if with_status and query.status is not None and found.status != query.status:
        return False
    checks = (
        query.model is None or found.model == query.model,
        not query.chat_ids or found.chat_id in query.chat_ids,
        query.since is None or found.created_at >= query.since,
        query.until is None or found.created_at < query.until,
        query.tools is None or found.tools == query.tools,
        query.failed is None or found.failed == query.failed,
    )
    return all(checks)


def _before(found: FoundTurn, before: tuple[float, str | None] | None) -> bool:
    if before is None:
        return True
    at, turn_id = before
    return found.created_at < at if turn_id is None else (found.created_at, found.id) < (at, turn_id)


# ------------------------------------------------------------------------ API


async def find_turns(store: Any, query: TurnQuery) -> list[FoundTurn]:
    """One page of the user's turns that match, newest first."""
    if isinstance(store, MemoryEventStore):
        found = [f for f in _memory_rows(store, query) if _memory_keep(f, query) and _before(f, query.before)]
        found.sort(key=lambda f: (f.created_at, f.id), reverse=True)
        return found[: query.limit]
    return await _sql_find(store, query)


async def models_in_use(store: Any, user_id: str) -> list[str]:
    """The models of the user's turns, sorted (what a model filter offers)."""
    if isinstance(store, MemoryEventStore):
        return sorted({row.model for row in store.database.turns.values() if row.user_id == user_id})
    rows = await store._fetch(select(turns.c.model).distinct().where(turns.c.user_id == user_id).order_by(turns.c.model))
    return [row[0] for row in rows]


async def chat_openers(store: Any, chat_ids: Sequence[str]) -> dict[str, str]:
    """The first new user message of each chat's first turn that has one (what
    names a chat without a title)."""
    if not chat_ids:
        return {}
    if isinstance(store, MemoryEventStore):
        openers: dict[str, tuple[float, str, str]] = {}  # chat -> (created_at, turn id, message)
        for turn_id, row in store.database.turns.items():
            if row.chat_id not in chat_ids:
                continue
            found = next(_memory_rows(store, TurnQuery(user_id=row.user_id), only=turn_id))
            if found.first_message is not None:
                openers[row.chat_id] = min(
                    openers.get(row.chat_id, (found.created_at, turn_id, found.first_message)), (found.created_at, turn_id, found.first_message)
                )
        return {chat_id: opener[2] for chat_id, opener in openers.items()}
    rank = func.row_number().over(partition_by=turns.c.chat_id, order_by=(turns.c.created_at, turns.c.id)).label("rank")
    firsts = (
        select(turns.c.chat_id, func.substr(turn_texts.c.prompt, 1, 2000).label("prompt"), rank)
        .select_from(turns.join(turn_texts, turn_texts.c.turn_id == turns.c.id))
        .where(turns.c.chat_id.in_(list(chat_ids)), turn_texts.c.prompt.is_not(None))
        .subquery()
    )
    rows = await store._fetch(select(firsts.c.chat_id, firsts.c.prompt).where(firsts.c.rank == 1))
    return {row.chat_id: first for row in rows if (first := _first(row.prompt)) is not None}


async def count_turns(store: Any, query: TurnQuery) -> dict[str, int]:
    """How many of the user's turns match, by status (``query.status`` aside)."""
    if isinstance(store, MemoryEventStore):
        counts: dict[str, int] = {}
        for f in _memory_rows(store, query):
            if _memory_keep(f, query, with_status=False):
                counts[f.status] = counts.get(f.status, 0) + 1
        return counts
    return await _sql_counts(store, query)
