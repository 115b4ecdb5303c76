"""Pipes as a model provider: a ``ChatProvider`` whose models are Python code.

Each pipe of ``TURNLOG_PIPES_DIR`` is a model (``ID``, or ``ID.SUB_ID`` for
each entry of its ``pipes()``). A call runs the pipe as Open WebUI does and
turns what it gives into Chat Completions chunks, which go through the same
normalizer and log as any upstream's: so cancel, replay and ``verify`` work
as for any model, and ``verify`` never runs the pipe again.

What a pipe gives, as Open WebUI reads it:

- a string: the answer;
- a dict: a whole ``chat.completion`` (its message, tool calls, usage), or one
  chunk;
- a sync or async generator (or iterator) of items, each a string (text; a
  ``data: {...}`` line is a chunk, ``data: [DONE]`` is skipped), a dict (a
  chunk; one with no ``choices`` is one of Open WebUI's UI events, which
  have no place here, and is dropped) or a pydantic model (its dump).

A sync pipe, and each step of a sync generator, runs in a thread of the
call's own, never on the event loop; a cancelled turn stops it between two
items (the item being computed finishes, then the generator is closed in
that same thread, so its ``finally`` runs). A pipe that raises fails the
turn with ``pipe_error`` (a 502 that names the pipe and the exception),
never a 500. A crash resumes a pipe's turn by running the pipe again: it
cannot continue a partial answer (``resume = "restart"``).

``__event_emitter__`` takes Open WebUI's events: a ``message`` (or
``chat:message:delta``) event's ``content`` is text of the answer, in order
with what the pipe yields; other events (status, citations...) are dropped.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import logging
import queue
import threading
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import aclosing
from typing import Any

from adapters.filters.loader import describe
from adapters.pipes.loader import LoadedPipe
from engine.ports import ModelApi, RawChunk, RawRun, RawWarning, ResumeMode, UpstreamError
from engine.run.log_context import current_chat, current_turn, current_user

log = logging.getLogger("turnlog.pipes")

OWNED_BY = "pipe"
_DONE = object()
#: Open WebUI's event types whose ``content`` is text of the answer.
MESSAGE_EVENTS = ("message", "chat:message:delta")


class PipeFailed(Exception):
    """A pipe raised, or gave something that is no answer."""


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": f"pipe-{model}",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _completion_chunks(model: str, result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A dict a pipe returned, as chunks: a ``chat.completion``, or one chunk."""
    choices = result.get("choices")
    if not isinstance(choices, list):
        raise PipeFailed(f"returned a dict that is no chat completion (keys: {', '.join(sorted(map(str, result))) or 'none'})")
    first = choices[0] if choices and isinstance(choices[0], dict) else {}
    message = first.get("message")
    if not isinstance(message, dict):
        return [dict(result)]  # a chunk
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls) if isinstance(call, dict)]
    out = [_chunk(model, delta), _chunk(model, {}, str(first.get("finish_reason") or ("tool_calls" if "tool_calls" in delta else "stop")))]
    if isinstance(result.get("usage"), dict):
        out.append({**_chunk(model, {}), "choices": [], "usage": result["usage"]})
    return out


def _item(model: str, item: Any) -> RawChunk | RawWarning | None:
    """One item a pipe's generator gave (Open WebUI's ``process_line``)."""
    if hasattr(item, "model_dump") and callable(item.model_dump):
        item = item.model_dump()
    if isinstance(item, bytes):
        item = item.decode("utf-8", errors="replace")
    if isinstance(item, str) and item.startswith("data:"):
        payload = item[5:].strip()
        if not payload or payload == "[DONE]":
            return None
        try:
            item = json.loads(payload)
        except ValueError:
            return RawWarning("a pipe's data: line is not JSON", payload)
    if isinstance(item, dict):
        return RawChunk(dict(item)) if "choices" in item or "usage" in item else None
    if item is None:
        return None
    text = item if isinstance(item, str) else str(item)
    return RawChunk(_chunk(model, {"content": text})) if text else None


