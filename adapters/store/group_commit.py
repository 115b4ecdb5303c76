"""The group commit: many callers' writes, one writer, one transaction per batch.

This module knows no database. Callers :meth:`GroupCommit.submit` requests
(any object with ``future``, ``lazy`` and ``events`` slots: see
:class:`Request`) and await their futures; one writer takes everything queued
(up to ``max_batch``) and hands it to a backend's writer, which writes the
batch in ONE transaction and answers one outcome per request, ``(True,
result)`` or ``(False, exception)``, or raises if the transaction as a whole
failed (then every request of the batch fails with that exception). A future
resolves only after COMMIT returned; a caller cancelled meanwhile does not
withdraw its request.

Two ways to run the writer, one per kind of backend writer:

* :class:`ThreadedGroupCommit`: a sync writer (``sqlite3``) in its own
  thread, which pops the queue itself and hands each outcome to the event
  loop (one ``call_soon_threadsafe``): a loop busy with a burst of turn
  starts never holds the next commit back, only the callers' wake-ups;
* :class:`TaskGroupCommit`: an async writer (asyncpg) as a task on the loop.

What waits (the gather and backpressure): lazy requests (delta windows, which
no caller awaits) wait up to ``gather`` seconds after the previous commit
began, and until the loop has taken the previous commit's outcome, so that a
busy loop's windows share a commit instead of the writer committing them one
by one ahead of the loop. A request someone waits for, or a full batch, ends
the wait at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

log = logging.getLogger("adapters.store.sql")

#: Per request of a batch: ``(True, result)`` or ``(False, exception)``.
Results = list[tuple[bool, Any]]


class Request:
    """What the queue holds; backends' requests extend it."""

    __slots__ = ("future", "lazy")

    #: Events this request makes durable (for the commit's observer).
    events = 0

    def __init__(self) -> None:
        self.future: asyncio.Future[Any] | None = None
        self.lazy = False


_STOP = Request()


class SyncWriter(Protocol):
    def write(self, batch: list[Any]) -> Results: ...
    def close(self) -> None: ...


class AsyncWriter(Protocol):
    def write(self, batch: list[Any]) -> Awaitable[Results]: ...
    def close(self) -> Awaitable[None]: ...


#: Told of every commit on the loop, before the futures resolve: the batch,
#: its results and the seconds it took.
OnCommit = Callable[[list[Any], Results, float], None]


class GroupCommit:
    """The queue and what decides a batch; subclasses run the writer."""

    def __init__(self, *, max_batch: int, gather: float, on_commit: OnCommit) -> None:
        self._max_batch = max_batch
        self._gather = gather
        self._on_commit = on_commit
        self._queue: deque[Request] = deque()
        # Queued requests that are not lazy (the stop included): any ends a wait.
        self._urgent = 0
        self._cond = threading.Condition(threading.Lock())
        self._waiting = False  # the writer waits (on ``_cond`` or ``_waiter``)
        self._holding = False  # ... with lazy requests queued: only urgent news wakes it
        # Commits handed to the loop, and those it took.
        self._posted = 0
        self._settled = 0
        self._began = -math.inf  # time.monotonic() when the last commit began
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def submit(self, request: Request, lazy: bool = False) -> asyncio.Future[Any]:
        """Queue ``request``; its future resolves once it is committed."""
        if self._closed:
            raise RuntimeError("event store is closed")
        if not self._running():
            self._start()
        assert self._loop is not None
        # The writer's loop, not get_running_loop(): on CPython 3.11 that is a
        # getpid() system call, and this runs for every delta window.
        future = request.future = self._loop.create_future()
        request.lazy = lazy
        self._put(request)
        return future

    async def close(self) -> None:
        """Commit everything queued, then stop the writer."""
        if not self._closed:
            self._closed = True
            if self._running():
                self._put(_STOP)
                await self._stopped()

    def _put(self, request: Request) -> None:
        with self._cond:
            queue = self._queue
            queue.append(request)
            if not request.lazy:
                self._urgent += 1
            if self._waiting and (not request.lazy or not self._holding or len(queue) >= self._max_batch):
                self._wake()

    def _hold(self) -> float | None:
        """How long the writer waits before its next batch (``math.inf``: until
        woken), or None: take it now."""
        if not self._queue:
            return math.inf
        if self._urgent or len(self._queue) >= self._max_batch:
            return None
        wait = self._began + self._gather - time.monotonic()
        if wait > 0:
            return wait
        return math.inf if self._settled < self._posted else None

    def _take(self) -> tuple[list[Any], bool]:
        """The next batch, and whether the stop came after it."""
        queue = self._queue
        batch: list[Any] = []
        while queue and len(batch) < self._max_batch:
            request = queue.popleft()
            if not request.lazy:
                self._urgent -= 1
            if request is _STOP:
                return batch, True
            batch.append(request)
        return batch, False

    def _settle(self, batch: list[Any], results: Results, took: float) -> None:
        """On the loop: a commit is durable; resolve its futures."""
        self._taken()
        self._on_commit(batch, results, took)
        for request, (ok, value) in zip(batch, results):
            future = request.future
            if not future.done():  # else the caller was cancelled
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

    def _fail(self, batch: list[Any], exc: BaseException) -> None:
        """On the loop: the transaction failed as a whole (BEGIN, COMMIT, the
        connection): every request of the batch fails with it."""
        self._taken()
        log.error("event store: group commit of %d requests failed", len(batch), exc_info=exc)
        _fail_all(batch, exc)

    def _taken(self) -> None:
        with self._cond:
            self._settled += 1
            if self._holding:
                self._wake()

    def _fail_queued(self, exc: BaseException) -> None:
        with self._cond:
            queued = [r for r in self._queue if r is not _STOP]
            self._queue.clear()
            self._urgent = 0
        _fail_all(queued, exc)

    # What a way of running the writer provides.
    def _running(self) -> bool:
        raise NotImplementedError

    def _start(self) -> None:
        raise NotImplementedError

    def _wake(self) -> None:
        raise NotImplementedError

    async def _stopped(self) -> None:
        raise NotImplementedError


