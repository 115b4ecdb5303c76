"""Usage and quotas: what each user and key spent, and whether a turn may start.

The sums live in ``usage_rollup``, a projection of the log: database triggers
(migration ``0013_usage``) add a turn's usage there in the commit that
records its end, so a read here never scans events. :func:`roll_up` is the
same rule for the in-memory store. Days are UTC (``YYYY-MM-DD``).

Quotas (:class:`Quotas`), off unless configured:

* requests per minute, for everyone together and per key: a fixed window per
  UTC minute, counted when a turn is about to start. On PostgreSQL the count
  is one ``INSERT … ON CONFLICT DO UPDATE … RETURNING`` on a counter row: the
  row lock orders concurrent starts of every process, so exactly the
  requests past the limit are refused. SQLite serves one process, whose
  counter is kept in memory (a write on a second SQLite connection would
  wait for the store's writer).
* tokens per day: a turn is refused once the day's sum is already at or
  over the limit. Turns running when the limit is reached still finish, so
  the day's sum may end over it by what those turns spend. Starts that
  come while the sum is being read share that read (a burst reads it once).

A refused request still counts toward its minute.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from adapters.store.schema import key_quotas, usage_rollup
from adapters.store.sqlite import SQLITE_BEGIN

if TYPE_CHECKING:
    pass

TERMINAL = frozenset({"completed", "cancelled", "failed"})
#: The counter of every request together; a key's is ``key:`` + its hash.
GLOBAL_SCOPE = "*"
COUNTS = ("turns", "input_tokens", "output_tokens", "tool_calls", "estimated_turns")


@dataclass(frozen=True)
class Limits:
    """Quotas; None: no limit."""

    requests_per_minute: int | None = None
    tokens_per_day: int | None = None


@dataclass
class UsageRow:
    """The sums of one (day, model)."""

    day: str
    model: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))


def day_of(at: float) -> str:
    """The UTC day of an epoch time, as the rollup names it."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d")


class UsageStore(Protocol):
    async def rows(self, user_id: str, since: str | None, until: str | None) -> list[UsageRow]:
        """The user's sums per day and model, days ``since..until`` (inclusive)."""
        ...

    async def tokens_on(self, day: str, key_hash: str | None) -> int:
        """Input plus output tokens of ``day``: everyone's, or one key's."""
        ...

    async def count_request(self, scope: str, minute: int) -> int:
        """Count one request of ``scope`` in ``minute``; its count so far, this one included."""
        ...

    async def key_limits(self, key_hash: str) -> Limits: ...

    async def set_key_limits(self, key_hash: str, limits: Limits) -> None: ...


class LocalCounters:
    """Requests per minute counted in this process (one SQLite process, the
    memory store): no await between reading and bumping a count."""

    def __init__(self) -> None:
        self._counts: dict[str, tuple[int, int]] = {}

    def bump(self, scope: str, minute: int) -> int:
        last, count = self._counts.get(scope, (minute, 0))
        count = count + 1 if last >= minute else 1
        self._counts[scope] = (max(last, minute), count)
        return count


_ASYNC_COMMIT = text("SET LOCAL synchronous_commit = off")


