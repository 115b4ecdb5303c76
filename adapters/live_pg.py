"""Cross-process live signals over PostgreSQL LISTEN/NOTIFY.

Several ``turnlog serve`` processes share one database. A notification is only
a wake-up: "turn X has new events" or "please cancel turn X". The log stays the
source of truth, so a subscriber woken on process B re-reads the log after its
cursor, and a lost notification only delays an event (every follower also
re-reads the log when it has been quiet for a second). A cancel request is
repeated until the owner's ``turn.cancelled`` is in the log.

A process does not wake its own subscribers with the event notifications it
sent itself (PostgreSQL delivers them to its LISTEN connection too): they
had those events live from the turn's actor in this process. Waking them
made every follower of every local turn re-read the log after each commit
(at 2,000 streams about one read per delta window, ~11 % of the event loop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

log = logging.getLogger("turnlog.live")

EVENTS = "turnlog_events"
COMMANDS = "turnlog_commands"


def asyncpg_dsn(url: str) -> str:
    """``postgresql+asyncpg://…`` (SQLAlchemy) → ``postgresql://…`` (asyncpg)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class PgSignals:
    """One LISTEN connection and one NOTIFY connection per process."""

    def __init__(
        self,
        url: str,
        *,
        on_events: Callable[[str], None],
        on_cancel: Callable[[str, str], None],
        on_released: Callable[[], None] | None = None,
    ) -> None:
        self.dsn = asyncpg_dsn(url)
        self.on_events = on_events
        self.on_cancel = on_cancel
        # Another process released running turns (its drain): adopt them now.
        self.on_released = on_released
        self._listen: asyncpg.Connection | None = None
        self._notify: asyncpg.Connection | None = None
        #: The server process of our NOTIFY connection: notifications from it are our own.
        self._notify_pid: int | None = None
        self._pending: set[str] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._watchdog: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._connect_listener()
        await self._connect_notify()
        self._watchdog = asyncio.create_task(self._keep_listening(), name="turnlog:pg-listen")

    async def _connect_listener(self) -> None:
        conn = await asyncpg.connect(self.dsn, timeout=5)
        await conn.add_listener(EVENTS, self._event)
        await conn.add_listener(COMMANDS, self._command)
        self._listen = conn

    async def _connect_notify(self, timeout: float = 60) -> None:
        conn = await asyncpg.connect(self.dsn, timeout=timeout)
        self._notify_pid = conn.get_server_pid()
        self._notify = conn

    async def _keep_listening(self) -> None:
        """Reconnect the listener if it drops (followers poll the log meanwhile),
        and the NOTIFY connection (a database restart ends both)."""
        while True:
            await asyncio.sleep(1.0)
            conn = self._listen
            if conn is None or conn.is_closed():
                try:
                    await self._connect_listener()
                    log.info("LISTEN connection restored")
                except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
                    log.warning("LISTEN reconnect failed: %s", exc)
            notify = self._notify
            if notify is None or notify.is_closed():
                try:
                    async with self._lock:
                        await self._connect_notify(timeout=5)
                    log.info("NOTIFY connection restored")
                except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
                    log.warning("NOTIFY reconnect failed: %s", exc)

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        for conn in (self._listen, self._notify):
            if conn is not None and not conn.is_closed():
                await conn.close()

    def _event(self, _conn: Any, pid: int, _channel: str, payload: str) -> None:
        if pid == self._notify_pid:
            return  # ours: this process's subscribers had these events live
        self.on_events(payload)

    def _command(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        kind, _, rest = payload.partition(":")
        if kind == "cancel":
            turn_id, _, by = rest.partition(":")
            self.on_cancel(turn_id, by)
        elif kind == "released" and self.on_released is not None:
            self.on_released()

    def appended(self, turn_id: str) -> None:
        """Tell the other processes that ``turn_id`` has new events (coalesced)."""
        self._pending.add(turn_id)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # gather what the current burst of commits appended
        while self._pending:
            batch, self._pending = self._pending, set()
            try:
                async with self._lock:
                    assert self._notify is not None
                    await self._notify.executemany("SELECT pg_notify($1, $2)", [(EVENTS, t) for t in batch])
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, AssertionError) as exc:
                log.warning("NOTIFY failed (followers will poll): %s", exc)
                return

    async def request_cancel(self, turn_id: str, by: str) -> None:
        async with self._lock:
            assert self._notify is not None
            await self._notify.execute("SELECT pg_notify($1, $2)", COMMANDS, f"cancel:{turn_id}:{by}")

    async def turns_released(self, turn_ids: Sequence[str]) -> None:
        """One notification for a whole drain: the receivers scan for orphans
        (the ids are informative, cut to fit NOTIFY's 8000-byte payload)."""
        async with self._lock:
            assert self._notify is not None
            await self._notify.execute("SELECT pg_notify($1, $2)", COMMANDS, ("released:" + ",".join(turn_ids))[:7000])
