"""The chat projection: a conversation is the fold of its turns, in order."""

from __future__ import annotations

from typing import Any

from engine.protocols.convert import convert_output_to_messages, for_model
from engine.ports import EventStore, TurnRecord
from engine.fold.turn_view import TurnView, fold


def assistant_message(view: TurnView) -> dict[str, Any] | None:
    """The assistant message a finished (or stopped) turn leaves in its chat."""
    if not view.output and not view.content:
        return None
    return {
        "role": "assistant",
        "content": view.content,
        "output": view.output,
        "turn_id": view.id,
        "status": view.status,
    }


async def chat_turn_views(store: EventStore, chat_id: str, *, before: float | None = None) -> list[TurnView]:
    """The chat's turns, oldest first, each folded from its log."""
    records: list[TurnRecord] = await store.list_turns(chat_id=chat_id, limit=10_000)
    records.sort(key=lambda r: (r.created_at, r.id))
    views = []
    for record in records:
        if before is not None and record.created_at >= before:
            continue
        views.append(fold(record.id, await store.read(record.id)))
    return views


def history_messages(views: list[TurnView]) -> list[dict[str, Any]]:
    """Upstream-ready history: each turn's new messages and what its output says.

    Tool rounds are replayed as assistant ``tool_calls`` and ``tool`` messages.
    Calls left to the client (the turn ended with ``finish_reason: tool_calls``)
    keep their assistant message without a result: the client's next request
    brings the ``tool`` messages that answer them. Failed turns with no output
    contribute only their user messages.
    """
    out: list[dict[str, Any]] = []
    for view in views:
        out.extend(view.new_messages)
        client_ids = {c["call_id"] for c in view.client_calls}
        items = list(view.output)
        placeholders = [
            {"type": "function_call_output", "call_id": cid, "output": "", "status": "completed"} for cid in client_ids
        ]
        messages = convert_output_to_messages(for_model(items) + placeholders, raw=True, flatten_tool_images=True)
        out.extend(m for m in messages if not (m.get("role") == "tool" and m.get("tool_call_id") in client_ids))
    return out


def chat_messages(views: list[TurnView]) -> list[dict[str, Any]]:
    """The chat as ``GET /v1/chats/{id}`` shows it."""
    out: list[dict[str, Any]] = []
    for view in views:
        out.extend(view.new_messages)
        message = assistant_message(view)
        if message is not None:
            out.append(message)
    return out
