"""Tool calls: argument parsing, parameter filtering, execution, result normalization, citations.

Pure code with no I/O of its own: a tool is reached through a ``ToolHandle``
(a module method, a tool server, the browser), and ``execute_tool_call`` only
decides what the model asked for, what actually ran and what goes back to the
model. It follows Open WebUI's ``execute_tool_call`` / ``process_tool_result``
with two of its quirks fixed:

* A direct tool's genuine 2-item list is a list, never ``(data, headers)``;
  only an explicit Python tuple or the ``{"__turnlog_response__": …}`` envelope is
  (pinned by tests/test_tools.py::test_process_tool_result_vectors).
* The arguments replayed to the model are exactly the (filtered) arguments
  the tool ran with, always as a valid JSON object (Open WebUI replays the
  unfiltered ones; pinned by tests/test_tools.py::test_parameter_filtering_vectors).

A timeout is the engine's business (it wraps the call in ``asyncio.timeout``);
``timeout_result`` gives the result to record then.
"""

from __future__ import annotations

import ast
import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, SupportsIndex, SupportsInt, TypeGuard, TypeVar, runtime_checkable

from engine.json_types import JsonObject, JsonValue

ToolKind = Literal["server", "direct", "builtin", "client"]
ToolStatus = Literal["completed", "failed"]

#: The attribute that marks a tool function idempotent (safe to run again when a
#: turn is resumed after a crash between ``tool.started`` and ``tool.completed``).
#: It is the contract, so a tool module need not import turnlog to set it.
IDEMPOTENT_ATTR = "__turnlog_idempotent__"

#: The envelope a JSON-only tool (direct, client) can use to return ``(body, headers)``.
RESPONSE_ENVELOPE = "__turnlog_response__"

#: Tools whose results become citation sources: Open WebUI 0.12.4's
#: ``CITATION_TOOL_NAMES`` plus ``search_web`` as 0.8.12 had it.
CITATION_TOOL_NAMES = frozenset({"fetch_url", "view_file", "view_knowledge_file", "query_knowledge_files", "query_chat_files", "search_web"})

FETCH_SNIPPET_CHARS = 500

F = TypeVar("F", bound=Callable[..., object])


def idempotent(fn: F) -> F:
    """Mark a tool method idempotent (see ``IDEMPOTENT_ATTR``)."""
    setattr(fn, IDEMPOTENT_ATTR, True)
    return fn


turnlog_idempotent = idempotent


# --------------------------------------------------------------------------
# Specs, context, handles
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about a tool, and how turnlog runs it.

    ``kind``: ``server`` runs in this process (module tools, tool servers),
    ``direct`` in the user's browser, ``builtin`` is turnlog's own, ``client``
    is returned to the API client to execute.
    """

    name: str
    description: str
    parameters: JsonObject
    tool_id: str
    kind: ToolKind
    idempotent: bool = False
    timeout: float | None = None
    # False for MCP tools: the server validates its own arguments, so every key
    # the model wrote reaches it (as Open WebUI bypasses filtering for MCP).
    filter_parameters: bool = True

    def openai_tool(self) -> JsonObject:
        return {"type": "function", "function": self.function()}

    def function(self) -> JsonObject:
        """The ``function`` of ``openai_tool``: name, description, parameters."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


@dataclass
class ToolContext:
    """What a tool may be given besides its arguments (Open WebUI's ``__user__`` & co)."""

    user: JsonObject
    messages: list[JsonObject]
    files: list[JsonValue]
    metadata: JsonObject
    emit: Callable[[JsonObject], Awaitable[None]] | None
    call_id: str | None = None


class ToolHandle(Protocol):
    spec: ToolSpec

    async def __call__(self, args: JsonObject, ctx: ToolContext) -> object:
        """What the tool returned: anything a Python tool may return
        (``normalize_result`` makes it a result)."""
        ...


# --------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ArgumentError:
    """Arguments that cannot be used; ``message`` is what the model is told."""

    message: str
    reason: Literal["malformed", "not_object"]


def malformed_message(name: str) -> str:
    return f"Error: Tool call arguments could not be parsed. The model generated malformed or incomplete JSON for `{name}`. Please try again."


def not_object_message(name: str) -> str:
    return f"Error: Tool call arguments for `{name}` must be a JSON object. Please try again."


def not_found_message(name: str) -> str:
    return f'Error: Tool "{name}" not found.'


