"""Resuming turns at once when the store comes back (README "Faults").

A running turn whose write fails (PostgreSQL restarted or unreachable, a
SQLite disk full) stops writing at its last durable window: what is not
durable must not be followed by later events. Left alone, it would wait for
its lease to run out (``lease_seconds``) before anyone records it
``interrupted`` and resumes it. Instead its process retries, from the moment
the actor stops: give the lease up and adopt the turn again
(``Supervisor.recover``), every ``RETRY_FIRST`` seconds at first and at most
every ``RETRY_MAX`` seconds while the store keeps failing, so that the turn
resumes within about ``RETRY_MAX`` of the store answering again.

Never twice: the adoption claims the turn under a new fencing token, which
the store checks on every append, and the stopped actor writes nothing more
(its token is poisoned in the store after its failed write, and it has
ended before it is handed here).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

log = logging.getLogger("turnlog.supervisor")

RETRY_FIRST = 0.1
RETRY_MAX = 1.0


class Recovers(Protocol):
    draining: bool

    async def recover(self, turn_id: str) -> None: ...


class StoreRecovery:
    """The turns of one supervisor waiting for the store to answer again."""

    def __init__(self, supervisor: Recovers) -> None:
        self._supervisor = supervisor
        self._pending: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    @property
    def pending(self) -> frozenset[str]:
        return frozenset(self._pending)

    def add(self, turn_id: str) -> None:
        self._pending.add(turn_id)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="turnlog:store-recovery")

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        delay = RETRY_FIRST
        while self._pending and not self._supervisor.draining:
            for turn_id in sorted(self._pending):
                try:
                    await self._supervisor.recover(turn_id)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # The store still fails: the others would too (each
                    # costs a connect timeout while it is unreachable).
                    log.info("turn %s: the store still fails (%s); retrying in %g s", turn_id, exc, delay)
                    break
                self._pending.discard(turn_id)
                log.info("turn %s: the store answers again; resumed at once", turn_id)
            if self._pending:
                await asyncio.sleep(delay)
                delay = min(RETRY_MAX, delay * 2)
