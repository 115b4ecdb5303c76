"""Catch-up reads of a turn's log, shared and in batches.

Every streaming client falls back on the log when its live subscription cannot
serve it (it joined late, lagged, or the loop fell behind its quiet-spell
timer). Under load that is thousands of reads at once: the same turn's
followers at the same position share one read here (one round trip for a
turn's many viewers reconnecting together), and a read returns at most
``BATCH`` events, so a follower far behind gets its durable events batch by
batch, each sent before the next is read, instead of one whole log in memory
per follower. How many reads run at once is the store's business (its read
pool: ``adapters.store.sql``); a read waits there, it never fails for being
queued.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from engine.events import Event
from engine.ports import EventStore

#: Events per catch-up read.
BATCH = 512

_Key = tuple[str, int, int]
# Reads in flight per store: (turn, after, limit) -> the shared read.
_inflight: weakref.WeakKeyDictionary[Any, dict[_Key, asyncio.Task[list[Event]]]] = weakref.WeakKeyDictionary()


async def read_batch(store: EventStore, turn_id: str, after: int, limit: int | None = None) -> list[Event]:
    """Up to ``limit`` (default ``BATCH``) events of ``turn_id`` after seq ``after``, in seq order.

    Concurrent callers asking for the same batch share one store read (the
    result list is shared: callers must not modify it). A caller cancelled
    while waiting does not cancel the read for the others.
    """
    if limit is None:
        limit = BATCH
    try:
        reads = _inflight[store]
    except KeyError:
        reads = _inflight[store] = {}
    except TypeError:  # a store without weak references: no sharing
        return await store.read(turn_id, after=after, limit=limit)
    key = (turn_id, after, limit)
    task = reads.get(key)
    if task is None:
        task = asyncio.ensure_future(store.read(turn_id, after=after, limit=limit))
        reads[key] = task
        task.add_done_callback(lambda t: _done(reads, key, t))
    return await asyncio.shield(task)


def _done(reads: dict[_Key, asyncio.Task[list[Event]]], key: _Key, task: asyncio.Task[list[Event]]) -> None:
    if reads.get(key) is task:
        del reads[key]
    if not task.cancelled():
        task.exception()  # retrieved: every waiter may have been cancelled


def is_full(events: list[Event], limit: int | None = None) -> bool:
    """Whether a batch may have left events behind (read the next one)."""
    return len(events) >= (BATCH if limit is None else limit)


#: Quiet-spell re-reads (a safety net: the live subscription normally has
#: everything) running at once in this process; more are skipped, not queued.
QUIET_READS_AT_ONCE = 8
_quiet_reads = 0


class QuietRead:
    """A slot for one optional re-read: ``async with QuietRead() as ok``;
    ``ok`` False means enough are running, skip this one (try next spell).

    Thousands of followers of turns waiting for a slow model would otherwise
    all queue such a read, and a follower waiting for its read delivers
    nothing meanwhile (bench ``thousands_ws``: up to 18 s)."""

    def __init__(self) -> None:
        self._held = False

    async def __aenter__(self) -> bool:
        global _quiet_reads
        if _quiet_reads >= QUIET_READS_AT_ONCE:
            return False
        _quiet_reads += 1
        self._held = True
        return True

    async def __aexit__(self, *exc: object) -> None:
        global _quiet_reads
        if self._held:
            _quiet_reads -= 1
            self._held = False