class SqlUsage:
    """:class:`UsageStore` over the store's database."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._read = engine.execution_options(**{SQLITE_BEGIN: None})
        self._write = engine.execution_options(**{SQLITE_BEGIN: "BEGIN IMMEDIATE"})
        self._postgres = engine.dialect.name == "postgresql"
        self._local = None if self._postgres else LocalCounters()

    async def rows(self, user_id: str, since: str | None, until: str | None) -> list[UsageRow]:
        r = usage_rollup.c
        stmt = select(r.day, r.model, *(func.sum(getattr(r, c)).label(c) for c in COUNTS)).where(r.user_id == user_id)
        if since is not None:
            stmt = stmt.where(r.day >= since)
        if until is not None:
            stmt = stmt.where(r.day <= until)
        stmt = stmt.group_by(r.day, r.model).order_by(r.day, r.model)
        async with self._read.connect() as conn:
            found = (await conn.execute(stmt)).all()
        return [UsageRow(row.day, row.model, {c: int(getattr(row, c) or 0) for c in COUNTS}) for row in found]

    async def tokens_on(self, day: str, key_hash: str | None) -> int:
        r = usage_rollup.c
        stmt = select(func.coalesce(func.sum(r.input_tokens + r.output_tokens), 0)).where(r.day == day)
        if key_hash is not None:
            stmt = stmt.where(r.key_hash == key_hash)
        async with self._read.connect() as conn:
            return int((await conn.execute(stmt)).scalar_one())

    async def count_request(self, scope: str, minute: int) -> int:
        if self._local is not None:
            return self._local.bump(scope, minute)
        # One statement, its own transaction: the row lock serializes every
        # process's count; a new minute restarts it (a late clock's request
        # counts in the newer minute).
        stmt = text(
            "INSERT INTO rate_counters AS c (scope, minute, count) VALUES (:scope, :minute, 1) "
            "ON CONFLICT (scope) DO UPDATE SET "
            "count = CASE WHEN EXCLUDED.minute > c.minute THEN 1 ELSE c.count + 1 END, "
            "minute = GREATEST(c.minute, EXCLUDED.minute) RETURNING count"
        )
        async with self._write.begin() as conn:
            # A count lost in a crash costs nothing: no wait for the WAL flush
            # (the row lock still orders the counts).
            await conn.execute(_ASYNC_COMMIT)
            return int((await conn.execute(stmt, {"scope": scope, "minute": minute})).scalar_one())

    async def key_limits(self, key_hash: str) -> Limits:
        q = key_quotas.c
        async with self._read.connect() as conn:
            row = (await conn.execute(select(q.requests_per_minute, q.tokens_per_day).where(q.key_hash == key_hash))).first()
        return Limits() if row is None else Limits(row.requests_per_minute, row.tokens_per_day)

    async def set_key_limits(self, key_hash: str, limits: Limits) -> None:
        async with self._write.begin() as conn:
            await conn.execute(key_quotas.delete().where(key_quotas.c.key_hash == key_hash))
            await conn.execute(
                key_quotas.insert().values(key_hash=key_hash, requests_per_minute=limits.requests_per_minute, tokens_per_day=limits.tokens_per_day)
            )


class QuotaExceeded(Exception):
    """A turn over a quota: refused before anything is recorded."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class Quotas:
    """Admission of a turn's start: the service's quotas and the caller's key's."""

    def __init__(self, usage: UsageStore, service: Limits, clock: Any = time.time) -> None:
        self.usage = usage
        self.service = service
        self.clock = clock
        # A key's quotas are written before the key is handed out and never
        # change: read once per process.
        self._keys: dict[str, Limits] = {}
        # The day's tokens being read: the starts that ask meanwhile share
        # the read (a burst of starts reads once, not once each).
        self._spent: dict[tuple[str, str | None], asyncio.Future[int]] = {}

    async def admit(self, key_hash: str | None) -> None:
        """Raise :class:`QuotaExceeded` if the turn may not start now; count it if it may."""
        key = await self._key_limits(key_hash) if key_hash is not None else Limits()
        if self.service == Limits() and key == Limits():
            return  # quotas off: nothing read, nothing counted
        now = self.clock()
        # Tokens first: they are only read, so a refusal for them counts no request.
        await self._tokens(now, self.service.tokens_per_day, None, "the service's")
        if key_hash is not None:
            await self._tokens(now, key.tokens_per_day, key_hash, "this key's")
        minute = int(now // 60)
        await self._requests(now, minute, self.service.requests_per_minute, GLOBAL_SCOPE, "the service's")
        if key_hash is not None:
            await self._requests(now, minute, key.requests_per_minute, f"key:{key_hash}", "this key's")

    async def _key_limits(self, key_hash: str) -> Limits:
        limits = self._keys.get(key_hash)
        if limits is None:
            if len(self._keys) >= 100_000:
                self._keys.clear()
            limits = self._keys[key_hash] = await self.usage.key_limits(key_hash)
        return limits

    async def _spent_on(self, day: str, key_hash: str | None) -> int:
        key = (day, key_hash)
        reading = self._spent.get(key)
        if reading is None:
            reading = self._spent[key] = asyncio.ensure_future(self.usage.tokens_on(day, key_hash))
            reading.add_done_callback(lambda _: self._spent.pop(key, None))
        return await asyncio.shield(reading)

    async def _tokens(self, now: float, limit: int | None, key_hash: str | None, whose: str) -> None:
        if limit is None:
            return
        used = await self._spent_on(day_of(now), key_hash)
        if used >= limit:
            midnight = (math.floor(now / 86400) + 1) * 86400
            raise QuotaExceeded(f"{whose} quota of {limit} tokens per day is spent ({used} used today, UTC)", max(1, math.ceil(midnight - now)))

    async def _requests(self, now: float, minute: int, limit: int | None, scope: str, whose: str) -> None:
        if limit is None:
            return
        count = await self.usage.count_request(scope, minute)
        if count > limit:
            raise QuotaExceeded(f"{whose} quota of {limit} requests per minute is reached", max(1, math.ceil((minute + 1) * 60 - now)))