class _Worker:
    """One daemon thread running the calls given to it, in order.

    Not a ``ThreadPoolExecutor``: the interpreter joins those at exit, and a
    pipe stuck for good in its code would then keep the service from ever
    exiting."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put((future, fn, args, kwargs))
        return future

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args, kwargs = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # the pipe's, handed to the awaiting call
                future.set_exception(exc)

    def shutdown(self) -> None:
        """The thread ends once the calls already given have run."""
        if self._thread is not None:
            self._jobs.put(None)


class _Stepper:
    """A sync iterator stepped in the call's thread, one item per await.

    One thread, so the generator is never closed while a step runs: ``close``
    queues the generator's ``close`` after the step in flight."""

    def __init__(self, pool: _Worker, iterator: Iterator[Any]) -> None:
        self._pool = pool
        self._iterator = iterator

    async def next(self) -> Any:
        return await asyncio.wrap_future(self._pool.submit(next, self._iterator, _DONE))

    def close(self) -> None:
        close = getattr(self._iterator, "close", None)
        if callable(close):
            self._pool.submit(close)


class _Run:
    """One call of a pipe."""

    def __init__(self, pipe: LoadedPipe, body: dict[str, Any]) -> None:
        self.pipe = pipe
        self.model = str(body.get("model") or pipe.pipe_id)
        self.body = copy.deepcopy(body)  # the pipe may change its body: never the engine's
        self.pending: list[str] = []  # text emitted through __event_emitter__, not yet given
        self.finished = False
        self.pool = _Worker(f"turnlog-pipe-{pipe.pipe_id}")

    async def emit(self, event: Any) -> None:
        if isinstance(event, dict) and event.get("type") in MESSAGE_EVENTS:
            data = event.get("data")
            content = data.get("content") if isinstance(data, dict) else None
            if isinstance(content, str) and content:
                self.pending.append(content)

    async def ask(self, event: Any) -> None:
        """``__event_call__``: there is no UI to answer; None, as a dismissed dialog."""
        return None

    def kwargs(self) -> dict[str, Any]:
        user_id, chat_id, turn_id = current_user.get(), current_chat.get(), current_turn.get()
        user: dict[str, Any] = {"id": user_id or "", "email": "", "name": user_id or "", "role": "user"}
        if self.pipe.user_valves is not None:
            valves = self.pipe.user_valves
            user["valves"] = valves.model_copy() if hasattr(valves, "model_copy") else valves
        model = {"id": self.model, "name": self.pipe.name, "owned_by": OWNED_BY}
        given: dict[str, Any] = {
            "__user__": user,
            "__id__": self.pipe.pipe_id,
            "__metadata__": {"user_id": user_id, "chat_id": chat_id, "message_id": turn_id, "model": model},
            "__messages__": self.body.get("messages") or [],
            "__model__": model,
            "__chat_id__": chat_id,
            "__message_id__": turn_id,
            "__files__": [],
            "__event_emitter__": self.emit,
            "__event_call__": self.ask,
        }
        return {"body": self.body, **{name: given.get(name) for name in self.pipe.reserved}}

    async def _call(self) -> Any:
        fn, kwargs = self.pipe.fn, self.kwargs()
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            result = fn(**kwargs)
        else:  # sync code may block (requests, time.sleep): never on the event loop
            result = await asyncio.wrap_future(self.pool.submit(fn, **kwargs))
        if inspect.isawaitable(result):
            result = await result
        return result

    def _given(self, raw: RawChunk | RawWarning | None) -> list[RawChunk | RawWarning]:
        """What to send for one item: the emitted text first, then the item."""
        out: list[RawChunk | RawWarning] = [RawChunk(_chunk(self.model, {"content": text})) for text in self.pending]
        self.pending.clear()
        if raw is not None:
            if isinstance(raw, RawChunk):
                choices = raw.data.get("choices")
                if isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") for c in choices):
                    self.finished = True
            out.append(raw)
        return out

    async def _items(self, result: Any) -> AsyncGenerator[RawChunk | RawWarning | None, None]:
        if isinstance(result, dict):
            for chunk in _completion_chunks(self.model, result):
                yield RawChunk(chunk)
        elif isinstance(result, (str, bytes)) or result is None:
            yield _item(self.model, result)
        elif hasattr(result, "__aiter__"):
            iterator = result.__aiter__()
            try:
                async for item in iterator:
                    yield _item(self.model, item)
            finally:
                aclose = getattr(iterator, "aclose", None)
                if callable(aclose):
                    await aclose()  # a cancelled turn runs the pipe's own finally
        elif isinstance(result, Iterator) or hasattr(result, "__iter__"):
            stepper = _Stepper(self.pool, iter(result))
            try:
                while (item := await stepper.next()) is not _DONE:
                    yield _item(self.model, item)
            finally:
                stepper.close()
        else:
            raise PipeFailed(f"returned {type(result).__name__}, not a string, a dict or a generator")

    async def chunks(self) -> AsyncGenerator[list[RawChunk | RawWarning], None]:
        try:
            result = await self._call()
            async with aclosing(self._items(result)) as items:
                async for raw in items:
                    given = self._given(raw)
                    if given:
                        yield given
            tail = self._given(None)
            if not self.finished:
                tail.append(RawChunk(_chunk(self.model, {}, "stop")))
            yield tail
        except Exception as exc:  # from the pipe's code, or what it gave
            log.warning("pipe %s failed: %s", self.pipe.pipe_id, describe(exc))
            raise UpstreamError(f"pipe {self.pipe.pipe_id} failed: {describe(exc)}", "pipe_error") from exc
        finally:
            self.pool.shutdown()