def parse_arguments(raw: object, name: str = "") -> JsonObject | ArgumentError:
    """The model's arguments (a text, or already an object) as a dict: JSON
    first, then Python literals.

    Models sometimes write ``{'a': 1, 'b': True}``; Open WebUI accepts that via
    ``ast.literal_eval`` and so do we. The value is round-tripped through JSON so
    that what the tool gets is exactly what ``json.dumps`` records (tuples become
    lists; sets, bytes or NaN count as malformed).
    """
    if raw is None:
        return {}
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            value: object = json.loads(raw)
        except (ValueError, RecursionError):
            try:
                value = ast.literal_eval(raw.strip())
            except Exception:  # SyntaxError, ValueError, RecursionError, MemoryError...
                return ArgumentError(malformed_message(name), "malformed")
    else:
        value = raw
    if not isinstance(value, dict):
        return ArgumentError(not_object_message(name), "not_object")
    try:
        copy: JsonObject = json.loads(json.dumps(value, allow_nan=False))
        return copy
    except (TypeError, ValueError, RecursionError):
        return ArgumentError(malformed_message(name), "malformed")


def filter_arguments(spec: ToolSpec, args: JsonObject) -> JsonObject:
    """Keep only the keys the spec declares; required keys are not checked.

    A missing required argument surfaces as the tool's own TypeError, which the
    model can act on (Open WebUI does the same). A spec with
    ``filter_parameters`` off (an MCP tool) keeps every key.
    """
    if not spec.filter_parameters:
        return dict(args)
    properties = spec.parameters.get("properties") if isinstance(spec.parameters, dict) else None
    if not isinstance(properties, dict):
        return {}
    return {key: value for key, value in args.items() if key in properties}


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------


@dataclass
class ToolResult:
    """A normalized tool result.

    ``text`` is what is re-injected for the model (``None`` renders as ``""``).
    ``files`` are for display (all of them, images included); ``images`` are the
    image data URIs among them, kept to give the model as ``input_image`` parts.
    ``embeds`` are HTML documents or URLs shown inline by the UI.
    """

    text: str | None
    files: list[JsonObject] = field(default_factory=list)
    embeds: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    status: ToolStatus = "completed"


@dataclass
class HtmlResult:
    """A tool's HTML answer: turnlog's equivalent of FastAPI's ``HTMLResponse``.

    With ``Content-Disposition: inline`` the body is embedded in the UI and the
    model only learns that it is shown; without it the body is the result text.
    """

    body: str | bytes
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Disposition": "inline"})

    @property
    def status_code(self) -> int:
        return self.status


class _HtmlLike(Protocol):
    """An HTML answer: ``HtmlResult``, or a web framework's response object."""

    @property
    def body(self) -> object: ...

    @property
    def status_code(self) -> object: ...

    @property
    def headers(self) -> object: ...


@runtime_checkable
class _Headers(Protocol):
    def items(self) -> Iterable[tuple[object, object]]: ...


def _is_html_like(value: object) -> TypeGuard[_HtmlLike]:
    return not isinstance(value, (str, bytes, dict, list, tuple)) and hasattr(value, "body") and hasattr(value, "status_code") and hasattr(value, "headers")


def _header(headers: object, name: str) -> str:
    """A header value, whatever the case of its name."""
    if not isinstance(headers, _Headers):
        return ""
    items = headers.items()
    wanted = name.lower()
    for key, value in items:
        if str(key).lower() == wanted:
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return ""


def _decode(body: object) -> str:
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body).decode("utf-8", "replace")
    return str(body)


def _ui_message(tool_name: str, status_code: int) -> dict[str, str]:
    if 200 <= status_code < 300:
        return {
            "status": "success",
            "code": "ui_component",
            "message": f"{tool_name}: Embedded UI result is active and visible to the user.",
        }
    if 400 <= status_code < 500:
        message = f"{tool_name}: Client error {status_code} from embedded UI result."
    elif 500 <= status_code < 600:
        message = f"{tool_name}: Server error {status_code} from embedded UI result."
    else:
        message = f"{tool_name}: Unexpected status code {status_code} from embedded UI result."
    return {"status": "error", "code": "ui_component", "message": message}


def _from_html(response: _HtmlLike, tool_name: str, context: object, embeds: list[str]) -> object:
    if "inline" not in _header(response.headers, "Content-Disposition"):
        return _decode(response.body)
    embeds.append(_decode(response.body))
    status_code = _int_or_zero(response.status_code)
    if 200 <= status_code < 300 and context is not None:
        return context
    return _ui_message(tool_name, status_code)


