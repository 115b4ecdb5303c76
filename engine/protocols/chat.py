"""OpenAI Chat Completions (``POST /v1/chat/completions``): normalizer and request body.

Chat Completions is the protocol most upstreams speak (OpenAI, vLLM,
llama.cpp, LiteLLM, OpenRouter…): the request carries ``messages``, the
streamed response is SSE ``data:`` chunks whose ``choices[0].delta`` holds
text, reasoning (``reasoning_content`` and its aliases) and tool-call
fragments, ended by ``[DONE]``. Its messages are also the engine's canonical
transcript (``engine.protocols.history``), so its body is the request as
kept, and the other protocols' bodies are derived from it.

This module is everything specific to it:

* :class:`ChatToolCalls` — accumulation of ``delta.tool_calls`` fragments
  as Open WebUI accumulates them, with the two quirks below fixed;
* :class:`ChatNormalizer` — chunks → ``engine.protocols.model_events``;
* :func:`request_body` — the wire body.

Deliberate differences from Open WebUI 0.12.4 in tool-call accumulation (the
ones shared with the other protocols, glued JSON and ids, are in
``engine.protocols.common``):

* A tool-call fragment without ``index`` is never dropped. It continues
  the call with the same provider ``id`` if it has an id (a new call if no
  call has that id), else the last call, else it starts a new call. A later
  fragment that has an ``index`` but no id and no name continues a call that
  was started without an index.
* At an index that already has a named call, a fragment carrying both a
  non-empty ``id`` different from that call's and a non-empty ``name`` starts
  a new call (it is the first fragment of another call). A different id
  *without* a name is treated as a continuation (Open WebUI's "later id
  ignored": a fragment without a name cannot be the first fragment of a
  usable call). A later non-empty name never replaces an existing name.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from engine.fold.accumulator import parse_chat_chunk
from engine.json_types import JsonObject
from engine.ports import ModelRequest, RawChunk, RawRun, RawWarning, ResolvedModel
from engine.protocols.common import (
    CallIds,
    IdFactory,
    arguments_text,
    error_message,
    int_index,
    named_calls,
    nonempty_str,
    outgoing_messages,
    split_tool_calls,
)
from engine.protocols.model_events import (
    Finished,
    ModelEvent,
    ReasoningDelta,
    StreamWarning,
    TextDelta,
    TextRun,
    ToolArgumentsDelta,
    ToolCall,
    ToolCallStarted,
    UsageReport,
)
from engine.protocols.shapes import json_list

__all__ = ["ChatNormalizer", "ChatToolCalls", "request_body"]


def request_body(resolved: ResolvedModel, request: ModelRequest) -> JsonObject:
    """The Chat Completions body: the request's params, the upstream model, the
    transcript (with the assistant prefill) and ``stream``."""
    return {**request.params, "model": resolved.upstream_model, "messages": json_list(outgoing_messages(request)), "stream": True}


# --------------------------------------------------------------------------
# Tool-call fragments
# --------------------------------------------------------------------------


@dataclass(slots=True)
class _ChatCall:
    call_id: str
    provider_id: str | None
    index: int | None
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    announced: bool = False


class ChatToolCalls:
    """Accumulates Chat Completions ``delta.tool_calls`` fragments.

    Fragments are keyed by ``index``; ``id``/``type``/``function.name`` come in
    the first fragment of a call, ``function.arguments`` arrive as string
    fragments that are concatenated (non-string arguments are serialized with
    :func:`arguments_text`). Parallel calls interleave by index. See the module
    docstring for the rules on fragments without an index and on a second call at one index.
    """

    def __init__(self, id_factory: IdFactory, *, reserved_ids: Iterable[str] = ()) -> None:
        self._id_factory = id_factory
        self._ids = CallIds(id_factory, reserved_ids)
        self._calls: list[_ChatCall] = []
        self._by_index: dict[int, _ChatCall] = {}
        self._result: list[ToolCall] | None = None
        self.warnings: list[StreamWarning] = []  # the calls ``finish`` dropped (no name)

    def __len__(self) -> int:
        return len(self._calls)

    def feed(self, fragments: Iterable[object]) -> list[ToolCallStarted | ToolArgumentsDelta]:
        """Add the fragments of one chunk. Returns a :class:`ToolCallStarted`
        for each call that got its name in this chunk, and a
        :class:`ToolArgumentsDelta` for each argument fragment of a named call
        (those that came before its name, joined, right after its start)."""
        if self._result is not None:
            raise RuntimeError("ChatToolCalls is finished; no more fragments are accepted")
        started: list[ToolCallStarted | ToolArgumentsDelta] = []
        for fragment in fragments:
            if not isinstance(fragment, dict):
                continue
            function = fragment.get("function")
            if not isinstance(function, dict):
                function = {}
            name = nonempty_str(function.get("name"))
            call = self._route(fragment, name)
            if name and not call.name:
                call.name = name  # an existing name is never replaced
            text = arguments_text(function.get("arguments"))
            if text:
                call.arguments.append(text)
            if call.name and not call.announced:
                call.announced = True
                started.append(ToolCallStarted(call_id=call.call_id, name=call.name))
                text = "".join(call.arguments)
            if text and call.announced:
                started.append(ToolArgumentsDelta(call.call_id, text))
        return started

    def finish(self) -> list[ToolCall]:
        """The complete calls in order of appearance, glued JSON split, without
        the ones that never got a name (``warnings`` says which). Calling it
        again returns the same list (no new ids are drawn)."""
        if self._result is None:
            calls = [
                ToolCall(
                    call_id=c.call_id,
                    name=c.name,
                    arguments="".join(c.arguments),
                    item_id=c.call_id,
                    provider_id=self._ids.replaced(c.provider_id, c.call_id),
                )
                for c in self._calls
            ]
            self._result, self.warnings = named_calls(split_tool_calls(calls, self._id_factory))
        return list(self._result)

    # -- routing -----------------------------------------------------------

    def _route(self, fragment: Mapping[str, object], name: str | None) -> _ChatCall:
        index = int_index(fragment.get("index"))
        provider_id = nonempty_str(fragment.get("id"))
        if index is not None:
            call = self._by_index.get(index)
            if call is None:
                last = self._calls[-1] if self._calls else None
                if last is not None and last.index is None and provider_id is None and name is None:
                    # The call began with fragments that had no index.
                    last.index = index
                    self._by_index[index] = last
                    return last
                return self._new(provider_id, index)
            if provider_id and name and call.name and provider_id != call.provider_id:
                return self._new(provider_id, index)  # another call at the same index
            return call
        # No index.
        if provider_id:
            for call in self._calls:
                if call.provider_id == provider_id:
                    return call
            return self._new(provider_id, None)
        if self._calls:
            return self._calls[-1]
        return self._new(None, None)

    def _new(self, provider_id: str | None, index: int | None) -> _ChatCall:
        call = _ChatCall(call_id=self._ids.take(provider_id), provider_id=provider_id, index=index)
        self._calls.append(call)
        if index is not None:
            self._by_index[index] = call
        return call


# --------------------------------------------------------------------------
# Chunks → model events
# --------------------------------------------------------------------------

_PLAIN_DELTA_KEYS: Final[frozenset[str]] = frozenset({"content", "role", "refusal"})


def whole_in_read(events: list[ModelEvent]) -> list[ModelEvent]:
    """The events of the read that finished the response, less the live
    progress of calls that also started in it: they come whole with the
    finish, and announcing them would show nothing sooner (and cost a commit
    per tool round)."""
    whole = {e.call_id for e in events if type(e) is ToolCallStarted}
    if not whole:
        return events
    return [e for e in events if not (isinstance(e, ToolCallStarted | ToolArgumentsDelta) and e.call_id in whole)]


class ChatNormalizer:
    """Chat Completions chunks (already JSON-parsed; ``"[DONE]"`` and other
    non-dicts are ignored) → model events.

    ``feed`` returns, in this order: ``ReasoningDelta``, ``TextDelta``,
    ``ToolCallStarted`` (once per call, when it gets its name),
    ``UsageReport`` (the provider's usage dict as sent, llama.cpp ``timings``
    merged in by :func:`parse_chat_chunk`), ``StreamWarning`` (an ``error``
    object in a chunk without choices: Open WebUI keeps streaming). ``finish``
    returns the tool calls (accumulated, then split) and one ``Finished`` with
    the provider's last ``finish_reason`` verbatim (``None`` if it sent none;
    ``"tool_calls"`` even when no call arrived — the engine treats an empty
    batch as the end), the first response id and the last usage reported.
    """

    def __init__(self, id_factory: IdFactory, *, reserved_ids: Iterable[str] = ()) -> None:
        self._calls = ChatToolCalls(id_factory, reserved_ids=reserved_ids)
        self.finish_reason: str | None = None
        self.response_id: str | None = None
        self.usage: JsonObject | None = None
        self._finished = False

    def feed(self, chunk: object) -> list[ModelEvent]:
        if self._finished:
            raise RuntimeError("ChatNormalizer is finished; no more chunks are accepted")
        if type(chunk) is not dict:
            return []
        # Fast path for the common chunk: one choice whose delta carries only
        # text (the per-token hot path; everything else takes the full parse).
        choices = chunk.get("choices")
        if type(choices) is list and len(choices) == 1 and not chunk.get("usage") and not chunk.get("timings"):
            choice = choices[0]
            if type(choice) is dict and not choice.get("finish_reason"):
                delta = choice.get("delta")
                if type(delta) is dict and delta.keys() <= _PLAIN_DELTA_KEYS:
                    content = delta.get("content")
                    if type(content) is str or content is None:
                        if self.response_id is None and type(chunk.get("id")) is str:
                            self.response_id = chunk["id"]
                        return [TextDelta(content)] if content else []
        parts = parse_chat_chunk(chunk)
        events: list[ModelEvent] = []
        if parts.reasoning:
            events.append(ReasoningDelta(parts.reasoning))
        if parts.content:
            events.append(TextDelta(parts.content))
        if parts.tool_calls:
            events.extend(self._calls.feed(parts.tool_calls))
        if parts.usage:
            self.usage = copy.deepcopy(parts.usage)
            events.append(UsageReport(copy.deepcopy(parts.usage)))
        if parts.error:
            events.append(StreamWarning(error_message(parts.error), raw=copy.deepcopy(parts.error)))
        if parts.finish_reason:
            self.finish_reason = parts.finish_reason
        if parts.response_id and self.response_id is None:
            self.response_id = parts.response_id
        return events

    def feed_read(self, raws: list[RawChunk | RawWarning | RawRun], *, runs: bool = False) -> list[ModelEvent]:
        """``feed`` for every payload of one network read, in order (a payload
        that was not JSON becomes a ``StreamWarning`` in its place).

        The per-token chunk (one choice, text only) is taken inline: a fast
        upstream brings a thousand per read, and per chunk a call, a list and
        an extend cost as much as the test itself. With ``runs``, consecutive
        ones come as one ``TextRun`` (a list of their texts), not a
        ``TextDelta`` each. Anything else goes to ``_feed_other``. In the read
        that finishes the response, calls that also started in it come whole
        only (:func:`whole_in_read`).
        """
        events: list[ModelEvent] = []
        append = events.append
        plain = _PLAIN_DELTA_KEYS
        run: list[str] = []
        add = run.append
        if self._finished:
            raise RuntimeError("ChatNormalizer is finished; no more chunks are accepted")
        response_id = self.response_id
        was_open = self.finish_reason is None
        for raw in raws:
            if isinstance(raw, RawChunk):
                chunk = raw.data
                # ``feed``'s fast path, its tests ordered for the text chunk:
                # anything else (a role-only chunk too) takes ``feed``.
                if type(chunk) is dict:
                    choices = chunk.get("choices")
                    if type(choices) is list and len(choices) == 1:
                        choice = choices[0]
                        if type(choice) is dict:
                            delta = choice.get("delta")
                            if type(delta) is dict:
                                content = delta.get("content")
                                if (
                                    type(content) is str
                                    and content
                                    and (len(delta) == 1 or delta.keys() <= plain)
                                    and not choice.get("finish_reason")
                                    and not chunk.get("usage")
                                    and not chunk.get("timings")
                                ):
                                    if response_id is None and type(chunk.get("id")) is str:
                                        response_id = self.response_id = chunk["id"]
                                    if runs:
                                        add(content)
                                    else:
                                        append(TextDelta(content))
                                    continue
            run = self._feed_other(raw, events, run, runs)
            add = run.append
            response_id = self.response_id
        if run:
            append(TextRun(run))
        if was_open and self.finish_reason is not None:
            return whole_in_read(events)
        return events

    def _feed_other(self, raw: RawChunk | RawWarning | RawRun, events: list[ModelEvent], run: list[str], runs: bool) -> list[str]:
        """``feed_read`` for a payload off its per-token path: a run of chunks
        (plain ones join the open text run), a warning or any other chunk (each
        closes the open text run first). Returns the text run left open."""
        if isinstance(raw, RawRun) and self._run_is_plain(raw.template):
            if self.response_id is None and type(raw.template.get("id")) is str:
                self.response_id = raw.template["id"]
            if runs:
                run.extend(raw.texts)
            else:
                events.extend([TextDelta(text) for text in raw.texts])
            return run
        if run:
            events.append(TextRun(run))
            run = []
        if isinstance(raw, RawChunk):
            events.extend(self.feed(raw.data))
        elif isinstance(raw, RawRun):
            for chunk in _expand(raw):
                events.extend(self.feed(chunk))
        else:
            events.append(StreamWarning(raw.message, raw.raw))
        return run

    @staticmethod
    def _run_is_plain(template: Mapping[str, object]) -> bool:
        """Whether each chunk of a run (``template`` with a text-only delta)
        takes ``feed``'s per-token path: tested once per run, not per chunk."""
        choices = template.get("choices")
        if type(choices) is not list or len(choices) != 1:
            return False
        choice = choices[0]
        return type(choice) is dict and not choice.get("finish_reason") and not template.get("usage") and not template.get("timings")

    def finish(self) -> list[ModelEvent]:
        if self._finished:
            return []
        self._finished = True
        events: list[ModelEvent] = list(self._calls.finish())
        events.extend(self._calls.warnings)
        events.append(Finished(reason=self.finish_reason, response_id=self.response_id, usage=self.usage))
        return events


def _expand(run: RawRun) -> list[JsonObject]:
    """A run's chunks, each its own dict (a template ``feed`` does not take as plain)."""
    out: list[JsonObject] = []
    for text in run.texts:
        chunk = copy.deepcopy(run.template)
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if isinstance(choice, dict):  # always, by the run's construction
            choice["delta"] = {"content": text}
        out.append(chunk)
    return out
