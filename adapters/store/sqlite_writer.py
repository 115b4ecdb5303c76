"""The SQLite group commit at the driver level: the hot writes without SQLAlchemy.

``SqlEventStore`` runs a SQLite group commit in its writer thread. Appends,
turn starts and lease releases (nearly every write of a turn) are written
here, straight on the thread's ``sqlite3`` connection, with the statements
below: a profile of a tiny turn (``python -m bench.turncost commit``) put
~75 % of the writer thread's CPU in SQLAlchemy's execution machinery (the
execution context, compiled-cache lookups, cache keys of the statements with
``.values()``, events, result objects) and ~5 % in the driver. The sqlite3
module keeps each statement prepared (its statement cache), so an
``execute`` here is a bind and a step.

The statements are those SQLAlchemy compiled for ``adapters.store.sql`` (same
columns, same conditions; the starts' and releases' as multi-row forms), so
what is stored is the same. A batch holding only such writes is framed here too (``BEGIN
IMMEDIATE`` ... ``COMMIT``); any other write (claim, renew, chat meta, blobs,
API keys) keeps its SQLAlchemy code and the batch its SQLAlchemy transaction,
inside which these statements run on the same connection.

Savepoints are plain ``SAVEPOINT`` statements. After a failed statement the
transaction may be gone (SQLite rolls it back itself on a full disk or an I/O
error): then the whole batch fails, as a lost connection does.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from adapters.store.common import dumps

#: An event row's columns, in the order of ``adapters.store.common.EventRow``.
EVENT_COLUMNS = ("turn_id", "seq", "type", "at", "data", "hash")

# Many rows per INSERT statement: one statement is atomic (a unique violation
# backs out all its rows, the transaction goes on), so a run of appends needs
# no savepoint. Parameters per statement: at most 32766 since SQLite 3.32,
# 999 before.
ROWS_PER_INSERT = 1000 if sqlite3.sqlite_version_info >= (3, 32, 0) else 199

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

#: Parameters per statement: at most 32766 since SQLite 3.32, 999 before.
MAX_PARAMS = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999


@functools.lru_cache(maxsize=256)
def rows_sql(head: str, row: str, n_rows: int, tail: str = "") -> str:
    """``head`` + ``n_rows`` times ``row`` + ``tail``: one multi-row statement."""
    return head + ", ".join([row] * n_rows) + tail


def release_pairs(params: list[dict[str, Any]]) -> tuple[str]:
    """``RELEASE_TURNS``'s one parameter from releases' ``r_*`` parameters."""
    return (dumps([[p["r_id"], p["r_owner"]] for p in params]),)


def write_rows(raw: sqlite3.Connection, head: str, row: str, names: tuple[str, ...], rows: list[dict[str, Any]], tail: str = "") -> None:
    """``rows`` (dicts of named parameters) as few multi-row statements, each
    at most ``MAX_PARAMS`` parameters (atomic per statement only: call it
    inside a savepoint)."""
    per = max(1, MAX_PARAMS // row.count("?"))
    for k in range(0, len(rows), per):
        chunk = rows[k : k + per]
        raw.execute(rows_sql(head, row, len(chunk), tail), tuple(r[name] for r in chunk for name in names))


@functools.lru_cache(maxsize=128)
def insert_events_sql(n_rows: int) -> str:
    """The INSERT of ``n_rows`` event rows in one statement."""
    one = f"({', '.join('?' * len(EVENT_COLUMNS))})"
    return f"INSERT INTO events ({', '.join(EVENT_COLUMNS)}) VALUES " + ", ".join([one] * n_rows)


def insert_events(raw: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """INSERT ``rows``; atomic if ``len(rows) <= ROWS_PER_INSERT`` (else call
    it inside a savepoint)."""
    step = ROWS_PER_INSERT
    for k in range(0, len(rows), step):
        chunk = rows[k : k + step]
        raw.execute(insert_events_sql(len(chunk)), tuple(v for row in chunk for v in row))


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