def _int_or_zero(value: object) -> int:
    """``int(value)``, or 0 where that fails."""
    if not isinstance(value, (str, bytes, bytearray, SupportsInt, SupportsIndex)):
        return 0
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _from_data_headers(data: object, headers: object, tool_name: str, embeds: list[str]) -> object:
    if "inline" not in _header(headers, "Content-Disposition"):
        return data
    if "text/html" in _header(headers, "Content-Type"):
        context: object = None
        if isinstance(data, tuple) and len(data) == 2:
            data, context = data
        embeds.append(_decode(data))
        return context if context is not None else _ui_message(tool_name, 200)
    location = _header(headers, "Location")
    if location:
        embeds.append(location)
        return _ui_message(tool_name, 200)
    return data


def _envelope(value: object) -> tuple[object, object] | None:
    """``(body, headers)`` from an explicit tuple or the JSON envelope, else None: a
    genuine 2-item list is not ``(body, headers)``."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], Mapping):
        return value[0], value[1]
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get(RESPONSE_ENVELOPE), dict):
        inner = value[RESPONSE_ENVELOPE]
        headers = inner.get("headers")
        return inner.get("body"), headers if isinstance(headers, Mapping) else {}
    return None


_MCP_PART_FIELDS = {"text": "text", "image": "data", "audio": "data", "resource": "resource"}


def _is_mcp_content(value: object) -> TypeGuard[list[JsonObject]]:
    """An MCP ``CallToolResult.content`` array: typed parts, each with its payload field."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(part, dict) and part.get("type") in _MCP_PART_FIELDS and _MCP_PART_FIELDS[part["type"]] in part for part in value)
    )


def _json_or_text(text: JsonValue) -> JsonValue:
    if isinstance(text, str):
        try:
            parsed: JsonValue = json.loads(text)
            return parsed
        except ValueError:
            return text
    return text


def _from_mcp(parts: list[JsonObject], files: list[JsonObject]) -> JsonValue:
    response: list[JsonValue] = []
    for part in parts:
        kind = part["type"]
        if kind == "text":
            response.append(_json_or_text(part.get("text", "")))
        elif kind in ("image", "audio"):
            # Open WebUI uploads these to its file store; turnlog keeps the data URL.
            url = f"data:{part.get('mimeType')};base64,{part.get('data', part.get('blob', ''))}"
            files.append({"type": kind, "url": url})
        else:
            resource = part.get("resource")
            if not isinstance(resource, dict):
                continue
            uri = resource.get("uri", "")
            mime = str(resource.get("mimeType") or "")
            if "text" in resource:
                response.append(_json_or_text(resource.get("text")))
            elif "blob" in resource:
                if mime.startswith("image/"):
                    files.append({"type": "image", "url": f"data:{mime};base64,{resource['blob']}"})
                else:
                    response.append(f"[Resource: {uri}] (binary data, mimeType: {mime})")
            else:
                response.append(uri)
    return response[0] if len(response) == 1 else response


def _extract_images(value: object, files: list[JsonObject]) -> object:
    """Replace image data URIs nested anywhere by ``"[image]"``, collecting them as files."""
    if isinstance(value, str):
        if value.startswith("data:image/"):
            files.append({"type": "image", "url": value})
            return "[image]"
        return value
    if isinstance(value, dict):
        return {key: _extract_images(item, files) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_extract_images(item, files) for item in value]
    return value


def normalize_result(value: object, tool_name: str, *, direct: bool = False) -> ToolResult:
    """What a tool returned → the text for the model, files, embeds, images, status.

    ``direct`` is accepted for parity with Open WebUI but changes nothing: a
    browser tool's 2-item list is a list. ``(body, headers)`` comes only
    from a Python tuple whose second item is a mapping, or from the
    ``{"__turnlog_response__": {"body", "headers"}}`` envelope.
    """
    del direct
    embeds: list[str] = []
    files: list[JsonObject] = []
    value = _unwrap_response(value, tool_name, embeds)
    if isinstance(value, (bytes, bytearray)):
        value = _decode(value)
    value = _split_files(value, tool_name, files)
    text = _result_text(value)
    images = [url for f in files if f.get("type") == "image" and isinstance(url := f.get("url"), str) and url.startswith("data:")]
    status: ToolStatus = "failed" if is_error_result(text) else "completed"
    return ToolResult(text=text, files=files, embeds=embeds, images=images, status=status)


def _unwrap_response(value: object, tool_name: str, embeds: list[str]) -> object:
    """An HTML answer (alone, with headers, or in the response envelope) → its
    embeds taken out and the rest of the value."""
    if isinstance(value, tuple) and len(value) == 2 and _is_html_like(value[0]):
        return _from_html(value[0], tool_name, value[1], embeds)
    if _is_html_like(value):
        return _from_html(value, tool_name, None, embeds)
    if (pair := _envelope(value)) is not None:
        value = _from_data_headers(pair[0], pair[1], tool_name, embeds)
        if _is_html_like(value):
            value = _from_html(value, tool_name, None, embeds)
    return value


