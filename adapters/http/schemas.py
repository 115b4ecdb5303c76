"""Request validation: what a client may send, checked before anything is recorded."""

from __future__ import annotations

import json
import re
from typing import Any, Literal, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from adapters.http.errors import ApiError, validation_message
from engine.context.assemble import FUNCTION_CALLING

ID_PATTERN = r"^[A-Za-z0-9_.:\-]{1,128}$"
#: Text stored in a column of its own (names, memories, ids): no NUL character,
#: which PostgreSQL's text type cannot hold (a 400, not a 500, on every backend).
NO_NUL = r"^[^\x00]*$"
_LONG_NUMBER = re.compile(rb"\d{20}")
#: Deepest nesting of objects and arrays a request may have: deeper bodies
#: would fail later, where they are validated, recorded or encoded.
MAX_JSON_DEPTH = 64


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(BaseModel):
    """An OpenAI Chat Completions body plus turnlog's extensions (docs/reference/chat-completions.md)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    chat_id: str | None = Field(default=None, pattern=ID_PATTERN)
    features: dict[str, bool] | None = None
    files: list[dict[str, Any]] | None = None
    tool_ids: list[str] | None = None
    params: dict[str, Any] | None = None
    direct_tools: list[dict[str, Any]] | None = None
    background_tasks: dict[str, bool] | None = None
    # "client": the messages are the whole history (an edited conversation);
    # "server" or absent: reconciled with the chat's stored history (docs/history.md).
    history: Literal["client", "server"] | None = None
    tools: list[dict[str, Any]] | None = None

    @field_validator("messages")
    @classmethod
    def _messages_content(cls, value: list[Message]) -> list[Message]:
        for i, message in enumerate(value):
            if message.role in ("user", "system", "developer") and message.content is None:
                raise ValueError(f"messages[{i}] ({message.role}) needs content")
        return value

    @field_validator("params")
    @classmethod
    def _tool_approval(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        mode = (value or {}).get("tool_approval")
        if mode is not None and mode not in ("ask", "auto"):
            raise ValueError('params.tool_approval must be "ask" or "auto"')
        calling = (value or {}).get("function_calling")
        if calling is not None and calling not in FUNCTION_CALLING:
            # A misspelt mode would otherwise silently fall back to native.
            raise ValueError('params.function_calling must be "native", "default" or "legacy" (the same as "default": prompt-based)')
        return value

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def recorded(self) -> dict[str, Any]:
        """The body as recorded in ``turn.started``: exactly what the client sent
        (a request body carries no credentials; headers are never recorded)."""
        return self.model_dump(mode="json", exclude_unset=True)


async def read_json(request: web.Request) -> Any:
    """The JSON body, or a 400/413/415 that says what is wrong with it."""
    raw = await request.read()  # raises 413 past client_max_size
    if not raw:
        raise ApiError(400, "request body is empty; expected a JSON object", code="empty_body")
    return parse_json(raw)


def parse_json(raw: bytes | str) -> Any:
    """Strict JSON (orjson): a lone surrogate (``"\\ud800"``), ``NaN`` or
    ``Infinity`` is malformed, a 400, where the stdlib would accept what no
    store can encode or the hash chain write back as sent."""
    try:
        value = orjson.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"malformed JSON: {exc}", code="invalid_json") from exc
    # Fewer brackets than the limit cannot nest past it: most bodies skip the walk.
    brackets = raw.count(b"[") + raw.count(b"{") if isinstance(raw, bytes) else raw.count("[") + raw.count("{")
    if brackets > MAX_JSON_DEPTH and too_deep(value, MAX_JSON_DEPTH):
        raise ApiError(400, f"JSON nested deeper than {MAX_JSON_DEPTH} levels (objects and arrays)", code="json_too_deep")
    if _LONG_NUMBER.search(raw if isinstance(raw, bytes) else raw.encode()):
        value = json.loads(raw)  # orjson reads integers beyond 64 bits as floats: keep them exact
    return value


def too_deep(value: Any, limit: int) -> bool:
    """Whether objects and arrays nest more than ``limit`` levels (a scalar
    is 0 levels, ``{}`` 1). Level by level: no recursion limit to hit."""
    level = [value] if isinstance(value, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node) if isinstance(child, (dict, list))]
    return False


Body = TypeVar("Body", bound=BaseModel)


def validate_body(model: type[Body], body: Any) -> Body:
    """A parsed JSON body validated as ``model``, or a 400 naming the field."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_type")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise ApiError(400, message, code="invalid_value", param=param) from exc


async def read_body(request: web.Request, model: type[Body]) -> Body:
    """The JSON object body validated as ``model``, or a 400 naming the field."""
    return validate_body(model, await read_json(request))


def parse_chat_request(body: Any) -> ChatRequest:
    return validate_body(ChatRequest, body)