class PipeProvider:
    """``ChatProvider`` serving the pipes of one folder."""

    api: ModelApi = "chat"
    #: A pipe cannot go on from a partial answer: a resumed turn runs it again.
    resume: ResumeMode = "restart"
    #: Served in this process: its listing says nothing about whether an upstream is up.
    local = True

    def __init__(self, pipes: Mapping[str, LoadedPipe], folder: str = "") -> None:
        self.pipes = dict(pipes)
        self.base_url = f"pipes in {folder}" if folder else "pipes"

    def __repr__(self) -> str:
        return f"PipeProvider({sorted(self.pipes)})"

    async def _sub_pipes(self, pipe: LoadedPipe) -> list[dict[str, Any]] | None:
        subs = getattr(pipe.instance, "pipes", None)
        if subs is None:
            return None
        if callable(subs):
            subs = subs()
            if inspect.isawaitable(subs):
                subs = await subs
        if not isinstance(subs, list):
            raise PipeFailed(f"pipes() returned {type(subs).__name__}, not a list")
        return [s for s in subs if isinstance(s, dict) and s.get("id") is not None]

    async def list_models(self) -> list[dict[str, Any]]:
        """Each pipe's models; a pipe whose ``pipes()`` raises is left out (and logged)."""
        out: list[dict[str, Any]] = []
        for pipe in self.pipes.values():
            try:
                subs = await self._sub_pipes(pipe)
            except Exception as exc:
                log.warning("pipe %s: pipes() failed: %s", pipe.pipe_id, describe(exc))
                continue
            entries = [(pipe.pipe_id, pipe.name)] if subs is None else [(f"{pipe.pipe_id}.{s['id']}", f"{pipe.name}{s.get('name') or ''}") for s in subs]
            out += [{"id": model_id, "object": "model", "created": 0, "owned_by": OWNED_BY, "name": name} for model_id, name in entries]
        return out

    async def stream_batches(self, body: dict[str, Any]) -> AsyncGenerator[list[RawChunk | RawWarning], None]:
        model = str(body.get("model") or "")
        pipe = self.pipes.get(model.split(".", 1)[0])
        if pipe is None:
            raise UpstreamError(f"no pipe serves the model {model!r}", "model_not_found", 404)
        async with aclosing(_Run(pipe, body).chunks()) as batches:
            async for batch in batches:
                yield batch

    def stream_runs(self, body: dict[str, Any]) -> AsyncGenerator[list[RawChunk | RawWarning | RawRun], None]:
        """``stream_batches``: a pipe's chunks are objects already, no runs to find."""
        return self.stream_batches(body)  # type: ignore[return-value]

    async def close(self) -> None:
        """Nothing to release (a pipe's own resources are its own)."""


__all__ = ["OWNED_BY", "PipeProvider"]
