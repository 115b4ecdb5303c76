"""A turn's forks, from the ``turn_forks`` index (migration 0012, kept by a
trigger on each fork's ``turn.forked`` event) or, on the memory store, from
the logs' first events: the same answer either way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column, Integer, MetaData, Table, Text, select

from adapters.store.common import loads
from adapters.store.memory import MemoryEventStore
from adapters.store.schema import turns

#: The tables the migration makes besides ``schema.metadata``'s.
TABLES = frozenset({"turn_forks"})

_metadata = MetaData()
turn_forks = Table(
    "turn_forks",
    _metadata,
    Column("turn_id", Text, primary_key=True),
    Column("parent_turn_id", Text, nullable=False),
    Column("at", Integer, nullable=False),
)


@dataclass(frozen=True)
class Fork:
    turn_id: str
    at: int
    model: str
    status: str
    created_at: float

    def public(self) -> dict[str, Any]:
        return {"turn_id": self.turn_id, "at": self.at, "model": self.model, "status": self.status, "created_at": self.created_at}


async def forks_of(store: Any, parent_turn_id: str, user_id: str) -> list[Fork]:
    """The user's forks of that turn, oldest first."""
    if isinstance(store, MemoryEventStore):
        return _memory_forks(store, parent_turn_id, user_id)
    stmt = (
        select(turn_forks.c.turn_id, turn_forks.c.at, turns.c.model, turns.c.status, turns.c.created_at)
        .join(turns, turns.c.id == turn_forks.c.turn_id)
        .where(turn_forks.c.parent_turn_id == parent_turn_id, turns.c.user_id == user_id)
        .order_by(turns.c.created_at, turn_forks.c.turn_id)
    )
    return [Fork(r.turn_id, int(r.at), r.model, r.status, r.created_at) for r in await store._fetch(stmt)]


def _memory_forks(store: MemoryEventStore, parent_turn_id: str, user_id: str) -> list[Fork]:
    db = store.database
    found = []
    for turn_id, row in db.turns.items():
        log = db.events.get(turn_id)
        if row.user_id != user_id or log is None or 1 not in log.rows:
            continue
        type_, _, data, _ = log.rows[1]
        forked = loads(data) if type_ == "turn.forked" else {}
        if forked.get("parent_turn_id") == parent_turn_id:
            found.append(Fork(turn_id, int(forked["at"]), row.model, row.status, row.created_at))
    return sorted(found, key=lambda f: (f.created_at, f.turn_id))
