"""Context assembly (the inlet): from the client's request to the upstream request.

Pure functions. What they produce is recorded as ``assembly.completed``, so a
replay or a resume never re-assembles differently from what the model saw.
Later features (memory, web search, RAG, tools) add steps here, each recording
its result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from engine.context.messages import _decode_custom_params, add_or_update_system_message, add_or_update_user_message

# Request fields that are turnlog extensions, never forwarded upstream.
EXTENSION_FIELDS = frozenset(
    {
        "chat_id",
        "features",
        "files",
        "tool_ids",
        "params",
        "direct_tools",
        "background_tasks",
        "metadata",
        "session_id",
        "id",
    }
)
# Fields turnlog decides itself for the upstream call.
CONTROLLED_FIELDS = frozenset({"model", "messages", "stream", "stream_options"})
# Keys of ``params`` that steer turnlog and are not model parameters (behaviour spec §4.1).
TURNLOG_PARAMS = frozenset(
    {
        "stream_response",
        "stream_delta_chunk_size",
        "function_calling",
        "reasoning_tags",
        "compact_token_threshold",
        "system",
        "note_id",
        "tool_approval_mode",
        "model_controls",
        "max_tool_call_iterations",
        "custom_params",
    }
)


@dataclass(frozen=True)
class ModelProfile:
    """Per-model settings the operator configured."""

    system: str | None = None
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Assembled:
    messages: list[dict[str, Any]]
    params: dict[str, Any]
    history_len: int
    new_messages: list[dict[str, Any]]


def _comparable(message: dict[str, Any]) -> tuple[str, str]:
    content = message.get("content")
    if not isinstance(content, str):
        content = json.dumps(content, sort_keys=True, default=str)
    return (str(message.get("role")), content or "")


def reconcile_history(history: list[dict[str, Any]], incoming: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Join the chat's stored history with the request's messages.

    A client may send only the new messages (the chat keeps the rest) or, like any
    OpenAI client, the full history again. If the request starts with the stored
    history (system messages aside), it is taken as it is; otherwise the request
    is appended to the history. Returns the messages and how many came from history.
    """
    if not history:
        return list(incoming), 0
    body = [m for m in incoming if m.get("role") != "system"]
    stored = [m for m in history if m.get("role") != "system"]
    if len(body) >= len(stored) and all(_comparable(a) == _comparable(b) for a, b in zip(stored, body)):
        return list(incoming), 0
    systems = [m for m in incoming if m.get("role") == "system"]
    rest = [m for m in incoming if m.get("role") != "system"]
    return [*systems, *stored, *rest], len(stored)


def upstream_params(request: dict[str, Any], profile: ModelProfile) -> dict[str, Any]:
    """Model parameters for the upstream call: profile params < request ``params`` <
    top-level request fields (the body wins, as in Open WebUI's apply_params)."""
    merged: dict[str, Any] = dict(profile.params)
    params = request.get("params") or {}
    if isinstance(params, dict):
        merged.update({k: v for k, v in params.items() if v is not None and k not in TURNLOG_PARAMS})
        merged.update(_decode_custom_params(params.get("custom_params")))
    for key, value in request.items():
        if key in EXTENSION_FIELDS or key in CONTROLLED_FIELDS:
            continue
        merged[key] = value
    return merged


def with_system_prompt(messages: list[dict[str, Any]], system: str | None) -> list[dict[str, Any]]:
    """Prepend the model's system prompt to the system message wherever it is
    (not only at index 0: quirk Q24), or insert one at the front."""
    if not system:
        return messages
    return add_or_update_system_message(system, list(messages), append=False)


CODE_INTERPRETER_PROMPT = """You can run code. To do so, write it inside a block like:
<code_interpreter type="code" lang="python">
print("hello")
</code_interpreter>
Then stop and wait: the block is run and its output is given back to you before you continue.
Use it when running code helps answer precisely; print what you need to see."""


def legacy_code_interpreter(request: dict[str, Any]) -> bool:
    """Legacy (prompt-based) function calling with the code interpreter feature on."""
    params = request.get("params") if isinstance(request.get("params"), dict) else {}
    features = request.get("features") if isinstance(request.get("features"), dict) else {}
    return bool(params and params.get("function_calling") == "default" and features and features.get("code_interpreter"))


def _append_to_last_user(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    return add_or_update_user_message(text, list(messages), append=True)


def assemble(request: dict[str, Any], history: list[dict[str, Any]], profile: ModelProfile) -> Assembled:
    incoming = list(request.get("messages") or [])
    messages, history_len = reconcile_history(history, incoming)
    body = [m for m in incoming if m.get("role") != "system"]
    # Appended to the history: all of the body is new. Sent in full: what follows
    # the stored history is new.
    new_messages = body if history_len else body[len([m for m in history if m.get("role") != "system"]) :]
    params = request.get("params") if isinstance(request.get("params"), dict) else {}
    system = params.get("system") if params and params.get("system") else profile.system
    messages = with_system_prompt(messages, system)
    if legacy_code_interpreter(request):
        # Legacy mode: the instructions go with the user's message (behaviour spec §3.15).
        messages = _append_to_last_user(messages, CODE_INTERPRETER_PROMPT)
    return Assembled(
        messages=messages,
        params=upstream_params(request, profile),
        history_len=history_len,
        new_messages=new_messages,
    )


def chat_messages_of_turn(new_messages: list[dict[str, Any]], assistant: dict[str, Any] | None) -> list[dict[str, Any]]:
    """What one turn contributes to its chat's history."""
    out = list(new_messages)
    if assistant is not None:
        out.append(assistant)
    return out