def _split_files(value: object, tool_name: str, files: list[JsonObject]) -> object:
    """Images and data URIs move to ``files``; what is left goes to the model."""
    if isinstance(value, str) and value.startswith("data:image/"):
        files.append({"type": "image", "url": value})
        value = f"{tool_name}: Image file read successfully."
    elif _is_mcp_content(value):
        value = _from_mcp(value, files)
    elif isinstance(value, (list, tuple)):
        kept: list[object] = []
        for item in value:
            if isinstance(item, str) and item.startswith("data:") and not item.startswith("data:image/"):
                files.append({"type": "data", "content": item})
            else:
                kept.append(item)
        value = kept
    if isinstance(value, (dict, list, tuple)):
        value = _extract_images(value, files)
    return value


def _result_text(value: object) -> str | None:
    """The text the model sees: strings as they are, lists and objects as JSON."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        value = {"results": value}
    if isinstance(value, dict):
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return str(value)


def error_result(text: str) -> ToolResult:
    return ToolResult(text=text, status="failed")


def timeout_result(name: str, seconds: float) -> ToolResult:
    """The result recorded when the engine's deadline for a tool call passed."""
    return error_result(f'Error: Tool "{name}" did not finish within {seconds:g} seconds and was cancelled.')


_ERROR_PREFIXES = ("error:", "exception:", "traceback", "http error!")


def is_error_result(text: str | None) -> bool:
    """Does a result text say the call failed? (decides the item's ``failed`` status)"""
    if not text:
        return False
    if text.strip().lower().startswith(_ERROR_PREFIXES):
        return True
    value: object = text
    for _ in range(8):  # results are sometimes JSON encoded more than once
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value)
        except ValueError:
            return False
    if not isinstance(value, dict):
        return False
    error = value.get("error")
    if isinstance(error, (str, dict, list)) and error:
        return True
    status = value.get("status")
    if isinstance(status, str) and status.lower() in ("error", "failed"):
        return True
    message = value.get("message")
    has_message = bool(message.strip()) if isinstance(message, str) else bool(message)
    return (value.get("success") is False or value.get("ok") is False) and has_message


# --------------------------------------------------------------------------
# Citations
# --------------------------------------------------------------------------


def citation_sources(
    tool_name: str,
    tool_id: str | None,
    result_text: str | None,
    *,
    params: Mapping[str, object] | None = None,
    fallback: bool = False,
) -> list[JsonObject]:
    """Citation sources for a tool result (``source`` events and ``<source>`` markers).

    Only the ``CITATION_TOOL_NAMES`` tools cite; ``fetch_url`` needs its ``url``
    argument from ``params``. With ``fallback`` any other tool gets Open
    WebUI's generic source (the whole result as one document).
    """
    if not result_text:
        return []
    if tool_name not in CITATION_TOOL_NAMES:
        return _generic_source(tool_name, tool_id, result_text) if fallback else []
    params = params or {}
    try:
        parsed = _json_or_text(result_text)
        if isinstance(parsed, dict) and "error" in parsed:
            return []
        if tool_name == "fetch_url":
            url = str(params.get("url", ""))
            snippet = result_text[:FETCH_SNIPPET_CHARS] + ("..." if len(result_text) > FETCH_SNIPPET_CHARS else "")
            return [
                {
                    "source": {"name": url, "id": url},
                    "document": [snippet],
                    "metadata": [{"source": url, "name": url, "url": url}],
                }
            ]
        if tool_name in ("view_file", "view_knowledge_file"):
            return _file_source(parsed) if isinstance(parsed, dict) else []
        if tool_name in ("query_knowledge_files", "query_chat_files"):
            return _chunk_sources(parsed) if isinstance(parsed, list) else []
        return _search_web_sources(parsed) if isinstance(parsed, list) else []
    except Exception:
        return [
            {
                "source": {"name": tool_name, "type": "tool"},
                "document": [str(result_text)],
                "metadata": [{"source": tool_name}],
            }
        ]


def _generic_source(tool_name: str, tool_id: str | None, result_text: str) -> list[JsonObject]:
    parsed = _json_or_text(result_text)
    if isinstance(parsed, dict) and "error" in parsed:
        return []
    return [
        {
            "source": {"name": tool_name, "type": "tool", "id": tool_id or tool_name},
            "document": [str(parsed)],
            "metadata": [{"source": tool_name, "name": tool_name}],
        }
    ]


