"""Which responses were deleted (``DELETE /v1/responses/{id}``, migration 0008).

A deletion is bookkeeping of the Responses API, not a fact about the turn: the
turn's log is append-only and hash-chained and stays as the audit record
(``/v1/turns/{id}`` still shows it to its owner). What the deletion changes is
what the Responses API answers: 404 for the response, its input items, and a
``previous_response_id`` naming it.
"""

from __future__ import annotations

import time

from sqlalchemy import Column, Float, MetaData, Table, Text, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from adapters.store.sqlite import SQLITE_BEGIN

metadata = MetaData()

response_deletions = Table(
    "response_deletions",
    metadata,
    Column("turn_id", Text, primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("deleted_at", Float, nullable=False),
)


class ResponseDeletions:
    def __init__(self, engine: AsyncEngine) -> None:
        self._write = engine.execution_options(**{SQLITE_BEGIN: "BEGIN IMMEDIATE"})
        self._read = engine.execution_options(**{SQLITE_BEGIN: None})

    async def delete(self, turn_id: str, user_id: str) -> bool:
        """Record the deletion; False if it was deleted already."""
        try:
            async with self._write.begin() as conn:
                await conn.execute(response_deletions.insert().values(turn_id=turn_id, user_id=user_id, deleted_at=time.time()))
        except IntegrityError:
            return False
        return True

    async def deleted(self, turn_id: str) -> bool:
        async with self._read.connect() as conn:
            row = (await conn.execute(select(response_deletions.c.turn_id).where(response_deletions.c.turn_id == turn_id))).first()
        return row is not None