def _fail_all(batch: list[Any], exc: BaseException) -> None:
    for request in batch:
        if request.future is not None and not request.future.done():
            request.future.set_exception(exc)


class ThreadedGroupCommit(GroupCommit):
    """A sync writer in a thread of its own, which takes its next batch as soon
    as it has committed one (the loop only learns the outcomes)."""

    def __init__(self, writer: SyncWriter, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._writer = writer
        self._thread: threading.Thread | None = None
        self._done: asyncio.Future[None] | None = None

    def _running(self) -> bool:
        return self._done is not None and not self._done.done()

    def _start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        self._thread = threading.Thread(target=self._serve, args=(loop, self._done), name="turnlog-writer", daemon=True)
        self._thread.start()

    def _wake(self) -> None:
        self._cond.notify()

    async def _stopped(self) -> None:
        assert self._done is not None
        await asyncio.shield(self._done)
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _serve(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[None]) -> None:
        stop = False
        try:
            while not stop:
                with self._cond:
                    while (hold := self._hold()) is not None:
                        self._waiting, self._holding = True, bool(self._queue)
                        self._cond.wait(None if hold == math.inf else hold)
                    self._waiting = self._holding = False
                    batch, stop = self._take()
                if batch:
                    self._began = time.monotonic()
                    began = time.perf_counter()
                    try:
                        results = self._writer.write(batch)
                    except Exception as exc:
                        self._posted += 1
                        _post(loop, self._fail, batch, exc)
                    else:
                        self._posted += 1
                        _post(loop, self._settle, batch, results, time.perf_counter() - began)
        finally:
            try:
                self._writer.close()
            except Exception:  # pragma: no cover - closing a broken connection
                log.exception("event store: closing the writer's connection failed")
            if not stop:  # pragma: no cover - a bug in this loop: fail what waits
                _post(loop, self._fail_queued, RuntimeError("event store writer stopped"))
            _post(loop, _resolve, done)


class TaskGroupCommit(GroupCommit):
    """An async writer as a task on the event loop."""

    def __init__(self, writer: AsyncWriter, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._writer = writer
        self._task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None

    def _running(self) -> bool:
        return self._task is not None and not self._task.done()

    def _start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        # A context of its own: it serves every turn, so its log lines name none
        # (it may be started from a turn's task, whose context names that turn).
        self._task = loop.create_task(self._serve(), name="turnlog-store-writer", context=contextvars.Context())

    def _wake(self) -> None:
        if self._waiter is not None:
            _resolve(self._waiter)

    async def _stopped(self) -> None:
        assert self._task is not None
        await asyncio.shield(self._task)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        stop = False
        try:
            while not stop:
                while (hold := self._hold()) is not None:
                    await self._wait(loop, hold)
                batch, stop = self._take()
                if batch:
                    await self._commit(batch)
        finally:
            self._fail_queued(RuntimeError("event store writer stopped"))
            await self._writer.close()

    async def _wait(self, loop: asyncio.AbstractEventLoop, hold: float) -> None:
        self._waiting, self._holding = True, bool(self._queue)
        waiter = self._waiter = loop.create_future()
        timer = None if hold == math.inf else loop.call_later(hold, _resolve, waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._waiting = self._holding = False
            self._waiter = None

    async def _commit(self, batch: list[Any]) -> None:
        self._began = time.monotonic()
        began = time.perf_counter()
        self._posted += 1
        try:
            results = await self._writer.write(batch)
        except Exception as exc:
            self._fail(batch, exc)
        except BaseException:
            _fail_all(batch, RuntimeError("event store writer cancelled"))
            raise
        else:
            self._settle(batch, results, time.perf_counter() - began)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _post(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` on the loop, from the writer thread."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # pragma: no cover - the loop is closed: nobody waits
        pass
