"""The built-in demo model (``turnlog serve --demo``): a scripted upstream in-process.

A newcomer should be able to try streaming, cancelling, reconnecting, a server
tool and crash-resume without an API key or a network. This provider is a
``ChatProvider`` like the HTTP transports, so everything after it (the
normalizer, the log, group commit, followers) is the real path; only the words
come from a script instead of a model:

* the answer is a pure function of the messages, so a resumed turn, a
  reconnect or a replay can be checked by eye;
* chunks are paced (``chunk_delay`` seconds apart) so there is time to cancel
  or kill the server halfway;
* an assistant prefill at the end of the messages (what a resumed turn sends)
  is continued, not repeated: the remaining chunks of the same script;
* when the request offers tools and the last message is the user's, it calls
  the first tool (required arguments filled with placeholders); after a tool
  result it answers with that result. The ``clock`` demo tool
  (``adapters/demo_tools/clock.py``) is offered by ``tool_ids: ["clock"]``;
* a task prompt (search queries, title, tags, follow-ups, tool selection) is
  answered at once, unpaced, with the JSON it asks for
  (``adapters.providers.demo_tasks``): the turn waits for those answers.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from adapters.providers.demo_tasks import placeholder as _placeholder
from adapters.providers.demo_tasks import task_answer
from adapters.providers.demo_tasks import text as _text
from engine.ports import ModelApi, RawChunk, RawRun, RawWarning

__all__ = ["DEMO_MODEL", "DemoProvider", "DemoReply", "plan_reply"]

DEMO_MODEL = "demo"
MAX_COUNT = 10_000
_COUNT = re.compile(r"\bcount\b(?:\s+\w+){0,2}?\s+to\s+(\d+)", re.IGNORECASE)
_WORD = re.compile(r"\S+\s*")

INTRO = (
    "Hello from turnlog's demo model. You said: \u201c{said}\u201d. "
    "This answer is scripted: no key and no network, the same words every time, "
    "one word per chunk so that you can watch it stream. While it runs you can "
    "cancel it, reconnect to it with Last-Event-ID, or stop the server halfway "
    "and start it again to watch the turn resume where its log ends. "
    'Ask me to count to 300 for a longer answer, or pass tool_ids ["clock"] '
    "to see a server tool run."
)


@dataclass(frozen=True)
class DemoReply:
    """What the script answers: text chunks, or one tool call; ``instant``:
    unpaced (a task's answer)."""

    chunks: list[str] = field(default_factory=list)
    tool_call: dict[str, Any] | None = None
    instant: bool = False


def _tool_call(tool: dict[str, Any], said: str, n: int) -> dict[str, Any] | None:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        return None
    params: dict[str, Any] = fn["parameters"] if isinstance(fn.get("parameters"), dict) else {}
    props: dict[str, Any] = params["properties"] if isinstance(params.get("properties"), dict) else {}
    args = {name: _placeholder(props.get(name), said) for name in params.get("required") or [] if isinstance(name, str)}
    return {"id": f"call_demo_{n}", "name": fn["name"], "arguments": json.dumps(args)}


def plan_reply(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> DemoReply:
    """The scripted answer to ``messages`` (a trailing plain assistant message is
    a prefill to continue: the full answer is planned, ``DemoProvider`` skips
    what the prefill already holds)."""
    answer = task_answer(messages, tools)
    if answer is not None:
        return DemoReply(chunks=[answer], instant=True)
    msgs = list(messages)
    if msgs and msgs[-1].get("role") == "assistant" and not msgs[-1].get("tool_calls"):
        msgs.pop()
    last = msgs[-1] if msgs else {}
    role = last.get("role")
    rounds = sum(1 for m in msgs if m.get("role") == "assistant" and m.get("tool_calls"))
    if role == "tool":
        names = {
            c.get("id"): (c.get("function") or {}).get("name")
            for m in msgs
            if m.get("role") == "assistant"
            for c in m.get("tool_calls") or []
            if isinstance(c, dict)
        }
        name = names.get(last.get("tool_call_id")) or "tool"
        # The same words for a server tool and a client's: the script only sees
        # the tool message its request carries.
        text = f"The {name} tool answered: {_text(last.get('content')).strip()}. I read that result from the tool message in my request."
        return DemoReply(chunks=_WORD.findall(text))
    said = " ".join(_text(last.get("content")).split()) if role == "user" else ""
    if tools and role == "user":
        for tool in tools:
            call = _tool_call(tool, said, rounds + 1)
            if call is not None:
                return DemoReply(tool_call=call)
    found = _COUNT.search(said)
    if found:
        n = max(1, min(int(found.group(1)), MAX_COUNT))
        return DemoReply(chunks=[f"{i}, " for i in range(1, n)] + [f"{n}."])
    return DemoReply(chunks=_WORD.findall(INTRO.format(said=said or "nothing")))


class DemoProvider:
    """``ChatProvider`` serving the one model ``demo`` from ``plan_reply``."""

    api: ModelApi = "chat"
    base_url = "built-in demo model"

    def __init__(self, *, chunk_delay: float = 0.1) -> None:
        self.chunk_delay = chunk_delay

    def __repr__(self) -> str:
        return f"DemoProvider(chunk_delay={self.chunk_delay})"

    def _head(self, n: int) -> dict[str, Any]:
        return {"id": f"chatcmpl-demo-{n}", "object": "chat.completion.chunk", "created": 0, "model": DEMO_MODEL}

    def _chunks(self, body: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
        """The whole response as Chat Completions chunks (prefill already
        skipped), and whether they go unpaced."""
        messages = list(body.get("messages") or [])
        reply = plan_reply(messages, body.get("tools"))
        last = messages[-1] if messages else {}
        prefill = _text(last.get("content")) if last.get("role") == "assistant" and not last.get("tool_calls") else ""
        head = self._head(sum(1 for m in messages if m.get("role") == "assistant"))
        out: list[dict[str, Any]] = []
        if reply.tool_call is not None:
            call = reply.tool_call
            delta = {
                "role": "assistant",
                "tool_calls": [{"index": 0, "id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}],
            }
            out.append({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
            finish, produced = "tool_calls", 1
        else:
            skip = len(prefill) if "".join(reply.chunks).startswith(prefill) else 0
            produced = 0
            for piece in reply.chunks:
                if skip >= len(piece):
                    skip -= len(piece)
                    continue
                piece, skip = piece[skip:], 0
                out.append({**head, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
                produced += 1
            finish = "stop"
        out.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        prompt = sum(len(_text(m.get("content")).split()) for m in messages)
        out.append({**head, "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": produced, "total_tokens": prompt + produced}})
        return out, reply.instant

    async def stream_batches(self, body: dict[str, Any]) -> AsyncGenerator[list[RawChunk | RawWarning], None]:
        """One chunk per batch, ``chunk_delay`` apart (the first at once)."""
        chunks, instant = self._chunks(body)
        for i, chunk in enumerate(chunks):
            if i and not instant and self.chunk_delay > 0 and chunk["choices"] and chunk["choices"][0]["delta"]:
                await asyncio.sleep(self.chunk_delay)
            yield [RawChunk(chunk)]

    def stream_runs(self, body: dict[str, Any]) -> AsyncGenerator[list[RawChunk | RawWarning | RawRun], None]:
        """``stream_batches``: one chunk per read, no runs to find."""
        return self.stream_batches(body)  # type: ignore[return-value]

    async def complete_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """The same script as one ``chat.completion`` (no pacing)."""
        chunks, _ = self._chunks(body)
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        finish = "stop"
        for chunk in chunks:
            for choice in chunk["choices"]:
                delta = choice["delta"]
                message["content"] += delta.get("content") or ""
                if delta.get("tool_calls"):
                    message["tool_calls"] = [{k: c[k] for k in ("id", "type", "function")} for c in delta["tool_calls"]]
                finish = choice["finish_reason"] or finish
        head = {k: v for k, v in chunks[-1].items() if k not in ("choices", "usage", "object")}
        return {**head, "object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": chunks[-1]["usage"]}

    async def list_models(self) -> list[dict[str, Any]]:
        return [{"id": DEMO_MODEL, "object": "model", "created": 0, "owned_by": "turnlog-demo"}]

    async def close(self) -> None:
        """Nothing to release (the app closes every provider)."""
