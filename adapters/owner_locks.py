"""``engine.ports.OwnerLocks``: each process that runs turns holds a lock named
by its owner token, which the operating system (SQLite: ``flock`` on a file
beside the database) or the server (PostgreSQL: a session-level advisory
lock) frees when the process dies, kill -9 included. Another process, or
this one restarted, then adopts its turns at once instead of waiting for
their leases to run out.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from adapters.live_pg import asyncpg_dsn
from engine.ports import OwnerLocks

log = logging.getLogger("turnlog.supervisor")

__all__ = ["FileOwnerLocks", "PgOwnerLocks", "open_owner_locks"]


def open_owner_locks(url: str) -> OwnerLocks | None:
    """The locks for the database at ``url``; None where there is no place for
    them (an in-memory SQLite database: one process only)."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        return PgOwnerLocks(url)
    if backend == "sqlite" and parsed.database not in (None, "", ":memory:") and not parsed.database.startswith("file:"):
        return FileOwnerLocks(Path(parsed.database))
    return None


class FileOwnerLocks:
    """``DB.owner-TOKEN.lock`` beside the SQLite file ``DB``, ``flock``-ed by its owner.

    A lock is per open file, so a probe from the same process (two services in
    one test process) sees it held too. Flocks are held by the kernel of one
    machine: like SQLite itself, the database is not shared over a network."""

    def __init__(self, database: Path) -> None:
        self._database = database.resolve()
        self._held: dict[str, int] = {}

    def path(self, owner: str) -> Path:
        return self._database.with_name(f"{self._database.name}.owner-{owner}.lock")

    async def hold(self, owner: str) -> None:
        if owner in self._held:
            return
        fd = os.open(self.path(owner), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        self._held[owner] = fd

    async def is_free(self, owner: str) -> bool:
        try:
            fd = os.open(self.path(owner), os.O_RDWR)
        except FileNotFoundError:
            return False  # never held one (or already forgotten): the lease decides
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # frees the probe's lock, if it got it
        return True

    async def forget(self, owner: str) -> None:
        if await self.is_free(owner):
            self.path(owner).unlink(missing_ok=True)

    async def release(self, owner: str) -> None:
        fd = self._held.pop(owner, None)
        if fd is not None:
            self.path(owner).unlink(missing_ok=True)  # while still held: no one probes a half-gone lock
            os.close(fd)


def advisory_key(owner: str) -> int:
    """The advisory lock's 64-bit key for an owner token."""
    return int.from_bytes(hashlib.sha256(b"turnlog owner " + owner.encode()).digest()[:8], "big", signed=True)


class PgOwnerLocks:
    """A session-level advisory lock per owner, held by one connection of its
    own (not the store's pool: advisory locks are reentrant within a session,
    so a pooled connection would find its own lock free)."""

    def __init__(self, url: str) -> None:
        self._dsn = asyncpg_dsn(url)
        self._conn: Any = None  # holds this process's lock
        self._probe: Any = None  # tries other owners' locks (never holds one between calls)

    async def hold(self, owner: str) -> None:
        if self._conn is not None and not self._conn.is_closed():
            return
        conn = await asyncpg.connect(self._dsn, timeout=10)
        try:
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", advisory_key(owner)):
                raise RuntimeError(f"the owner lock of {owner} is held by another session")
        except BaseException:
            await conn.close()
            raise
        if self._conn is not None:
            log.warning("owner %s: its lock connection was lost; lock taken again", owner)
        self._conn = conn

    async def is_free(self, owner: str) -> bool:
        if self._probe is None or self._probe.is_closed():
            self._probe = await asyncpg.connect(self._dsn, timeout=10)
        key = advisory_key(owner)
        got = bool(await self._probe.fetchval("SELECT pg_try_advisory_lock($1)", key))
        if got:
            await self._probe.fetchval("SELECT pg_advisory_unlock($1)", key)
        return got

    async def forget(self, owner: str) -> None:
        """Nothing is left behind: the server dropped the lock with its session."""

    async def release(self, owner: str) -> None:
        for conn in (self._probe, self._conn):
            if conn is not None and not conn.is_closed():
                await conn.close()  # ends the session, and the lock with it
        self._probe = self._conn = None
