"""Context assembly (the inlet): from the client's request to the upstream request.

Pure functions. What they produce is recorded as ``assembly.completed``, so a
replay or a resume never re-assembles differently from what the model saw.
Later features (memory, web search, RAG, tools) add steps here, each recording
its result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from engine.context.extensions import EXTENSION_FIELDS, TURNLOG_PARAMS
from engine.context.history import History, expand, reconcile, recorded_new
from engine.context.messages import _decode_custom_params, add_or_update_system_message, add_or_update_user_message
from engine.json_types import JsonObject, JsonValue
from engine.protocols.shapes import Message, mapping_of, objects_of

# Fields turnlog decides itself for the upstream call.
CONTROLLED_FIELDS = frozenset({"model", "messages", "stream", "stream_options"})


@dataclass(frozen=True)
class ModelProfile:
    """Per-model settings the operator configured."""

    system: str | None = None
    params: JsonObject = field(default_factory=dict)
    function_calling: Literal["native", "default"] | None = None
    capabilities: JsonObject = field(default_factory=dict)
    knowledge: tuple[str, ...] = ()


@dataclass(frozen=True)
class Assembled:
    messages: list[Message]
    params: JsonObject
    history_len: int
    new_messages: list[Message]
    history_reset: bool = False
    turn_refs: list[JsonObject] = field(default_factory=list)


def upstream_params(request: Mapping[str, JsonValue], profile: ModelProfile) -> JsonObject:
    """Model parameters for the upstream call: profile params < request ``params`` <
    top-level request fields (the body wins, as in Open WebUI's apply_params)."""
    merged: JsonObject = dict(profile.params)
    params = request.get("params") or {}
    if isinstance(params, dict):
        merged.update({k: v for k, v in params.items() if v is not None and k not in TURNLOG_PARAMS})
        merged.update(_decode_custom_params(params.get("custom_params")))
    for key, value in request.items():
        if key in EXTENSION_FIELDS or key in CONTROLLED_FIELDS:
            continue
        merged[key] = value
    return merged


def params_for_round(params: JsonObject, iteration: int) -> JsonObject:
    """The model parameters of the call in tool round ``iteration`` (0: the
    turn's first call). A forcing ``tool_choice`` (``"required"``, a named
    tool) applies to the first call only, as the OpenAI Agents SDK resets it:
    forced on every round, the model could never answer and the loop would run
    to its cap. Later rounds leave it out, which is ``auto`` wherever tools are
    sent (OpenAI's default) and which servers that refuse an explicit streamed
    ``auto`` (llama-cpp-python's) accept; an ``allowed_tools`` restriction is
    kept with mode ``auto``."""
    if iteration == 0 or "tool_choice" not in params:
        return params
    choice = params["tool_choice"]
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        relaxed = _allowed_tools_auto(choice)
        return params if relaxed is None else {**params, "tool_choice": relaxed}
    if choice == "required" or isinstance(choice, dict):  # a named function (Chat or Responses shape) or custom tool
        return {k: v for k, v in params.items() if k != "tool_choice"}
    return params


def _allowed_tools_auto(choice: JsonObject) -> JsonObject | None:
    """An ``allowed_tools`` choice with mode ``auto`` (Chat nests it under
    ``allowed_tools``, Responses does not); None when it does not require."""
    nested = choice.get("allowed_tools")
    if isinstance(nested, dict):
        return {**choice, "allowed_tools": {**nested, "mode": "auto"}} if nested.get("mode") == "required" else None
    return {**choice, "mode": "auto"} if choice.get("mode") == "required" else None


def with_system_prompt(messages: list[Message], system: str | None) -> list[Message]:
    """Prepend the model's system prompt to the system message wherever it is
    (not only at index 0, where Open WebUI looks), or insert one at the front."""
    if not system:
        return messages
    return add_or_update_system_message(system, list(messages), append=False)


CODE_INTERPRETER_PROMPT = """You can run code. To do so, write it inside a block like:
<code_interpreter type="code" lang="python">
print("hello")
</code_interpreter>
Then stop and wait: the block is run and its output is given back to you before you continue.
Use it when running code helps answer precisely; print what you need to see."""


#: ``params.function_calling`` values: ``"legacy"`` is Open WebUI 0.12's name
#: for prompt-based function calling, which 0.8 called ``"default"``.
FUNCTION_CALLING = ("native", "default", "legacy")


def requested_mode(request: Mapping[str, JsonValue]) -> Literal["native", "default"] | None:
    """The function-calling mode the request's ``params`` choose (None: the
    model's, else native); ``"legacy"`` is prompt mode, ``"default"``."""
    params = request.get("params")
    chosen = params.get("function_calling") if isinstance(params, dict) else None
    if chosen in ("default", "legacy"):
        return "default"
    return "native" if chosen == "native" else None


def legacy_code_interpreter(request: Mapping[str, JsonValue], *, legacy_name: bool = True) -> bool:
    """Legacy (prompt-based) function calling with the code interpreter feature
    on. ``legacy_name=False``: ``"legacy"`` is not prompt mode (how logs
    written before it was read fold)."""
    features = mapping_of(request.get("features"))
    params = request.get("params")
    named = params.get("function_calling") if isinstance(params, dict) else None
    prompt = requested_mode(request) == "default" if legacy_name else named == "default"
    return bool(prompt and features and features.get("code_interpreter"))


def _append_to_last_user(messages: list[Message], text: str) -> list[Message]:
    return add_or_update_user_message(text, list(messages), append=True)


@dataclass(frozen=True)
class ReconciledMessages:
    """The conversation for the model, and what this turn adds to its chat."""

    messages: list[Message]
    new_messages: list[Message]
    turn_refs: list[JsonObject]
    history_reset: bool
    history_len: int  # messages that came from the stored history


def reconcile_messages(request: Mapping[str, JsonValue], history: History) -> ReconciledMessages:
    """``history``: the chat's stored turns; reconciled with the request's messages
    by ``engine.context.history``, the result recorded as the turn's new messages
    so the next turn's history is right whichever way it is sent."""
    incoming = objects_of(request.get("messages"))
    # System messages are per request, never part of the stored history: left
    # out of the comparison, they go first.
    body = [m for m in incoming if m.get("role") != "system"]
    reconciled = reconcile(history, body, replace=request.get("history") == "client")
    if reconciled.history_len == 0 and reconciled.entries == body:
        messages = incoming  # nothing stored, nothing expanded: as sent, system messages in place
    else:
        messages = [*(m for m in incoming if m.get("role") == "system"), *reconciled.messages]
    new_messages, turn_refs = recorded_new(reconciled.new_entries)
    return ReconciledMessages(
        messages=messages,
        new_messages=new_messages,
        turn_refs=turn_refs,
        history_reset=reconciled.replaced,
        history_len=len(expand(reconciled.entries[: reconciled.history_len])),
    )


def assemble(request: Mapping[str, JsonValue], history: History, profile: ModelProfile) -> Assembled:
    """History, system prompt and the legacy code-interpreter prompt in one call
    (the first steps of ``engine.context.steps``, for callers that need no more)."""
    reconciled = reconcile_messages(request, history)
    given = mapping_of(request.get("params")).get("system")
    system = str(given) if given else profile.system  # as the live steps read it
    messages = with_system_prompt(reconciled.messages, system)
    if legacy_code_interpreter(request):
        # Legacy mode: the instructions go with the user's message.
        messages = _append_to_last_user(messages, CODE_INTERPRETER_PROMPT)
    return Assembled(
        messages=messages,
        params=upstream_params(request, profile),
        history_len=reconciled.history_len,
        new_messages=reconciled.new_messages,
        history_reset=reconciled.history_reset,
        turn_refs=reconciled.turn_refs,
    )


def chat_messages_of_turn(new_messages: list[Message], assistant: Message | None) -> list[Message]:
    """What one turn contributes to its chat's history."""
    out = list(new_messages)
    if assistant is not None:
        out.append(assistant)
    return out
