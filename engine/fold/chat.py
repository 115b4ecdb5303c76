"""The chat projection: a conversation is the fold of its turns, in order."""

from __future__ import annotations

from engine.context.history import Answer, Entry, History, expand
from engine.events import TurnForked, data_of
from engine.fold.output_items import call_id_of
from engine.fold.turn_view import TurnView, fold
from engine.json_types import JsonObject
from engine.ports import EventStore, TurnRecord
from engine.protocols.history import convert_output_to_messages, distinct_call_ids, for_model


def assistant_message(view: TurnView) -> JsonObject | None:
    """The assistant message a finished (or stopped) turn leaves in its chat."""
    if not view.output and not view.content:
        return None
    return {
        "role": "assistant",
        "content": view.content,
        "output": [*view.output],
        "turn_id": view.id,
        "status": view.status,
    }


#: How many forks of forks a chat's inherited history is followed through.
_MAX_FORK_DEPTH = 64


async def chat_turn_views(store: EventStore, chat_id: str, *, before: float | None = None, _depth: int = 0) -> list[TurnView]:
    """The chat's turns, oldest first, each folded from its log.

    A chat that a fork started (its first turn's log begins with
    ``turn.forked``) holds first what the forked turn had as its history: the
    turns of that turn's chat before it (and so on, for a fork of a fork).
    The fork's copied events carry the forked turn's own messages; with the
    turns before it, a later turn of the fork's chat sees the conversation
    the forked turn saw."""
    records: list[TurnRecord] = await store.list_turns(chat_id=chat_id, limit=10_000)
    records.sort(key=lambda r: (r.created_at, r.id))
    views = []
    for record in records:
        if before is not None and record.created_at >= before:
            continue
        views.append(fold(record.id, await store.read(record.id)))
    if records and _depth < _MAX_FORK_DEPTH:
        if views and views[0].id == records[0].id:
            forked_from = views[0].parent_turn_id
        else:  # the chat's first turn is after ``before``: its first event says
            first = await store.read(records[0].id, limit=1)
            forked_from = data_of(first[0], TurnForked).parent_turn_id if first and first[0].type == "turn.forked" else None
        if forked_from is not None:
            parent = await store.get_turn(str(forked_from))
            if parent is not None:
                inherited = await chat_turn_views(store, parent.chat_id, before=parent.created_at, _depth=_depth + 1)
                views = [*inherited, *views]
    return views


def answer_of(view: TurnView, reasoning_format: str | None = None) -> Answer | None:
    """What a turn's output says, as upstream messages, with what a client may keep of it.

    Tool rounds are replayed as assistant ``tool_calls`` and ``tool`` messages.
    Calls left to the client (the turn ended with ``finish_reason: tool_calls``)
    keep their assistant message without a result: the client's next request
    brings the ``tool`` messages that answer them. A turn with no output (failed
    early) has no answer. ``reasoning_format``: as ``convert_output_to_messages``
    takes it (``"responses"`` for a Responses API upstream, which takes its own
    reasoning items back; Open WebUI drops them).
    """
    if not view.output and not view.content:
        return None
    client_ids = {call_id_of(c) for c in view.client_calls}
    placeholders: list[JsonObject] = [{"type": "function_call_output", "call_id": cid, "output": "", "status": "completed"} for cid in client_ids]
    messages = convert_output_to_messages(
        for_model(distinct_call_ids(list(view.output))) + placeholders, raw=True, flatten_tool_images=True, reasoning_format=reasoning_format
    )
    kept = [m for m in messages if not (m.get("role") == "tool" and m.get("tool_call_id") in client_ids)]
    return Answer.of(view.id, kept, view.content) if kept else None


def _since_restart(views: list[TurnView]) -> list[TurnView]:
    """The turns from the last one that replaced the history (``"history": "client"``)."""
    start = max((i for i, view in enumerate(views) if view.history_reset), default=0)
    return views[start:]


def _refs(view: TurnView) -> dict[int, str]:
    refs: dict[int, str] = {}
    for ref in view.turn_refs:
        index = ref.get("index") if isinstance(ref, dict) else None
        if isinstance(index, int | float | str):
            refs[int(index)] = str(ref["turn_id"])
    return refs


def stored_history(views: list[TurnView], *, reasoning_format: str | None = None) -> History:
    """The chat's history as turns: each turn's new messages (a client's copy of
    an earlier answer standing for that answer) and its own answer."""
    answers = {view.id: answer for view in views if (answer := answer_of(view, reasoning_format)) is not None}
    entries: list[Entry] = []
    for view in _since_restart(views):
        refs = _refs(view)
        files_at = _files_message(view)
        for index, message in enumerate(view.new_messages):
            referenced = answers.get(refs.get(index, ""))
            if referenced is None and index == files_at:
                # The files that turn's request attached belong to its user
                # message (the assembly lists them for the model's file tools).
                files = view.request.get("files")
                message = {**message, "files": list(files) if isinstance(files, list) else []}
            entries.append(referenced if referenced is not None else message)
        own = answers.get(view.id)
        if own is not None:
            entries.append(own)
    return History(entries=tuple(entries), answers=tuple(answers.values()))


def _files_message(view: TurnView) -> int | None:
    """The index of a turn's last user message in its new messages, if its
    request attached files (paired by role, not by position in the chat)."""
    if not view.request.get("files"):
        return None
    return next((i for i in range(len(view.new_messages) - 1, -1, -1) if view.new_messages[i].get("role") == "user"), None)


def history_messages(views: list[TurnView]) -> list[JsonObject]:
    """Upstream-ready history (failed turns with no output contribute only their new messages)."""
    return expand(stored_history(views).entries)


def chat_messages(views: list[TurnView]) -> list[JsonObject]:
    """The chat as ``GET /v1/chats/{id}`` shows it: the conversation the model
    sees, from where the history last restarted."""
    by_id = {view.id: view for view in views}
    out: list[JsonObject] = []
    for view in _since_restart(views):
        refs = _refs(view)
        for index, message in enumerate(view.new_messages):
            referenced = by_id.get(refs.get(index, ""))
            shown = assistant_message(referenced) if referenced is not None else None
            out.append(shown if shown is not None else message)
        own = assistant_message(view)
        if own is not None:
            out.append(own)
    return out