def _file_source(data: JsonObject) -> list[JsonObject]:
    filename = data.get("filename", "Unknown File")
    file_id = data.get("id", "")
    knowledge_name = data.get("knowledge_name", "")
    metadata: JsonObject = {"file_id": file_id, "name": filename, "source": filename}
    if knowledge_name:
        metadata["knowledge_name"] = knowledge_name
    return [
        {
            "source": {"id": file_id, "name": filename, "type": "file"},
            "document": [data.get("content", "")],
            "metadata": [metadata],
        }
    ]


def _object(value: JsonValue) -> JsonObject:
    """A result entry that must be an object (another shape fails the citation,
    which then cites the whole result)."""
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value


def _chunk_sources(chunks: list[JsonValue]) -> list[JsonObject]:
    # Keyed by a file id, a note id or a name: whatever JSON the tool gave.
    groups: dict[object, tuple[JsonObject, list[JsonValue], list[JsonValue], list[JsonValue]]] = {}
    for entry in chunks:
        chunk = _object(entry)
        source_name = chunk.get("source", "Unknown")
        file_id = chunk.get("file_id", "")
        note_id = chunk.get("note_id", "")
        key = file_id or note_id or source_name
        group = groups.get(key)
        if group is None:
            group = groups[key] = ({"id": file_id or note_id, "name": source_name, "type": chunk.get("type", "file")}, [], [], [])
        _, documents, metadatas, distances = group
        documents.append(chunk.get("content", ""))
        metadata: JsonObject = {"file_id": file_id, "name": source_name, "source": source_name}
        if note_id:
            metadata["note_id"] = note_id
        metadatas.append(metadata)
        if chunk.get("distance") is not None:
            distances.append(chunk["distance"])
    return [
        {"source": source, "document": documents, "metadata": metadatas, "distances": distances} for source, documents, metadatas, distances in groups.values()
    ]


def _search_web_sources(hits: list[JsonValue]) -> list[JsonObject]:
    documents: list[JsonValue] = []
    metadata: list[JsonValue] = []
    for entry in hits:
        hit = _object(entry)
        title, link = hit.get("title", ""), hit.get("link", "")
        documents.append(f"{title}\n{hit.get('snippet', '')}")
        metadata.append({"source": link, "name": title, "url": link})
    return [{"source": {"name": "search_web", "id": "search_web"}, "document": documents, "metadata": metadata}]


# --------------------------------------------------------------------------
# Execution
# --------------------------------------------------------------------------


@dataclass
class Execution:
    """One tool call, as it ran.

    ``arguments`` are the filtered arguments the tool ran with (for an unknown
    tool, the parsed ones; ``None`` when they could not be parsed), and
    ``arguments_json`` their ``json.dumps``: what the output item and the
    history replay show (what ran), always a JSON object. ``error`` is set when the
    call failed before or inside the tool (bad arguments, unknown tool, an
    exception); a tool that *returns* an error only has ``result.status`` failed.
    """

    arguments: JsonObject | None
    arguments_json: str
    result: ToolResult
    error: str | None = None


async def execute_tool_call(
    name: str,
    raw_arguments: JsonValue,
    tools: Mapping[str, ToolHandle],
    ctx: ToolContext,
) -> Execution:
    """Parse, look up, filter, call, normalize (Open WebUI's order).

    Only ``Exception`` is caught: cancellation (and the engine's timeout) passes
    through.
    """
    parsed = parse_arguments(raw_arguments, name)
    if isinstance(parsed, ArgumentError):
        return Execution(None, "{}", error_result(parsed.message), parsed.message)

    handle = tools.get(name)
    if handle is None:
        message = not_found_message(name)
        return Execution(parsed, json.dumps(parsed), error_result(message), message)

    args = filter_arguments(handle.spec, parsed)
    arguments_json = json.dumps(args)
    try:
        value = await handle(dict(args), ctx)
        result = normalize_result(value, name, direct=handle.spec.kind == "direct")
    except Exception as exc:  # from the tool, or a result whose str() fails
        error = str(exc) or type(exc).__name__
        text = json.dumps({"error": error}, indent=2, ensure_ascii=False)
        return Execution(args, arguments_json, error_result(text), error)
    return Execution(args, arguments_json, result)


class LiveToolRunner:
    """``engine.ports.ToolRunner`` that runs the tool here, within its timeout."""

    async def run(self, name: str, args: JsonObject, handle: ToolHandle, ctx: ToolContext, timeout: float) -> tuple[ToolResult, str | None]:
        try:
            async with asyncio.timeout(timeout):
                execution = await execute_tool_call(name, args, {name: handle}, ctx)
        except TimeoutError:
            result = timeout_result(name, timeout)
            return result, result.text
        return execution.result, execution.error
