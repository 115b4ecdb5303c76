"""What a run of one kind in a group commit does, whatever the driver.

The writer has three drivers for the same hot writes (SQLAlchemy inside a
transaction, the raw ``sqlite3`` connection in the writer thread, the asyncpg
connection): the statements differ, the decisions must not. Those decisions
live here, as pure functions of the batch, so each driver only executes them:
which appends still hold their lease, whether a run may be written in one go,
and the one chat row a run of starts leaves behind.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import Any

from adapters.store.common import after_failure, stale_token
from engine.ports import ConcurrencyError

Results = list[tuple[bool, Any]]


def fenced_turns(batch: Sequence[Any], start: int, end: int) -> set[str]:
    """The turns of ``batch[start:end]`` whose appends present a fencing token."""
    return {batch[i].turn_id for i in range(start, end) if batch[i].fencing is not None}


def live_appends(batch: Sequence[Any], start: int, end: int, current: dict[str, int], poisoned: Container[tuple[str, Any]], results: Results) -> list[int]:
    """The appends of ``batch[start:end]`` that may be written: a stale token
    (``current``: each fenced turn's token in the database) or one whose
    earlier append failed gets its refusal in ``results`` instead."""
    live: list[int] = []
    for i in range(start, end):
        req = batch[i]
        if req.fencing is not None and current.get(req.turn_id) != req.fencing:
            results[i] = (False, stale_token(req.turn_id, req.fencing, current.get(req.turn_id)))
        elif (req.turn_id, req.fencing) in poisoned:
            results[i] = (False, after_failure(req.turn_id, req.fencing))
        else:
            live.append(i)
    return live


def distinct_seqs(rows: Iterable[Sequence[Any]]) -> bool:
    """No two rows share a ``(turn_id, seq)``: else some request must fail,
    and the run is written one request at a time to find which."""
    rows = list(rows)
    return len({(row[0], row[1]) for row in rows}) == len(rows)


def startable_together(reqs: Sequence[Any], rows: Sequence[Sequence[Any]]) -> bool:
    """A run of starts may be written in one go: no turn id nor event seq twice."""
    return len({req.turn["t_id"] for req in reqs}) == len(reqs) and distinct_seqs(rows)


def merged_chats(reqs: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per chat, as the starts one after another leave it: the first
    start creates it, the latest time is its ``updated_at`` (``c_upd``)."""
    chats: dict[str, dict[str, Any]] = {}
    for req in reqs:
        chat = req.chat
        have = chats.get(chat["c_id"])
        if have is None:
            chats[chat["c_id"]] = {**chat, "c_upd": chat["c_at"]}
        elif chat["c_at"] > have["c_upd"]:
            have["c_upd"] = chat["c_at"]
    return list(chats.values())


def seq_taken(turn_id: str, cause: BaseException) -> ConcurrencyError:
    """The refusal of an append whose event seq another writer took."""
    error = ConcurrencyError(f"turn {turn_id}: an event's seq is already taken")
    error.__cause__ = cause
    return error
