"""The SQLite writer: every write of the store, on one ``sqlite3`` connection.

``adapters.store.group_commit.ThreadedGroupCommit`` runs :class:`SqliteWriter`
in the store's writer thread: each batch is one ``BEGIN IMMEDIATE`` ...
``COMMIT`` on the thread's own ``sqlite3`` connection (from
``adapters.store.sqlite.sqlite_writer_engine``: the pragmas), with the
statements below and no SQLAlchemy: a profile of a tiny turn (``python -m
bench.turncost commit``) put ~75 % of the writer thread's CPU in SQLAlchemy's
execution machinery and ~5 % in the driver. The sqlite3 module keeps each
statement prepared (its statement cache), so an ``execute`` here is a bind
and a step.

Appends, starts and releases come in runs written in few multi-row
statements (a failure redoes the run request by request, so only the
culprit fails); any other write (claim, renew, chat meta, blobs, API keys)
is one statement of ``STATEMENTS`` in its own savepoint.

Savepoints are plain ``SAVEPOINT`` statements. After a failed statement the
transaction may be gone (SQLite rolls it back itself on a full disk or an I/O
error): then the whole batch fails, as a lost connection does.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Engine

from adapters.store import batch_plan as plan
from adapters.store.batch_plan import Append, BatchWriter, Release, Start, Write
from adapters.store.common import EventRow, Head, dumps, link_rows, loads, previous_hash
from adapters.store.group_commit import Results

#: An event row's columns, in the order of ``adapters.store.common.EventRow``.
EVENT_COLUMNS = ("turn_id", "seq", "type", "at", "data", "hash")

# Many rows per INSERT statement: one statement is atomic (a unique violation
# backs out all its rows, the transaction goes on), so a run of appends that
# is one statement needs no savepoint. Parameters per statement: at most
# 32766 since SQLite 3.32, 999 before.
ROWS_PER_INSERT = 1000 if sqlite3.sqlite_version_info >= (3, 32, 0) else 199


def statement_sizes(n_rows: int, most: int) -> list[int]:
    """The row counts of the statements that write ``n_rows`` rows: ``most``
    while more are left, then the binary digits of the rest (37: 32, 4, 1).

    The sqlite3 module keeps a connection's last 128 prepared statements, and
    a multi-row INSERT holds ~0.7 KB per row: one statement per row count, as
    batches come (1 to 1,000 rows), kept tens of MB per connection. These
    sizes are a dozen statements per table, prepared once."""
    sizes = [most] * (n_rows // most)
    rest = n_rows % most
    sizes += [1 << bit for bit in range(rest.bit_length() - 1, -1, -1) if rest >> bit & 1]
    return sizes


def one_statement(n_rows: int) -> bool:
    """Whether :func:`insert_events` writes ``n_rows`` rows in one statement
    (atomic by itself)."""
    return len(statement_sizes(n_rows, ROWS_PER_INSERT)) == 1


#: The fencing tokens of some turns, their ids one JSON array parameter (one
#: statement text whatever their count), as ONE row: a JSON object id ->
#: token. Not a row per turn: the sqlite3 module releases the GIL around the
#: step of each row it fetches, and taking it back from a busy event loop
#: thread can cost up to the switch interval (5 ms), and a full batch under
#: thousands of streams fences about a thousand turns. No lock needed: the writer holds the write
#: lock from BEGIN IMMEDIATE on.
SELECT_FENCING = "SELECT json_group_object(id, fencing) FROM turns WHERE id IN (SELECT value FROM json_each(?))"

#: The hash before ``seq`` (the chain's previous link) when the writer has not
#: linked that turn's last event itself.
SELECT_PREVIOUS_HASH = "SELECT hash FROM events WHERE turn_id = ? AND seq < ? ORDER BY seq DESC LIMIT 1"

#: ``engine.ports.IndexUpdate`` (``i_*`` parameters of ``SqlEventStore.append``):
#: status and view unless None, and the lease released with the terminal
#: event if ``i_release`` still owns it (SET expressions read the old row).
UPDATE_INDEX = (
    "UPDATE turns SET status = coalesce(:i_status, status), updated_at = :i_updated_at, "
    "owner = CASE WHEN (owner = :i_release) THEN NULL ELSE owner END, "
    "lease_until = CASE WHEN (owner = :i_release) THEN NULL ELSE lease_until END, "
    '"view" = coalesce(:i_view, "view") WHERE id = :i_id'
)

# Starts and releases: a run of them is one statement each, not an
# ``executemany`` (the sqlite3 module releases the GIL around every step, one
# per row of an executemany, and each time the writer thread must take it
# back from the event loop's thread: up to the 5 ms switch interval when the
# loop is busy). A lone start or release is the same statement with one row.

#: A start's turn rows (``t_*`` parameters, positional in ``TURN_PARAMS``
#: order), fencing token 1.
INSERT_TURNS = 'INSERT INTO turns (id, chat_id, user_id, model, status, created_at, updated_at, owner, lease_until, fencing, "view") VALUES '
TURN_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?)"
TURN_PARAMS = ("t_id", "t_chat", "t_user", "t_model", "t_status", "t_created", "t_updated", "t_owner", "t_lease", "t_view")

#: A start's chats (``c_*`` parameters, positional in ``CHAT_PARAMS``
#: order), at most one row per chat id: created, or its ``updated_at`` moved
#: forward to ``c_upd``.
UPSERT_CHATS = "INSERT INTO chats (id, user_id, title, tags, created_at, updated_at) VALUES "
CHAT_ROW = "(?, ?, NULL, '[]', ?, ?)"
CHAT_PARAMS = ("c_id", "c_user", "c_at", "c_upd")
UPSERT_CHATS_TAIL = (
    " ON CONFLICT (id) DO UPDATE SET updated_at = CASE WHEN (chats.updated_at IS NULL "
    "OR chats.updated_at < excluded.updated_at) THEN excluded.updated_at ELSE chats.updated_at END"
)

#: ``release_turn``: each turn only if its owner still holds it; one JSON
#: array of ``[id, owner]`` pairs.
RELEASE_TURNS = (
    "UPDATE turns SET owner = NULL, lease_until = NULL WHERE (id, owner) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?))"
)

#: The other writes (``batch_plan.Write``); a list parameter is a JSON array.
STATEMENTS = {
    "claim": (
        "UPDATE turns SET fencing = fencing + 1, owner = ?, lease_until = ? WHERE id = ? AND "
        "(owner IN (SELECT value FROM json_each(?)) OR lease_until IS NULL OR lease_until < ?) RETURNING fencing"
    ),
    "renew": "UPDATE turns SET lease_until = ? WHERE owner = ? AND id IN (SELECT value FROM json_each(?))",
    "chat_meta": "UPDATE chats SET title = coalesce(?, title), tags = coalesce(?, tags) WHERE id = ?",
    "api_key": "INSERT INTO api_keys (key_hash, user_id, created_at, role) VALUES (?, ?, ?, ?)",
    "blob": "INSERT INTO blobs (id, user_id, mime, size, data, created_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
}

#: Parameters per statement: at most 32766 since SQLite 3.32, 999 before.
MAX_PARAMS = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999


@functools.lru_cache(maxsize=256)
def rows_sql(head: str, row: str, n_rows: int, tail: str = "") -> str:
    """``head`` + ``n_rows`` times ``row`` + ``tail``: one multi-row statement."""
    return head + ", ".join([row] * n_rows) + tail


def release_pairs(reqs: list[Release]) -> tuple[str]:
    """``RELEASE_TURNS``'s one parameter."""
    return (dumps([[req.turn_id, req.owner] for req in reqs]),)


def write_rows(raw: sqlite3.Connection, head: str, row: str, names: tuple[str, ...], rows: list[dict[str, Any]], tail: str = "") -> None:
    """``rows`` (dicts of named parameters) as few multi-row statements, each
    at most ``MAX_PARAMS`` parameters, of :func:`statement_sizes` (atomic per
    statement only: call it inside a savepoint)."""
    k = 0
    for size in statement_sizes(len(rows), max(1, MAX_PARAMS // row.count("?"))):
        chunk = rows[k : k + size]
        k += size
        raw.execute(rows_sql(head, row, size, tail), tuple(r[name] for r in chunk for name in names))


@functools.lru_cache(maxsize=128)
def insert_events_sql(n_rows: int) -> str:
    """The INSERT of ``n_rows`` event rows in one statement."""
    one = f"({', '.join('?' * len(EVENT_COLUMNS))})"
    return f"INSERT INTO events ({', '.join(EVENT_COLUMNS)}) VALUES " + ", ".join([one] * n_rows)


def insert_events(raw: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """INSERT ``rows`` in statements of :func:`statement_sizes`; atomic if
    :func:`one_statement` (else call it inside a savepoint)."""
    k = 0
    for size in statement_sizes(len(rows), ROWS_PER_INSERT):
        chunk = rows[k : k + size]
        k += size
        raw.execute(insert_events_sql(size), tuple(v for row in chunk for v in row))


class BatchLost(Exception):
    """A savepoint could not be rolled back: what the failed block wrote might
    commit, so the whole batch must fail (the cause says why)."""


@contextmanager
def savepoint(raw: sqlite3.Connection) -> Iterator[None]:
    """A savepoint around the block, rolled back if the block raises. If the
    transaction itself is gone or the rollback fails, the batch must fail
    (:func:`fails_batch`)."""
    raw.execute("SAVEPOINT turnlog_w")
    try:
        yield
    except BaseException:
        if raw.in_transaction:
            try:
                raw.execute("ROLLBACK TO turnlog_w")
                raw.execute("RELEASE turnlog_w")
            except sqlite3.Error as exc:
                raise BatchLost("a savepoint of the group commit could not be rolled back") from exc
        raise
    raw.execute("RELEASE turnlog_w")


def fails_batch(raw: sqlite3.Connection, exc: BaseException) -> bool:
    """Whether ``exc``, raised in a savepoint, must fail the whole batch rather
    than its request alone: the savepoint could not be rolled back, or SQLite
    rolled the whole transaction back itself (a full disk, an I/O error)."""
    return isinstance(exc, BatchLost) or not raw.in_transaction


class SqliteWriter(BatchWriter):
    """``group_commit.SyncWriter`` on a connection of ``engine``
    (``adapters.store.sqlite.sqlite_writer_engine``), used by one thread."""

    def __init__(self, engine: Engine, stats: dict[str, int]) -> None:
        super().__init__(stats)
        self._engine = engine
        self._conn: Any = None  # the pool's proxy of the sqlite3 connection

    def write(self, batch: list[Any]) -> Results:
        if self._conn is None:
            self._conn = self._engine.raw_connection()
        raw: sqlite3.Connection = self._conn.dbapi_connection
        try:
            raw.execute("BEGIN IMMEDIATE")
            results = self._write(raw, batch)
            raw.execute("COMMIT")
        except BaseException:
            self.failed(batch)
            conn, self._conn = self._conn, None
            try:  # closing the connection rolls back what is left
                conn.invalidate()
            except Exception:  # pragma: no cover
                pass
            raise
        self.committed()
        return results

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._engine.dispose()

    def _write(self, raw: sqlite3.Connection, batch: list[Any]) -> Results:
        self.linked = {}
        results: Results = [(True, None)] * len(batch)
        for kind, i, j in plan.runs(batch):
            if kind is Append:
                self._appends(raw, batch, i, j, results)
            elif kind is Start:
                self._starts(raw, batch[i:j], i, results)
            elif kind is Release:
                self._releases(raw, batch[i:j], i, results)
            else:
                self._isolated(raw, i, results, functools.partial(_execute, raw, batch[i]))
        return results

    def _isolated(self, raw: sqlite3.Connection, i: int, results: Results, body: Callable[[], Any]) -> bool:
        """``results[i]`` is what ``body()`` returns, in a savepoint of its own;
        or what it raised (rolled back) unless that fails the whole batch."""
        try:
            with savepoint(raw):
                results[i] = (True, body())
        except Exception as exc:
            if fails_batch(raw, exc):
                raise
            results[i] = (False, exc)
            return False
        return True

    def _link(self, raw: sqlite3.Connection, rows: list[EventRow], trial: dict[str, Head]) -> list[EventRow]:
        """``rows`` with their hashes, after this batch's and the committed
        heads (``trial`` gets the new heads: merge it into ``linked`` once the
        rows are written)."""

        def previous(turn_id: str, seq: int) -> bytes:  # read as link_rows needs it: no pass of its own
            self.stats["chain_reads"] += 1
            return previous_hash(_scalar(raw, SELECT_PREVIOUS_HASH, (turn_id, seq)))

        return link_rows(rows, trial, previous, self.linked, self.heads)

    def _appends(self, raw: sqlite3.Connection, batch: list[Any], start: int, end: int, results: Results) -> None:
        """A run of appends: one fencing read, then all their rows in one
        statement; if that fails, append by append to find the culprits."""
        live = list(range(start, end))
        fenced = plan.fenced_turns(batch, start, end)
        if fenced:
            current = loads(_scalar(raw, SELECT_FENCING, (dumps(list(fenced)),)))
            live = plan.live_appends(batch, start, end, current, self.poisoned, results)
        rows = [row for i in live for row in batch[i].rows]
        if plan.distinct_seqs(rows):
            updates = [batch[i].index for i in live if batch[i].index is not None]
            trial: dict[str, Head] = {}
            rows = self._link(raw, rows, trial)
            try:
                if one_statement(len(rows)):  # atomic by itself
                    _insert_and_index(raw, rows, updates)
                else:
                    with savepoint(raw):
                        _insert_and_index(raw, rows, updates)
            except sqlite3.IntegrityError as exc:
                if fails_batch(raw, exc):
                    raise
            else:
                self.linked.update(trial)
                return
        for i in live:
            req = batch[i]
            if self.refused_again(req, i, results):
                continue
            trial = {}
            try:
                with savepoint(raw):
                    _insert_and_index(raw, self._link(raw, req.rows, trial), [] if req.index is None else [req.index])
            except sqlite3.IntegrityError as exc:
                results[i] = (False, plan.seq_taken(req.turn_id, exc))
                self.poison(req)
            else:
                self.linked.update(trial)

    def _starts(self, raw: sqlite3.Connection, reqs: list[Start], start: int, results: Results) -> None:
        """A run of starts: their turns, chats and first events in one
        savepoint; on any failure, start by start."""
        rows = [row for req in reqs for row in req.rows]
        if plan.startable_together(reqs, rows):
            trial: dict[str, Head] = {}

            def together() -> None:
                write_rows(raw, INSERT_TURNS, TURN_ROW, TURN_PARAMS, [req.turn for req in reqs])
                write_rows(raw, UPSERT_CHATS, CHAT_ROW, CHAT_PARAMS, plan.merged_chats(reqs), UPSERT_CHATS_TAIL)
                insert_events(raw, self._link(raw, rows, trial))

            if self._isolated(raw, start, results, together):
                self.linked.update(trial)
                for k in range(len(reqs)):
                    results[start + k] = (True, 1)
                return
        for k, req in enumerate(reqs):
            trial = {}
            if self._isolated(raw, start + k, results, functools.partial(self._start_one, raw, req, trial)):
                self.linked.update(trial)

    def _start_one(self, raw: sqlite3.Connection, req: Start, trial: dict[str, Head]) -> int:
        write_rows(raw, UPSERT_CHATS, CHAT_ROW, CHAT_PARAMS, [{**req.chat, "c_upd": req.chat["c_at"]}], UPSERT_CHATS_TAIL)
        turn_id = req.turn["t_id"]
        try:
            write_rows(raw, INSERT_TURNS, TURN_ROW, TURN_PARAMS, [req.turn])
        except sqlite3.IntegrityError as exc:
            raise plan.turn_exists(turn_id, exc) from exc
        try:
            insert_events(raw, self._link(raw, req.rows, trial))
        except sqlite3.IntegrityError as exc:
            raise plan.seq_taken(turn_id, exc) from exc
        return 1

    def _releases(self, raw: sqlite3.Connection, reqs: list[Release], start: int, results: Results) -> None:
        """A run of releases: one statement; on a failure, one by one."""
        self.forget(reqs)
        if len(reqs) > 1 and self._isolated(raw, start, results, functools.partial(_run, raw, RELEASE_TURNS, release_pairs(reqs))):
            return
        for k, req in enumerate(reqs):
            self._isolated(raw, start + k, results, functools.partial(_run, raw, RELEASE_TURNS, release_pairs([req])))


def _insert_and_index(raw: sqlite3.Connection, rows: list[EventRow], updates: list[dict[str, Any]]) -> None:
    if rows:
        insert_events(raw, rows)
    if updates:
        raw.executemany(UPDATE_INDEX, updates)


def _run(raw: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> None:
    raw.execute(sql, args)


def _scalar(raw: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> Any:
    found = raw.execute(sql, args).fetchone()
    return None if found is None else found[0]


def _execute(raw: sqlite3.Connection, req: Write) -> Any:
    """A :class:`Write`'s statement; ``claim``'s returned token."""
    args = tuple(dumps(a) if isinstance(a, list) else a for a in req.args)
    found = raw.execute(STATEMENTS[req.op], args).fetchall()  # (all: RETURNING rows are stepped)
    return found[0][0] if found else None
